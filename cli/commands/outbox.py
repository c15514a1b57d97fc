"""``tidemesh daemon outbox list|inspect|requeue``: over IPC, or on the file when the daemon
is down."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import click

from tidemesh.cli.commands.common import client_for, json_option, mesh_option, paths_for
from tidemesh.cli.output import emit_json, fail, fields, readable, table
from tidemesh.cli.terminal import json_text
from tidemesh.client import DaemonNotRunning
from tidemesh.core.errors import InvalidRequest, TidemeshError
from tidemesh.core.hooks import PRE_SEND
from tidemesh.daemon import main as daemon_main
from tidemesh.daemon.admin import describe_hooks, offline

_FILTERS = {"failed": "dead", "pending": "pending", "inflight": "inflight", "done": "done",
            "aborted": "aborted"}


@click.group("outbox")
def outbox_group() -> None:
    """Inspect and recover outbox rows (works with the daemon down too)."""


def _status_filter(flags: dict[str, bool]) -> str | None:
    chosen = [status for flag, status in _FILTERS.items() if flags.get(flag)]
    if len(chosen) > 1:
        raise click.UsageError("choose at most one status filter")
    return chosen[0] if chosen else None


@outbox_group.command("list")
@mesh_option
@click.option("--failed", is_flag=True, help="Rows that ended dead (409, 4xx, max age).")
@click.option("--pending", is_flag=True)
@click.option("--inflight", is_flag=True)
@click.option("--done", is_flag=True)
@click.option("--aborted", is_flag=True)
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@json_option
def list_cmd(mesh: str, limit: int, as_json: bool, **flags: bool) -> None:
    """List outbox rows, newest first."""
    status = _status_filter(flags)
    try:
        try:
            data: Mapping[str, Any] = client_for(mesh).outbox_list(status, limit)
        except DaemonNotRunning:
            data = offline.outbox_list(paths_for(mesh).outbox_db, status, limit)
    except TidemeshError as exc:
        fail(exc, as_json)
    if as_json:
        emit_json(data)
        return
    table([readable(r) for r in data["items"]],
          ["id", "client_message_id", "status", "attempts", "enqueued_at", "last_error"])
    click.echo("counts: " + ", ".join(f"{k}={v}" for k, v in data["counts"].items()))


@outbox_group.command("inspect")
@mesh_option
@click.argument("row_id")
@json_option
def inspect_cmd(mesh: str, row_id: str, as_json: bool) -> None:
    """Show one row and its requeue chain (superseded_by links)."""
    try:
        try:
            row = client_for(mesh).outbox_inspect(row_id)
        except DaemonNotRunning:
            row = offline.outbox_inspect(paths_for(mesh).outbox_db, row_id)
    except TidemeshError as exc:
        fail(exc, as_json)
    if as_json:
        emit_json(row)
        return
    request = row.get("request") or {}
    fields({**readable({k: v for k, v in row.items() if k not in ("chain", "request")}),
            "chain": " → ".join(f"[{i}]" if i == row_id else i for i in row["chain"])})
    click.echo("request (as sent to the broker; a DM's body is sealed):")
    click.echo("\n".join("  " + line for line in json_text(json.dumps(
        request, indent=2, ensure_ascii=False)).splitlines()))


def _pre_send_runs(mesh: str) -> bool:
    """Whether this mesh's daemon would run a pre-send hook (a file that is executable and
    not disabled in hooks.toml)."""
    return any(h["name"] == PRE_SEND and h["state"] in ("enabled", "no hooks.toml table")
               for h in describe_hooks(paths_for(mesh).hooks_dir))


def _patch(path: Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        fail(InvalidRequest(f"cannot read --patch-payload {path}: {exc}", field="patch_payload"))
    if not isinstance(data, dict):
        fail(InvalidRequest("--patch-payload must hold a JSON send request object"))
    return data


@outbox_group.command("requeue")
@mesh_option
@click.argument("row_id")
@click.option("--new-client-id", default=None, help="The successor's client_message_id.")
@click.option("--auto", is_flag=True, help="Mint a fresh id (the default without --new-client-id).")
@click.option("--patch-payload", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="A JSON send request to send instead of the old payload.")
@json_option
def requeue_cmd(mesh: str, row_id: str, new_client_id: str | None, auto: bool,
                patch_payload: Path | None, as_json: bool) -> None:
    """Retire a dead or pending row and queue it again under a fresh id, atomically."""
    if auto and new_client_id:
        raise click.UsageError("--auto and --new-client-id exclude each other")
    patch = _patch(patch_payload)
    try:
        try:
            result: Any = client_for(mesh).outbox_requeue(row_id, new_client_id, patch)
        except DaemonNotRunning as down:
            if patch is not None and _pre_send_runs(mesh):
                # The veto judges every body that goes on the wire; without the daemon there
                # is nothing to run it, so a patched payload waits for the daemon.
                raise DaemonNotRunning(
                    f"{down.reason}; a patched payload must pass the pre-send hook, which "
                    "only the running daemon runs, so nothing was requeued",
                    hint=down.hint, then="requeue again") from down
            result = offline.outbox_requeue(paths_for(mesh).outbox_db, row_id, new_client_id,
                                            patch)
    except TidemeshError as exc:
        fail(exc, as_json)
    if as_json:
        emit_json(result)
        return
    click.echo(f"row {result['aborted_row_id']} aborted; queued as {result['new_row_id']} "
               f"with client_message_id {result['new_client_message_id']}")


def prune_command(which: Literal["outbox", "inbox"]) -> click.Command:
    """``outbox prune`` and ``inbox prune``: retention now, over IPC or on the files."""
    @click.command("prune", help=f"Delete what {which} retention lets go now (docs/daemon.md, "
                                  "'What the daemon keeps'); works with the daemon down too.")
    @mesh_option
    @click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
    @json_option
    def prune_cmd(mesh: str, dry_run: bool, as_json: bool) -> None:
        try:
            try:
                result: Mapping[str, Any] = client_for(mesh).prune(which, dry_run)
            except DaemonNotRunning:
                paths = paths_for(mesh)
                settings = daemon_main.prepare(mesh, os.environ, {}).retention
                result = offline.prune(paths.outbox_db, paths.inbox_db, settings, which, dry_run)
        except TidemeshError as exc:
            fail(exc, as_json)
        if as_json:
            emit_json(result)
            return
        if "skipped" in result:
            click.echo(f"nothing pruned: {result['skipped']}")
            return
        verb = "would delete" if dry_run else "deleted"
        extra = (f" and {result['events_deleted']} events" if "events_deleted" in result
                 else "")
        click.echo(f"{which}: {verb} {result['deleted']} rows{extra}")

    return prune_cmd


outbox_group.add_command(prune_command("outbox"))


@click.group("inbox")
def inbox_group() -> None:
    """Maintain the daemon's inbox and event log (works with the daemon down too)."""


inbox_group.add_command(prune_command("inbox"))
