"""The broker's /console over a real broker process and real daemons: off by default, its
own token, loopback Host only, no foreign Origin, and a page that shows who is connected."""

from __future__ import annotations

import http.client
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon.harness import daemon_env
from tests.e2e.harness import Mesh, sqlite_broker_with_team, two_on_topic


def _get(port: int, path: str, **headers: str) -> tuple[int, dict[str, str], str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers={"Host": f"127.0.0.1:{port}", **headers})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read().decode()
    finally:
        conn.close()


def _token(home: Path) -> str:
    out = subprocess.run([sys.executable, "-m", "tidemesh", "broker", "console-token"],
                         env=daemon_env(home, {}), capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.fixture
def console_mesh(short_tmp: Path) -> Iterator[Mesh]:
    broker = sqlite_broker_with_team(short_tmp)
    broker.env["TIDEMESH_CONSOLE_ENABLED"] = "true"
    broker.start()
    mesh = Mesh(broker, "team")
    try:
        yield mesh
    finally:
        for d in mesh.daemons.values():
            d.stop()
        broker.stop()


async def test_console_shows_connected_members(console_mesh: Mesh, short_tmp: Path) -> None:
    await two_on_topic(console_mesh, short_tmp)
    broker = console_mesh.broker
    token = _token(broker.home)
    token_file = broker.home / "broker" / "console-token"
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600

    status, headers, page = _get(broker.port, "/console", Authorization=f"Bearer {token}")
    assert status == 200, page
    assert headers["Content-Type"].startswith("text/html")
    assert '<b id="connected">2</b>' in page
    assert "<h2>Members</h2>" in page and "team" in page
    assert "<script" not in page and "http://" not in page and "https://" not in page

    # The login link trades the token for a cookie, and the cookie opens the page.
    status, headers, _ = _get(broker.port, f"/console?token={token}")
    assert status == 303 and headers["Location"] == "/console"
    cookie = headers["Set-Cookie"].split(";")[0]
    assert "HttpOnly" in headers["Set-Cookie"]
    status, _, page = _get(broker.port, "/console", Cookie=cookie)
    assert status == 200 and '<b id="connected">2</b>' in page


async def test_console_refuses_wrong_token_host_and_origin(console_mesh: Mesh) -> None:
    port = console_mesh.broker.port
    token = _token(console_mesh.broker.home)
    status, headers, body = _get(port, "/console")
    assert status == 401 and '"unauthorized"' in body
    assert headers["Content-Type"] == "application/json"
    assert _get(port, "/console", Authorization="Bearer nope")[0] == 401
    ok = {"Authorization": f"Bearer {token}"}
    assert _get(port, "/console", **ok, Host="evil.example:80")[0] == 403
    assert _get(port, "/console", **ok, Origin="http://evil.example")[0] == 403
    assert _get(port, "/console", **ok, Origin=f"http://127.0.0.1:{port}")[0] == 200


def test_console_is_off_by_default(short_tmp: Path) -> None:
    broker = sqlite_broker_with_team(short_tmp)
    broker.start()
    try:
        assert _get(broker.port, "/console")[0] != 200
        assert _get(broker.port, "/healthz")[0] == 200
    finally:
        broker.stop()
