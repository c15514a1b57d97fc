"""The embedded SQLite store serves one broker; a second is refused with what to do instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.daemon.harness import run_cli
from tests.e2e.harness import Broker, free_port
from tidemesh.core.exitcodes import Exit

pytestmark = pytest.mark.slow


def test_a_second_broker_on_one_sqlite_file_is_refused_until_the_first_is_gone(
    short_tmp: Path,
) -> None:
    store = f"sqlite:///{short_tmp}/broker.db"
    first = Broker(short_tmp, store)
    first.start()
    try:
        second = run_cli(short_tmp, "broker", "up", "--store", store,
                         "--listen", f"127.0.0.1:{free_port()}", timeout=30)
        assert second.returncode == Exit.ALREADY_RUNNING, second.stderr
        assert first.proc is not None and f"pid {first.proc.pid}" in second.stderr
        assert "postgresql://" in second.stderr
        # Another file is another store: no reason to refuse it.
        other = Broker(short_tmp, f"sqlite:///{short_tmp}/other.db")
        other.start()
        other.stop()
    finally:
        first.kill()  # however it dies, the kernel drops its lock
    again = Broker(short_tmp, store)
    again.start()
    assert again.stop() == 0
