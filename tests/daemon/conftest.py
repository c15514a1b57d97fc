from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon.harness import RunningDaemon, start_daemon


@pytest.fixture
def daemon(short_tmp: Path) -> Iterator[RunningDaemon]:
    """A real daemon process on a short socket path; must stop cleanly (exit 0)."""
    d = start_daemon(short_tmp)
    try:
        yield d
    finally:
        code = d.stop()
        assert code == 0, d.log.read_text()[-2000:]
