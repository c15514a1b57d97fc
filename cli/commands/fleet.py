"""``tidemesh daemon ps`` and ``tidemesh daemon logs``: every mesh daemon of this user here.

One daemon runs per mesh, each with its own files; these commands look across
them. ``ps`` asks each running daemon over IPC and reads the lock of the others; ``logs``
reads one daemon's JSON log files, the rotated ones included, and can follow them.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from tidemesh.cli import logview
from tidemesh.cli.commands.common import client_for, json_option, mesh_option, paths_for
from tidemesh.cli.output import emit_json, table
from tidemesh.cli.terminal import printable
from tidemesh.client import DaemonNotRunning
from tidemesh.client.endpoint import joined_meshes
from tidemesh.core.errors import TidemeshError
from tidemesh.daemon import admin

FOLLOW_POLL_S = 0.25


def _row(mesh: str) -> dict[str, Any]:
    paths = paths_for(mesh)
    held = admin.is_held(paths.lock_file)
    row: dict[str, Any] = {"mesh": mesh, "pid": admin.holder_pid(paths.lock_file) if held
                           else None, "state": "stopped", "connected": None, "outbox": None,
                           "socket": str(paths.socket)}
    if not held:
        if admin.revocation.load(paths.revoked_file) is not None:
            row["state"] = "revoked"  # stopped for good: `daemon up` would refuse (exit 12)
        return row
    try:
        health = client_for(mesh, timeout=2.0).health()
    except DaemonNotRunning:
        row["state"] = "not_answering"      # holds its lock, its socket does not answer
        return row
    except TidemeshError as exc:
        row["state"] = f"error: {exc.code}"
        return row
    row.update(pid=health["pid"], state="running" if health["healthy"] else "unhealthy",
               connected=health["connected"], outbox=health["queue_depth"])
    return row


@click.command("ps")
@json_option
def ps(as_json: bool) -> None:
    """List every joined mesh's daemon: mesh, pid, state, connected, outbox depth, socket;
    then the fleet: daemons running of fleet.max_daemons, data bytes of
    fleet.total_disk_budget."""
    rows = [_row(m) for m in joined_meshes()]
    budgets = _fleet()
    if as_json:
        emit_json({"items": rows, "fleet": budgets})
        return
    if not rows:
        click.echo("no mesh is joined on this host (tidemesh daemon join INVITE)")
    else:
        table([{**r, "pid": r["pid"] or "-", "outbox": _depth(r["outbox"]),
                 "connected": "-" if r["connected"] is None
                 else ("yes" if r["connected"] else "no")}
                for r in rows], ["mesh", "pid", "state", "connected", "outbox", "socket"])
    if "error" in budgets:
        click.echo(f"fleet: {budgets['error']}", err=True)
        return
    budget = budgets["total_disk_budget"]
    click.echo(f"fleet: {budgets['running']} of {budgets['max_daemons']} daemons running "
               f"(fleet.max_daemons); data {budgets['disk_used_bytes']} bytes"
               + (f" of {budget} (fleet.total_disk_budget)" if budget is not None
                  else ", no fleet.total_disk_budget")
               + f"; settings in {budgets['config_file']}")


def _fleet() -> dict[str, Any]:
    """The user's fleet budgets and where they stand."""
    try:
        loaded, path = admin.fleet.settings(os.environ)
    except TidemeshError as exc:
        return {"error": exc.message}
    used = admin.fleet.disk_used(os.environ)
    budget = loaded.fleet_total_disk_budget
    return {"running": len(admin.fleet.running(os.environ)),
            "max_daemons": loaded.fleet_max_daemons, "disk_used_bytes": used,
            "total_disk_budget": budget,
            "over_disk_budget": budget is not None and used >= budget,
            "config_file": str(path)}


def _depth(counts: dict[str, int] | None) -> str:
    if not counts:
        return "-"
    return " ".join(f"{k}={v}" for k, v in sorted(counts.items()) if v) or "empty"


@click.command("logs")
@mesh_option
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines as they come.")
@click.option("--since", default=None, metavar="SPAN",
              help="Only records newer than SPAN ago: 30s, 10m, 2h, 1d.")
@json_option
def logs(mesh: str, follow: bool, since: str | None, as_json: bool) -> None:
    """Print the daemon's structured log, pretty by default, across rotated files."""
    try:
        cutoff = datetime.now(UTC) - logview.parse_since(since) if since else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    log_file = paths_for(mesh).log_file
    files = logview.rotated_files(log_file, log_file.parent.glob(log_file.name + "*"))
    if not files and not follow:
        click.echo(f"no log for mesh {mesh} at {log_file}", err=True)
        sys.exit(1)
    lines: Iterator[str] = (line for f in files for line in _lines(f))
    if follow:
        lines = _chain(lines, _follow(log_file))
    try:
        for line in lines:
            record = logview.parse(line)
            if record is None:
                click.echo(printable(line.rstrip("\n"), lines=True))
                continue
            for r in logview.newer_than([record], cutoff):
                click.echo(line.rstrip("\n") if as_json else logview.pretty(r))
    except KeyboardInterrupt:
        return


def _lines(path: Path) -> Iterator[str]:
    try:
        with path.open(encoding="utf-8", errors="replace") as fh:
            yield from fh
    except FileNotFoundError:   # rolled away between listing and reading
        return


def _chain(first: Iterator[str], then: Iterator[str]) -> Iterator[str]:
    yield from first
    yield from then


def _follow(log_file: Path) -> Iterator[str]:
    """New lines of the live file from its current end; a roll (a new inode) is followed by
    reading the new file from its start."""
    fh, inode = _open_at_end(log_file)
    partial = ""        # a line the daemon is still writing
    while True:
        partial += fh.readline() if fh else ""
        if partial.endswith("\n"):
            yield partial
            partial = ""
            continue
        time.sleep(FOLLOW_POLL_S)
        try:
            current = os.stat(log_file).st_ino
        except FileNotFoundError:
            continue
        if current != inode:
            if fh:
                yield from fh            # what was written before the roll
                fh.close()
            fh, inode = log_file.open(encoding="utf-8", errors="replace"), current


def _open_at_end(log_file: Path) -> tuple[Any, int | None]:
    try:
        fh = log_file.open(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None, None
    fh.seek(0, os.SEEK_END)
    return fh, os.fstat(fh.fileno()).st_ino
