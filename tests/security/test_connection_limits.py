"""Connections that send no request, or send one a byte at a time, cannot hold the daemon's
listeners (issue #31, item 4): a request head has ``ipc.header_timeout_s`` to arrive, an idle
connection ``ipc.idle_timeout_s``, a 401 closes its connection, and past
``ipc.max_unauthenticated`` open token-less TCP connections the oldest goes, so a client with
the token still gets through, even to a daemon short of file descriptors.
"""

from __future__ import annotations

import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon.harness import RunningDaemon, daemon_env, start_daemon
from tidemesh.client import Client, DaemonNotRunning

LIMITS = {"TIDEMESH_IPC_HEADER_TIMEOUT_S": "1", "TIDEMESH_IPC_IDLE_TIMEOUT_S": "1",
          "TIDEMESH_IPC_MAX_UNAUTHENTICATED": "8"}
# The bound the tests allow for a 1 s timeout: generous, since the machine may be busy.
CLOSED_WITHIN_S = 15.0


@pytest.fixture
def daemon(short_tmp: Path) -> Iterator[RunningDaemon]:
    d = start_daemon(short_tmp, extra_env=LIMITS)
    try:
        yield d
    finally:
        assert d.stop() == 0, d.log.read_text()[-2000:]


def _tcp(d: RunningDaemon) -> socket.socket:
    return socket.create_connection(("127.0.0.1", d.port), timeout=CLOSED_WITHIN_S)


def _unix(d: RunningDaemon) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(CLOSED_WITHIN_S)
    s.connect(str(d.paths.socket))
    return s


def _closed_by_peer(s: socket.socket, trickle: bytes = b"") -> bool:
    """Whether the daemon closes ``s`` within the bound; ``trickle`` is sent a byte every
    0.2 s meanwhile (a request head that never ends)."""
    deadline = time.monotonic() + CLOSED_WITHIN_S
    s.settimeout(0.2)
    i = 0
    try:
        while time.monotonic() < deadline:
            if trickle:
                s.sendall(trickle[i % len(trickle):i % len(trickle) + 1])
                i += 1
            try:
                if s.recv(65536) == b"":
                    return True
            except TimeoutError:
                continue
    except (ConnectionResetError, BrokenPipeError):
        return True
    finally:
        s.close()
    return False


HEAD = b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 10_000


@pytest.mark.parametrize("dial", [_tcp, _unix], ids=["tcp", "unix"])
def test_a_connection_that_sends_nothing_is_closed(daemon: RunningDaemon, dial: object) -> None:
    assert _closed_by_peer(dial(daemon))  # type: ignore[operator]


@pytest.mark.parametrize("dial", [_tcp, _unix], ids=["tcp", "unix"])
def test_a_request_head_sent_a_byte_at_a_time_is_cut_off(daemon: RunningDaemon,
                                                        dial: object) -> None:
    assert _closed_by_peer(dial(daemon), trickle=HEAD)  # type: ignore[operator]


def test_an_idle_connection_after_an_answer_is_closed(daemon: RunningDaemon) -> None:
    s = _unix(daemon)
    s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert s.recv(65536).startswith(b"HTTP/1.1 200 ")
    assert _closed_by_peer(s)


def test_a_401_closes_its_connection(daemon: RunningDaemon) -> None:
    s = _tcp(daemon)
    s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    answer = b""
    s.settimeout(CLOSED_WITHIN_S)
    while chunk := s.recv(65536):
        answer += chunk
    s.close()
    assert answer.startswith(b"HTTP/1.1 401 ")
    assert b"connection: close" in answer.lower()


# Timeouts long enough that only the cap can free the listeners in time.
CAPPED = {"TIDEMESH_IPC_HEADER_TIMEOUT_S": "60", "TIDEMESH_IPC_IDLE_TIMEOUT_S": "60",
          "TIDEMESH_IPC_MAX_UNAUTHENTICATED": "8"}


def _start_short_of_fds(home: Path, nofile: int) -> RunningDaemon:
    """A daemon allowed ``nofile`` file descriptors (as under a low ulimit)."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    log = home / "t.out"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tidemesh", "daemon", "up", "--foreground", "--mesh", "t"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=daemon_env(home, CAPPED), preexec_fn=limit)
    d = RunningDaemon(home, "t", proc, log, CAPPED)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            Client(d.paths.socket, timeout=1.0).version()
            return d
        except DaemonNotRunning:
            assert proc.poll() is None, log.read_text()[-2000:]
            time.sleep(0.05)
    d.kill()
    raise AssertionError(f"the daemon did not start: {log.read_text()[-2000:]}")


def test_token_less_connections_past_the_cap_leave_room_for_the_token(short_tmp: Path) -> None:
    d = _start_short_of_fds(short_tmp, 256)
    held: list[socket.socket] = []
    try:
        for _ in range(300):   # more than the daemon has descriptors for
            held.append(_tcp(d))
        tcp = Client(port=d.port, token_file=d.paths.token_file, timeout=10.0)
        assert tcp.version()["mesh"] == "t"
        assert Client(d.paths.socket, timeout=10.0).version()["mesh"] == "t"
        open_ones = 0
        for s in held:
            s.settimeout(0.01)
            try:
                open_ones += s.recv(1) != b""
            except TimeoutError:
                open_ones += 1
            except OSError:
                pass
        assert open_ones <= 8, f"{open_ones} token-less connections still open"
    finally:
        for s in held:
            s.close()
        code = d.stop()
    assert code == 0, d.log.read_text()[-2000:]
