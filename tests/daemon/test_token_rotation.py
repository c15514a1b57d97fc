"""`daemon rotate-token` on a real daemon: a new token in the file, the old one honoured for
ipc.token_grace_s and refused after it, the rotation counted, and the SDK's TCP client
reading the file again when its token stops working."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.daemon.harness import RunningDaemon, run_cli, start_daemon
from tidemesh.client import AsyncClient, Client
from tidemesh.core.errors import Unauthorized


def _daemon(home: Path, grace_s: float) -> Iterator[RunningDaemon]:
    d = start_daemon(home, extra_env={"TIDEMESH_IPC_TOKEN_GRACE_S": str(grace_s)})
    try:
        yield d
    finally:
        assert d.stop() == 0, d.log.read_text()[-2000:]


@pytest.fixture
def lenient(short_tmp: Path) -> Iterator[RunningDaemon]:
    """The grace is far longer than any test: the old token stays good throughout."""
    yield from _daemon(short_tmp, 3600.0)


@pytest.fixture
def strict(short_tmp: Path) -> Iterator[RunningDaemon]:
    """No grace: the old token is refused from the rotation on."""
    yield from _daemon(short_tmp, 0.0)


async def _status(d: RunningDaemon, token: str) -> int:
    async with aiohttp.ClientSession() as s, s.get(
            f"http://127.0.0.1:{d.port}/v1/health",
            headers={"Authorization": f"Bearer {token}"}) as r:
        return r.status


def _rotations(d: RunningDaemon) -> float:
    for line in d.client.metrics().splitlines():
        if line.startswith("cm_daemon_local_token_rotations_total "):
            return float(line.split()[1])
    raise AssertionError("no cm_daemon_local_token_rotations_total")


async def test_the_old_token_works_during_the_grace_and_the_new_one_at_once(
        lenient: RunningDaemon) -> None:
    old = lenient.token
    answer = lenient.client.rotate_token()             # over the Unix socket, via the SDK
    assert answer["rotated"] is True and answer["previous_valid_s"] > 3000
    assert "token" not in answer
    new = lenient.token
    assert new != old and len(new) >= 43
    assert stat.S_IMODE(os.stat(lenient.paths.token_file).st_mode) == 0o600
    assert await _status(lenient, new) == 200
    assert await _status(lenient, old) == 200
    assert _rotations(lenient) == 1
    # The CLI rotates a running daemon over IPC; the first token is now two rotations back
    # and no longer accepted (only the one before the current is).
    res = run_cli(lenient.home, "daemon", "rotate-token", "--mesh", "t", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["daemon_running"] is True
    assert await _status(lenient, lenient.token) == 200
    assert await _status(lenient, new) == 200
    assert await _status(lenient, old) == 401
    assert _rotations(lenient) == 2


async def test_past_the_grace_the_old_token_is_refused(strict: RunningDaemon) -> None:
    old = strict.token
    strict.client.rotate_token()
    assert await _status(strict, old) == 401
    assert await _status(strict, strict.token) == 200


def test_the_sync_client_reads_the_token_again_after_a_401(strict: RunningDaemon) -> None:
    tcp = Client(port=strict.port, token_file=strict.paths.token_file)
    assert tcp.health()["healthy"] is True        # has read (and kept) the first token
    strict.client.rotate_token()
    assert tcp.health()["healthy"] is True        # 401, the file again, the retry
    # A token file that holds a wrong token stays a 401 (one retry, not a loop).
    strict.client.rotate_token()
    strict.paths.token_file.write_text("wrong\n")
    with pytest.raises(Unauthorized):
        tcp.health()


async def test_the_async_client_reads_the_token_again_after_a_401(
        strict: RunningDaemon) -> None:
    async with AsyncClient(port=strict.port, token_file=strict.paths.token_file) as tcp:
        assert (await tcp.health())["healthy"] is True
        await tcp.rotate_token()                  # over TCP, with the current token
        assert (await tcp.health())["healthy"] is True
        strict.client.rotate_token()
        # The stream opens with the new token (a 401 would raise Unauthorized here); no
        # event comes, so it ends when it has been quiet for a moment.
        assert [item async for item in tcp.events(idle_timeout=0.5)] == []


def test_rotate_token_of_a_stopped_daemon_rewrites_the_file(short_tmp: Path) -> None:
    d = start_daemon(short_tmp)
    old = d.token
    assert d.stop() == 0
    res = run_cli(short_tmp, "daemon", "rotate-token", "--mesh", "t", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"rotated": True, "token_file": str(d.paths.token_file),
                                      "previous_valid_s": 0, "daemon_running": False}
    assert d.token != old
