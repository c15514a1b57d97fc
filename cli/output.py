"""Human tables versus ``--json``, and errors as one line plus an exit code.

Every value printed here may be another member's text: it goes through ``cli/terminal``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn

import click

from tidemesh.cli.terminal import json_text, printable
from tidemesh.client import DaemonNotAnswering, DaemonNotRunning, IncompatibleDaemon
from tidemesh.core.errors import Conflict, MemberRevoked, TidemeshError, UsageError
from tidemesh.core.exitcodes import Exit
from tidemesh.core.ownership import NotPrivate
from tidemesh.core.settings import ConfigError


def emit_json(data: Any) -> None:
    click.echo(json_text(json.dumps(data, indent=2, ensure_ascii=False)))


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> None:
    if not rows:
        click.echo("(none)")
        return
    cells = [[("" if r.get(c) is None else printable(str(r.get(c)))) for c in columns]
             for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    click.echo("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in cells:
        click.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))


def when(ms: Any) -> str:
    """Milliseconds since the epoch as a UTC time a person reads; ``-`` for nothing."""
    if not isinstance(ms, int | float) or isinstance(ms, bool):
        return "-" if ms is None else str(ms)
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def readable(row: Mapping[str, Any]) -> dict[str, Any]:
    """A record for people: every ``*_at`` field (milliseconds since the epoch) as a time."""
    return {k: when(v) if k.endswith("_at") and isinstance(v, int) else v
            for k, v in row.items()}


def text_value(value: Any) -> str:
    """One value as a person reads it: ``-`` for nothing, yes/no, ``kind:ref`` for a
    destination, ``k=v, …`` for a mapping, ``a, b`` for a list; never a Python repr."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Mapping):
        if value.keys() == {"kind", "ref"}:
            return f"{value['kind']}:{value['ref']}"
        return ", ".join(f"{k}={_nested(v)}" for k, v in value.items()) or "-"
    if isinstance(value, list | tuple):
        return ", ".join(text_value(v) for v in value) or "-"
    return str(value)


def _nested(value: Any) -> str:
    return f"({text_value(value)})" if isinstance(value, Mapping) else text_value(value)


def fields(data: Mapping[str, Any]) -> None:
    """Print ``key value`` lines, the values aligned, for the human form of one record."""
    shown = {printable(k): printable(text_value(v)) for k, v in data.items()}
    width = max((len(k) for k in shown), default=0)
    for key, value in shown.items():
        click.echo(f"{key:{width}}  {value}")


def exit_code_for(err: TidemeshError) -> Exit:
    if isinstance(err, DaemonNotRunning):
        return Exit.NOT_RUNNING
    if isinstance(err, DaemonNotAnswering):
        return Exit.NOT_ANSWERING
    if isinstance(err, Conflict):
        return Exit.CONFLICT
    if isinstance(err, MemberRevoked):
        return Exit.REVOKED
    if isinstance(err, IncompatibleDaemon):
        return Exit.FEATURE_UNAVAILABLE
    if isinstance(err, UsageError | ConfigError | NotPrivate):
        return Exit.USAGE   # a runtime folder another user could have made: as the daemon says
    if 400 <= err.http_status < 500:
        return Exit.REJECTED
    return Exit.FAILURE


def fail(err: TidemeshError, as_json: bool = False, code: Exit | None = None) -> NoReturn:
    """Print the error (one line, or the wire body with --json) and exit with its code
    (``code`` when the command knows better, e.g. 5 for a daemon in the way)."""
    if as_json:
        emit_json(err.to_body())
    else:
        extra = {k: v for k, v in err.details.items() if v is not None}
        tail = "".join(f"\n  {k}: {v}" for k, v in extra.items())
        click.echo(printable(f"error: {err.code}: {err.message}{tail}", lines=True), err=True)
    sys.exit(int(code if code is not None else exit_code_for(err)))
