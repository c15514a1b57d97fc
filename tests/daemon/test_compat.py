"""``GET /v1/compat`` (spec §15.4; issue 32 item 2) on a real daemon, and what the CLI and the
SDK do with a daemon they do not fit: a future daemon (another IPC API major) and one that
works only with newer clients are the real daemon with its ranges changed (rigged_daemon)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import aiohttp
import jsonschema
import pytest

import tidemesh
from tests.daemon.harness import RunningDaemon, run_cli, start_daemon
from tidemesh.client import AsyncClient, Client, IncompatibleDaemon
from tidemesh.core.errors import NotFound
from tidemesh.daemon.api.validation import load_schema

RIG = (sys.executable, str(Path(__file__).with_name("rigged_daemon.py")))


async def test_compat_on_both_transports_and_the_sdk_fits(daemon: RunningDaemon) -> None:
    schema = load_schema("compat_response.schema.json")
    async with daemon.session() as s, s.get("/v1/compat") as r:
        assert r.status == 200
        unix = await r.json()
    async with aiohttp.ClientSession() as s, s.get(
            f"http://127.0.0.1:{daemon.port}/v1/compat",
            headers={"Authorization": f"Bearer {daemon.token}"}) as r:
        assert r.status == 200
        tcp = await r.json()
    assert unix == tcp
    jsonschema.validate(unix, schema)
    assert unix["daemon"] == tidemesh.__version__ and unix["ipc_api"] == "v1"
    assert "compat" in daemon.client.version()["ipc_features"]
    assert daemon.client.check_compatible() == unix
    async with AsyncClient(daemon.paths.socket) as client:
        assert await client.check_compatible() == unix


def _send(d: RunningDaemon) -> tuple[int, str]:
    out = run_cli(d.home, "send", "--mesh", d.mesh, "--to", "topic:ops", "hello")
    return out.returncode, out.stderr


def test_a_daemon_of_another_ipc_api_is_refused_by_the_sdk_and_the_cli(
        short_tmp: Path) -> None:
    d = start_daemon(short_tmp, "t", {"TM_TEST_RIG": "ipc_v2"}, launcher=RIG)
    try:
        with pytest.raises(IncompatibleDaemon) as info:
            Client(d.paths.socket).check_compatible()
        assert info.value.details["kind"] == "ipc_api"
        assert "speaks IPC API v2" in info.value.message and "v1" in info.value.message
        # Not joined: no cold path to fall back to, so the CLI says why at once.
        code, err = _send(d)
        assert code == 10 and "incompatible_daemon" in err and "IPC API v2" in err, err
        # Joined (its mesh file present): the CLI tries the cold path, which the running
        # daemon's lock refuses; nothing is sent either way.
        d.paths.mesh_file.write_text(json.dumps({"name": "t"}))
        code, err = _send(d)
        assert code == 10 and "trying the cold path" in err and "holds the lock" in err, err
        assert d.outbox_rows() == []
    finally:
        assert d.stop() == 0, d.log.read_text()[-2000:]


def test_a_daemon_for_newer_clients_is_refused_with_both_versions(short_tmp: Path) -> None:
    d = start_daemon(short_tmp, "t", {"TM_TEST_RIG": "new_clis"}, launcher=RIG)
    try:
        with pytest.raises(IncompatibleDaemon) as info:
            Client(d.paths.socket).check_compatible()
        assert info.value.details["kind"] == "version"
        assert "9.x" in info.value.message and tidemesh.__version__ in info.value.message
        code, err = _send(d)
        assert code == 10 and ">=9.0.0,<10.0.0" in err and "trying" not in err, err
        assert d.outbox_rows() == []
    finally:
        assert d.stop() == 0, d.log.read_text()[-2000:]


def test_a_daemon_older_than_the_compat_route_is_judged_by_its_version(
        short_tmp: Path) -> None:
    d = start_daemon(short_tmp, "t", {"TM_TEST_RIG": "pre_compat_v2"}, launcher=RIG)
    try:
        client = Client(d.paths.socket)
        assert client.version()["ipc_api"] == "v2"
        with pytest.raises(NotFound):
            client.compat()
        with pytest.raises(IncompatibleDaemon) as info:
            client.check_compatible()
        assert info.value.details["kind"] == "ipc_api"
        assert "speaks IPC API v2" in info.value.message
    finally:
        assert d.stop() == 0, d.log.read_text()[-2000:]
