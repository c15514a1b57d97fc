"""Finding a mesh's daemon the way the CLI does."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemesh.client import Client, DaemonNotRunning
from tidemesh.client.endpoint import Endpoint
from tidemesh.core.ownership import NotPrivate


def test_for_mesh_uses_tidemesh_home_then_xdg() -> None:
    home = Endpoint.for_mesh("team", environ={"TIDEMESH_HOME": "/srv/tm"})
    assert home.socket_path == Path("/srv/tm/daemon/team/sock") and home.port is None
    xdg = Endpoint.for_mesh("team", environ={"XDG_RUNTIME_DIR": "/run/user/7", "HOME": "/h"})
    assert xdg.socket_path == Path("/run/user/7/tidemesh/daemon/team/sock")


def test_for_mesh_over_tcp_reads_the_published_port(tmp_path: Path) -> None:
    folder = tmp_path / "daemon" / "team"
    folder.mkdir(parents=True)
    (folder / "http.port").write_text("4711\n")
    (folder / "local_token").write_text("secret\n")
    (folder / "local_token").chmod(0o600)
    e = Endpoint.for_mesh("team", tcp=True, environ={"TIDEMESH_HOME": str(tmp_path)})
    assert (e.port, e.socket_path) == (4711, None)
    assert e.headers() == {"Authorization": "Bearer secret"}


def test_a_token_others_may_read_or_a_folder_others_may_write_is_refused(
        tmp_path: Path) -> None:
    folder = tmp_path / "daemon" / "team"
    folder.mkdir(parents=True)
    (folder / "http.port").write_text("4711\n")
    token = folder / "local_token"
    token.write_text("secret\n")
    token.chmod(0o644)
    e = Endpoint.for_mesh("team", tcp=True, environ={"TIDEMESH_HOME": str(tmp_path)})
    with pytest.raises(NotPrivate, match="readable or writable by others"):
        e.headers()
    token.chmod(0o600)
    (tmp_path / "daemon").chmod(0o777)
    with pytest.raises(NotPrivate, match="writable by group or others"):
        Endpoint.for_mesh("team", tcp=True, environ={"TIDEMESH_HOME": str(tmp_path)})


def test_no_published_port_is_daemon_not_running_with_the_start_command(tmp_path: Path) -> None:
    with pytest.raises(DaemonNotRunning) as caught:
        Client.for_mesh("team", tcp=True, environ={"TIDEMESH_HOME": str(tmp_path)})
    assert caught.value.hint == "tidemesh daemon up --mesh team"
    assert "tidemesh daemon up --mesh team" in str(caught.value)


def test_an_endpoint_is_a_socket_or_a_port_with_a_token() -> None:
    with pytest.raises(ValueError, match="either"):
        Endpoint(Path("/s"), 1, Path("/t"))
    with pytest.raises(ValueError, match="token_file"):
        Endpoint(port=1)


def test_the_start_hint_is_said_once() -> None:
    err = DaemonNotRunning("no daemon answers on /s", hint="tidemesh daemon up --mesh m")
    assert str(err) == "no daemon answers on /s; start it with `tidemesh daemon up --mesh m`"
    assert err.reason == "no daemon answers on /s"


async def test_a_tcp_client_follows_a_restarted_daemon_to_its_new_port(short_tmp: Path) -> None:
    """A daemon picks a new loopback port at each start (ipc.http_port = 0); a client found by
    mesh name kept the first one and failed with DaemonNotRunning for ever after."""
    from tests.daemon.harness import start_daemon
    from tidemesh.client import AsyncClient

    env = {"TIDEMESH_HOME": str(short_tmp)}
    d = start_daemon(short_tmp, "t")
    try:
        sync_client = Client.for_mesh("t", tcp=True, environ=env)
        async_client = AsyncClient.for_mesh("t", tcp=True, environ=env)
        first = sync_client.health()["pid"]
        assert (await async_client.health())["pid"] == first
        assert d.stop() == 0
        d = start_daemon(short_tmp, "t")
        assert sync_client.health()["pid"] == d.proc.pid != first
        assert (await async_client.health())["pid"] == d.proc.pid
        await async_client.aclose()
    finally:
        d.stop()
