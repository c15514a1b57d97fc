"""A PostgreSQL store that cannot be opened is one line and a documented exit code, never an
asyncpg traceback: 2 for a URL to fix (no such database or role), 1 for a server that
cannot be reached (the service manager retries). Real CLI processes, a real server."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.daemon.harness import run_cli
from tidemesh.core.exitcodes import Exit


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _one_line(res: object, code: int, *said: str) -> None:
    out = res.stdout + res.stderr  # type: ignore[attr-defined]
    assert res.returncode == code, out  # type: ignore[attr-defined]
    assert "Traceback" not in out and "asyncpg" not in out, out
    lines = res.stderr.strip().splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 1 and lines[0].startswith("error: "), out
    for text in said:
        assert text in lines[0], out


@pytest.mark.parametrize("command", [
    ("broker", "migrate"), ("broker", "mesh", "create", "team"),
    ("broker", "up", "--listen", "127.0.0.1:0"),
], ids=["migrate", "mesh-create", "up"])
def test_a_store_that_cannot_be_opened_is_one_line(short_tmp: Path, pg_dsn: str,
                                                   command: tuple[str, ...]) -> None:
    base, _, _ = pg_dsn.rpartition("/")
    no_db = run_cli(short_tmp, *command, "--store", f"{base}/tm_nonexistent_db")
    _one_line(no_db, Exit.USAGE, "invalid_config", "tm_nonexistent_db",
              'database "tm_nonexistent_db" does not exist')
    # A URL with a password through the environment, as the docs say (on the command line
    # it would add a warning line).
    no_role = run_cli(short_tmp, *command, extra_env={
        "TIDEMESH_BROKER_STORE": "postgresql://tm_no_such_role:secret@127.0.0.1:5432/test"})
    _one_line(no_role, Exit.USAGE, 'role "tm_no_such_role" does not exist')
    assert "secret" not in no_role.stderr, "the password is never printed"
    refused = run_cli(short_tmp, *command, "--store",
                      f"postgresql://postgres@127.0.0.1:{_closed_port()}/test")
    _one_line(refused, Exit.FAILURE, "unavailable", "cannot be reached")
