"""Who may talk to the daemon (DESIGN §3): socket mode, bearer token, Host, Origin."""

from __future__ import annotations

import json
import os
import stat
from importlib import resources

import aiohttp

from tests.daemon.harness import RunningDaemon

BODY = {"to": "topic:ops", "body": "x"}


def test_socket_and_token_files_are_private(daemon: RunningDaemon) -> None:
    st = os.stat(daemon.paths.socket)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_uid == os.getuid()
    assert stat.S_IMODE(os.stat(daemon.paths.token_file).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(daemon.paths.runtime_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(daemon.paths.keypair).st_mode) == 0o600


async def _tcp(d: RunningDaemon, method: str, path: str, headers: dict[str, str],
               json: object = None) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as s, s.request(
        method, f"http://127.0.0.1:{d.port}{path}", headers=headers, json=json
    ) as r:
        return r.status, await r.json()


async def test_tcp_without_token_is_401(daemon: RunningDaemon) -> None:
    status, body = await _tcp(daemon, "POST", "/v1/send", {}, BODY)
    assert status == 401 and body["error"]["code"] == "unauthorized"  # type: ignore[index]
    assert daemon.outbox_rows() == []


async def test_tcp_with_wrong_token_is_401(daemon: RunningDaemon) -> None:
    status, _ = await _tcp(daemon, "GET", "/v1/health", {"Authorization": "Bearer nope"})
    assert status == 401


async def test_tcp_with_token_works(daemon: RunningDaemon) -> None:
    auth = {"Authorization": f"Bearer {daemon.token}"}
    status, body = await _tcp(daemon, "POST", "/v1/send", auth, BODY)
    assert status == 202 and body["status"] == "queued"


async def test_token_in_query_is_400_on_both_transports(daemon: RunningDaemon) -> None:
    status, body = await _tcp(daemon, "GET", f"/v1/health?token={daemon.token}",
                              {"Authorization": f"Bearer {daemon.token}"})
    assert status == 400 and body["error"]["code"] == "token_in_query"  # type: ignore[index]
    async with daemon.session() as s, s.get(f"/v1/health?token={daemon.token}") as r:
        assert r.status == 400


async def test_foreign_host_is_403_even_with_the_token(daemon: RunningDaemon) -> None:
    auth = {"Authorization": f"Bearer {daemon.token}"}
    for host in ("evil.example", "localhost.evil.example", "10.0.0.1"):
        status, _ = await _tcp(daemon, "GET", "/v1/health", {**auth, "Host": host})
        assert status == 403, host
    for host in ("localhost", f"127.0.0.1:{daemon.port}", "[::1]"):
        status, _ = await _tcp(daemon, "GET", "/v1/health", {**auth, "Host": host})
        assert status == 200, host


async def test_any_origin_is_403(daemon: RunningDaemon) -> None:
    auth = {"Authorization": f"Bearer {daemon.token}"}
    for origin in ("http://localhost", "null", "https://example.com"):
        status, _ = await _tcp(daemon, "POST", "/v1/send", {**auth, "Origin": origin}, BODY)
        assert status == 403
    assert daemon.outbox_rows() == []


async def test_unix_socket_needs_no_token(daemon: RunningDaemon) -> None:
    async with daemon.session() as s, s.post("/v1/send", json=BODY) as r:
        assert r.status == 202


async def test_openapi_document_is_served_like_every_route(daemon: RunningDaemon) -> None:
    committed = json.loads((resources.files("tidemesh.schemas") / "openapi.json")
                           .read_text("utf-8"))
    async with daemon.session() as s, s.get("/v1/openapi.json") as r:
        assert r.status == 200 and r.content_type == "application/json"
        assert await r.json() == committed
    status, _ = await _tcp(daemon, "GET", "/v1/openapi.json", {})
    assert status == 401
    status, body = await _tcp(daemon, "GET", "/v1/openapi.json",
                              {"Authorization": f"Bearer {daemon.token}"})
    assert status == 200 and body == committed
