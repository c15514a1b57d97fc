"""Reading the daemon's JSON log as a person does (pure: text in, text out).

The daemon writes one JSON object per line to ``daemon.log`` and rolls it to
``daemon.log.1`` … ``daemon.log.N`` (``.N`` oldest). ``tidemesh daemon logs`` reads them
oldest first, keeps what is newer than ``--since``, and prints each record pretty or as it is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tidemesh.cli.terminal import printable

_SPAN = re.compile(r"^\s*(\d+)\s*(s|m|h|d)\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
# Printed first, in this order; everything else follows as key=value.
_HEAD = ("timestamp", "level", "event")


def parse_since(text: str) -> timedelta:
    """``90s``, ``10m``, ``2h``, ``1d``."""
    m = _SPAN.match(text)
    if m is None:
        raise ValueError(f"--since takes a span such as 30s, 10m, 2h or 1d, not {text!r}")
    return timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})


def rotated_files(log_file: Path, present: Iterable[Path]) -> list[Path]:
    """The log's files, oldest first: ``.N`` … ``.1``, then the live file."""
    present = list(present)
    numbered: list[tuple[int, Path]] = []
    for p in present:
        suffix = p.name[len(log_file.name) + 1:]
        if p.name.startswith(log_file.name + ".") and suffix.isdigit():
            numbered.append((int(suffix), p))
    live = [log_file] if log_file in present else []
    return [p for _, p in sorted(numbered, reverse=True)] + live


def parse(line: str) -> dict[str, Any] | None:
    """One record, or None for a line that is not a JSON object (a crash's traceback)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def timestamp(record: dict[str, Any]) -> datetime | None:
    try:
        return datetime.fromisoformat(str(record["timestamp"]).replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return None


def newer_than(records: Iterable[dict[str, Any]], since: datetime | None
               ) -> Iterator[dict[str, Any]]:
    for record in records:
        at = timestamp(record)
        if since is None or at is None or at >= since:
            yield record


def pretty(record: dict[str, Any]) -> str:
    """``2026-11-23 15:20:49 info  daemon_started mesh=t pid=8545``, local to UTC."""
    at = timestamp(record)
    when = at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if at else "-"
    level = str(record.get("level", "-"))
    rest = " ".join(f"{k}={_value(v)}" for k, v in record.items() if k not in _HEAD)
    # A logged field may hold a member's text (a name, a topic): escaped like any output.
    return printable(f"{when} {level:<5} {record.get('event', '-')}" + (f" {rest}" if rest else ""))


def _value(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
    return json.dumps(text) if (" " in text or not text) else text
