from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tidemesh.cli import logview


def test_parse_since_spans() -> None:
    assert logview.parse_since("90s") == timedelta(seconds=90)
    assert logview.parse_since("10m") == timedelta(minutes=10)
    assert logview.parse_since("2h") == timedelta(hours=2)
    assert logview.parse_since("1d") == timedelta(days=1)
    with pytest.raises(ValueError, match="30s, 10m, 2h or 1d"):
        logview.parse_since("10 minutes")


def test_rotated_files_oldest_first_live_last() -> None:
    live = Path("/l/daemon.log")
    present = [live, Path("/l/daemon.log.1"), Path("/l/daemon.log.10"),
               Path("/l/daemon.log.2"), Path("/l/daemon.logger"), Path("/l/daemon.log.x")]
    assert logview.rotated_files(live, iter(present)) == [
        Path("/l/daemon.log.10"), Path("/l/daemon.log.2"), Path("/l/daemon.log.1"), live]


def test_pretty_puts_time_level_event_first() -> None:
    rec = {"pid": 7, "event": "daemon_started", "level": "info", "mesh": "t",
           "timestamp": "2026-11-23T15:20:49.508207Z", "note": "two words", "n": [1]}
    assert logview.pretty(rec) == ('2026-11-23 15:20:49 info  daemon_started pid=7 mesh=t '
                                   'note="two words" n=[1]')


def test_not_json_is_none_and_since_keeps_undated() -> None:
    assert logview.parse("Traceback (most recent call last):") is None
    old = {"timestamp": "2026-01-01T00:00:00Z", "event": "a"}
    new = {"timestamp": "2026-11-23T00:00:00Z", "event": "b"}
    undated = {"event": "c"}
    cut = datetime(2026, 6, 1, tzinfo=UTC)
    assert list(logview.newer_than([old, new, undated], cut)) == [new, undated]
