"""Fixtures every test folder shares: short temp dirs for sockets, and real PostgreSQL.

Tests that need PostgreSQL or Java skip with a reason on a laptop without them, and fail
when ``CI`` is set, so CI can never pass by skipping them.
"""

from __future__ import annotations

import asyncio
import compileall
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

REPO = Path(__file__).resolve().parents[1]
PG_DSN = os.environ.get("TIDEMESH_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile tidemesh's sources to bytecode once, before any test starts a process.

    The suite starts thousands of tidemesh processes (brokers, daemons, CLIs). Where Python
    writes no bytecode (``PYTHONDONTWRITEBYTECODE``, as in many CI images) each compiled
    every tidemesh module again: about a quarter of a second of CPU per process, a quarter
    of a CLI's start. Python still reads bytecode that exists, and checks it against the
    source, so an edit since is compiled as before.
    """
    if hasattr(session.config, "workerinput"):
        return   # an xdist worker: the controller has done it
    import tomllib

    folders = tomllib.loads((REPO / "pyproject.toml").read_text("utf-8"))[
        "tool"]["setuptools"]["package-dir"].values()
    for folder in folders:
        compileall.compile_dir(REPO / folder, quiet=1)


@pytest.fixture(autouse=True, scope="session")
def _loggers_never_cached() -> Iterator[None]:
    """Our ``log.configure`` functions cache each logger on first use, as a process should.
    In the test process a test that configures logging (``tests/security/test_log_secrets``)
    would then pin every logger used after it to its own output, and a later
    ``capture_logs`` would see nothing; which tests that hits depends on the order tests run
    in, which differs between xdist workers. Under pytest nothing is cached."""
    configure = structlog.configure

    def uncached(*args: Any, **kwargs: Any) -> None:
        kwargs["cache_logger_on_first_use"] = False
        configure(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(structlog, "configure", uncached)
        yield


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def unavailable(reason: str) -> None:
    """Skip on a developer machine; fail in CI."""
    if in_ci():
        pytest.fail(f"{reason} (CI is set, so this cannot be skipped)")
    pytest.skip(reason)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short folder under /tmp: Unix socket paths must stay under ~104 bytes."""
    d = Path(tempfile.mkdtemp(prefix="tm-", dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _pg_reachable() -> bool:
    host, port = "127.0.0.1", 5432
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    """The DSN of the test PostgreSQL server (database ``test``)."""
    if not _pg_reachable():
        unavailable(f"PostgreSQL is not reachable at {PG_DSN}")
    return PG_DSN


async def _admin(dsn: str, sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture
def pg_database(pg_dsn: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test; dropped afterwards.

    Each test gets its own database so tests (and several test runs at once) never share
    tables.
    """
    name = "tm_" + secrets.token_hex(6)
    asyncio.run(_admin(pg_dsn, f'CREATE DATABASE "{name}"'))
    base, _, _ = pg_dsn.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        asyncio.run(_admin(pg_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def small_fs() -> Iterator[Path]:
    """A real 48 MiB file system (tmpfs), so that a disk floor can be crossed for real."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    target = Path(tempfile.mkdtemp(prefix="tm-fs-", dir="/tmp"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(target)], check=True)
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)
        target.rmdir()
