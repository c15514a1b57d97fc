"""Another local user cannot plant the daemon's runtime folder, its token or its socket
(issue #31, item 1). The attacker is a real second Unix user, made for the test and removed
after it; that needs root (CI runs as root), so elsewhere these tests skip and say why.
"""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import unavailable
from tests.daemon.harness import daemon_env
from tidemesh.client import AsyncClient, Client
from tidemesh.core.ownership import NotPrivate
from tidemesh.core.paths import daemon_paths


@pytest.fixture(scope="module")
def probe() -> Iterator[pwd.struct_passwd]:
    """A second Unix user, ``tmprobe<pid>``, removed at the end."""
    if os.geteuid() != 0:
        unavailable("a second Unix user can be made only as root")
    name = f"tmprobe{os.getpid()}"
    for _ in range(20):  # another test run may hold the passwd lock for a moment
        made = subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name],
                              capture_output=True, text=True, check=False)
        if made.returncode in (0, 9):  # 9: it exists already (a previous run's)
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"useradd failed: {made.stderr}")
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True, check=False)


def as_user(user: pwd.struct_passwd, script: str) -> None:
    subprocess.run(["runuser", "-u", user.pw_name, "--", "sh", "-c", script], check=True)


def _shared_tmp(short_tmp: Path) -> Path:
    """A folder like /tmp (sticky, writable by all) inside the test's own."""
    shared = short_tmp / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    short_tmp.chmod(0o755)
    return shared


def _start(home: Path, runtime: Path) -> subprocess.Popen[bytes]:
    """``daemon up`` as root with HOME and XDG_RUNTIME_DIR given, TIDEMESH_HOME unset."""
    env = {k: v for k, v in daemon_env(home).items() if k != "TIDEMESH_HOME"}
    env.update(HOME=str(home), XDG_RUNTIME_DIR=str(runtime))
    return subprocess.Popen([sys.executable, "-m", "tidemesh", "daemon", "up", "--foreground",
                             "--mesh", "t"], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _refused(proc: subprocess.Popen[bytes], sock: Path) -> str:
    """The daemon's output once it exited; fails if it listens on ``sock`` instead."""
    deadline = time.monotonic() + 30
    while proc.poll() is None and time.monotonic() < deadline:
        if sock.exists():
            proc.kill()
            proc.wait()
            pytest.fail("the daemon adopted a runtime folder another user made")
        time.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
    out = proc.communicate()[0].decode()
    assert proc.returncode == 2, out
    return out


def test_a_runtime_folder_planted_by_another_user_is_refused(
        short_tmp: Path, probe: pwd.struct_passwd) -> None:
    runtime = _shared_tmp(short_tmp) / "tidemesh-0"
    mine = daemon_paths("t", {"HOME": str(short_tmp / "home"),
                              "XDG_RUNTIME_DIR": str(runtime)})
    # What the probe did: umask 0, the whole chain, and a token of its own choosing.
    as_user(probe, f"umask 0; mkdir -p {mine.runtime_dir} && "
                   f"echo planted-by-probe > {mine.token_file}")
    out = _refused(_start(short_tmp / "home", runtime), mine.socket)
    assert str(runtime) in out and f"uid {probe.pw_uid}" in out, out
    assert mine.token_file.read_text() == "planted-by-probe\n"
    assert not mine.port_file.exists()


def test_a_runtime_folder_others_can_write_to_is_refused(
        short_tmp: Path, probe: pwd.struct_passwd) -> None:
    runtime = short_tmp / "rt"
    mine = daemon_paths("t", {"HOME": str(short_tmp / "home"),
                              "XDG_RUNTIME_DIR": str(runtime)})
    mine.runtime_dir.mkdir(parents=True, mode=0o700)
    mine.runtime_dir.chmod(0o777)   # ours, but anyone may add files to it
    short_tmp.chmod(0o755)
    for d in mine.runtime_dir.parents:
        if d == short_tmp:
            break
        d.chmod(0o755)
    as_user(probe, f"echo planted-by-probe > {mine.token_file}")
    out = _refused(_start(short_tmp / "home", runtime), mine.socket)
    assert str(mine.runtime_dir) in out and "writable by group or others" in out, out
    assert mine.token_file.read_text() == "planted-by-probe\n"


def _listener(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    server.settimeout(0.5)
    return server


def _nothing_arrived(server: socket.socket) -> bool:
    try:
        conn, _ = server.accept()
    except TimeoutError:
        return True
    with conn:
        conn.settimeout(0.5)
        try:
            return conn.recv(1) == b""
        except TimeoutError:
            return True


def test_the_client_refuses_a_socket_another_user_owns(
        short_tmp: Path, probe: pwd.struct_passwd) -> None:
    sock = short_tmp / "sock"
    server = _listener(sock)
    os.chown(sock, probe.pw_uid, probe.pw_gid)   # as if the probe had bound it
    try:
        with pytest.raises(NotPrivate, match=f"uid {probe.pw_uid}"):
            Client(sock, timeout=2.0).send({"to": "topic:ops", "body": "secret"})
        assert _nothing_arrived(server)
    finally:
        server.close()


async def test_the_async_client_refuses_a_socket_another_user_owns(
        short_tmp: Path, probe: pwd.struct_passwd) -> None:
    sock = short_tmp / "sock"
    server = _listener(sock)
    os.chown(sock, probe.pw_uid, probe.pw_gid)
    try:
        async with AsyncClient(sock, timeout=2.0) as client:
            with pytest.raises(NotPrivate, match=f"uid {probe.pw_uid}"):
                await client.send({"to": "topic:ops", "body": "secret"})
        assert _nothing_arrived(server)
    finally:
        server.close()


def test_the_cli_refuses_a_socket_in_a_folder_another_user_owns(
        short_tmp: Path, probe: pwd.struct_passwd) -> None:
    runtime = short_tmp / "rt"
    mine = daemon_paths("t", {"HOME": str(short_tmp / "home"),
                              "XDG_RUNTIME_DIR": str(runtime)})
    mine.runtime_dir.mkdir(parents=True, mode=0o700)
    server = _listener(mine.socket)
    os.chown(mine.runtime_dir, probe.pw_uid, probe.pw_gid)
    env = {k: v for k, v in daemon_env(short_tmp).items() if k != "TIDEMESH_HOME"}
    env.update(HOME=str(short_tmp / "home"), XDG_RUNTIME_DIR=str(runtime))
    try:
        sent = subprocess.run([sys.executable, "-m", "tidemesh", "send", "--mesh", "t",
                               "--to", "topic:ops", "secret"],
                              env=env, capture_output=True, text=True, timeout=60, check=False)
        assert _nothing_arrived(server)
    finally:
        server.close()
    assert sent.returncode != 0, sent.stdout
    assert "not_private" in sent.stderr and str(mine.runtime_dir) in sent.stderr, sent.stderr
