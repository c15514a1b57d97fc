"""The store's password stays out of the process list: ``broker up`` takes the URL from
``TIDEMESH_BROKER_STORE`` or a 0600 ``--store-file``, and warns when it is on the command
line (every local user reads ``/proc/PID/cmdline``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon.harness import daemon_env, run_cli
from tests.e2e.harness import free_port

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

SECRET = "s3cret-not-for-ps"   # trust auth ignores it; only where it shows matters


def with_password(dsn: str) -> str:
    scheme, _, rest = dsn.partition("://")
    user, _, host = rest.partition("@")
    return f"{scheme}://{user.split(':')[0]}:{SECRET}@{host}"


class Started:
    def __init__(self, proc: subprocess.Popen[bytes], stderr: Path) -> None:
        self.proc, self.stderr = proc, stderr

    @property
    def cmdline(self) -> bytes:
        return Path(f"/proc/{self.proc.pid}/cmdline").read_bytes()

    def log(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.stderr.read_text().splitlines()
                if line.startswith("{")]


@pytest.fixture
def brokers(short_tmp: Path) -> Iterator[list[Started]]:
    started: list[Started] = []
    yield started
    for b in started:
        b.proc.terminate()
        b.proc.wait(20)


def start(home: Path, started: list[Started], *args: str,
          env: dict[str, str] | None = None) -> Started:
    err = home / f"broker-{len(started)}.err"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidemesh", "broker", "up", "--listen",
         f"127.0.0.1:{free_port()}", *args], stdout=subprocess.PIPE, stderr=open(err, "wb"),  # noqa: SIM115
        env=daemon_env(home, {"TIDEMESH_LOG_FORMAT": "json", **(env or {})}))
    b = Started(proc, err)
    started.append(b)
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if b"broker_ready" in line:
            return b
        if not line:
            raise AssertionError(f"broker exited {proc.wait()}: {err.read_text()[-2000:]}")
    raise AssertionError("broker did not become ready")


def test_store_from_the_environment_keeps_the_password_out_of_the_process_list(
        pg_database: str, short_tmp: Path, brokers: list[Started]) -> None:
    url = with_password(pg_database)
    b = start(short_tmp, brokers, env={"TIDEMESH_BROKER_STORE": url})
    assert SECRET.encode() not in b.cmdline and b"postgresql" not in b.cmdline
    # It serves that PostgreSQL store: a mesh made there through the same variable is its.
    made = run_cli(short_tmp, "broker", "mesh", "create", "team",
                   extra_env={"TIDEMESH_BROKER_STORE": url})
    assert made.returncode == 0 and SECRET not in made.stderr + made.stdout, made.stderr
    assert not [r for r in b.log() if r.get("event") == "broker_store_password_exposed"]
    assert not [line for line in b.stderr.read_text().splitlines() if line.startswith("warning")]


def test_a_0600_store_file_is_read_and_any_other_refused(
        pg_database: str, short_tmp: Path, brokers: list[Started]) -> None:
    secret_file = short_tmp / "store-url"
    secret_file.write_text(with_password(pg_database) + "\n")
    secret_file.chmod(0o644)
    refused = subprocess.run(
        [sys.executable, "-m", "tidemesh", "broker", "up", "--store-file", str(secret_file)],
        capture_output=True, text=True, env=daemon_env(short_tmp), timeout=60, check=False)
    assert refused.returncode == 2, refused.stderr
    assert "readable or writable by others" in refused.stderr and SECRET not in refused.stderr
    secret_file.chmod(0o600)
    b = start(short_tmp, brokers, "--store-file", str(secret_file))
    assert SECRET.encode() not in b.cmdline
    listed = run_cli(short_tmp, "broker", "mesh", "create", "team",
                     "--store-file", str(secret_file))
    assert listed.returncode == 0, listed.stderr
    both = run_cli(short_tmp, "broker", "member", "list", "--mesh", "team", "--store",
                   pg_database, "--store-file", str(secret_file))
    assert both.returncode == 2 and "not both" in both.stderr, both.stderr


def test_a_password_on_the_command_line_is_warned_of(
        pg_database: str, short_tmp: Path, brokers: list[Started]) -> None:
    b = start(short_tmp, brokers, "--store", with_password(pg_database))
    assert SECRET.encode() in b.cmdline   # what the warning is about
    warned = [r for r in b.log() if r.get("event") == "broker_store_password_exposed"]
    assert [r["level"] for r in warned] == ["warning"], b.stderr.read_text()
    lines = [line for line in b.stderr.read_text().splitlines()
             if line.startswith("warning: ")]
    assert len(lines) == 1 and "process list" in lines[0] and SECRET not in lines[0]
    operator = run_cli(short_tmp, "broker", "mesh", "create", "team", "--store",
                       with_password(pg_database))
    assert operator.returncode == 0 and "process list" in operator.stderr, operator.stderr
    quiet = run_cli(short_tmp, "broker", "member", "list", "--mesh", "team", "--store",
                    pg_database)
    assert quiet.returncode == 0 and "process list" not in quiet.stderr, quiet.stderr
