"""``tidemesh daemon hooks list|test``: what the per-mesh hooks/ folder holds, and one hook
run by hand. Works on the folder's files; the daemon need not run."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import click

from tidemesh.cli.commands.common import json_option, mesh_option, paths_for
from tidemesh.cli.output import emit_json, fail, table
from tidemesh.core.errors import InvalidRequest, TidemeshError
from tidemesh.core.exitcodes import Exit
from tidemesh.daemon.admin import describe_hooks, dry_run_hook


@click.group("hooks")
def hooks_group() -> None:
    """List the hooks of a mesh's hooks/ folder, or run one by hand."""


@hooks_group.command("list")
@mesh_option
@json_option
def list_cmd(mesh: str, as_json: bool) -> None:
    """Every hook named by a file or a hooks.toml table, and whether it runs."""
    folder = paths_for(mesh).hooks_dir
    try:
        rows = describe_hooks(folder)
    except TidemeshError as exc:
        fail(exc, as_json)
    if as_json:
        emit_json({"folder": str(folder), "hooks": rows})
        return
    click.echo(f"hooks folder: {folder}")
    table([{**r, "timeout_s": f"{r['timeout_s']:g}"} if "timeout_s" in r else r for r in rows],
          ["name", "state", "timeout_s", "allow_reply", "network_policy"])
    if any(r["state"] == "not executable" for r in rows):
        click.echo("a hook runs only when its file is executable: chmod +x it", err=True)


def _event(path: Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidRequest(f"cannot read the event from {path}: {exc}", field="event") from exc
    if not isinstance(doc, dict):
        raise InvalidRequest("the event must be a JSON object", field="event")
    return doc


@hooks_group.command("test")
@mesh_option
@click.argument("name")
@click.option("--event", "event_file", type=click.Path(dir_okay=False, path_type=Path),
              help="JSON event to feed the hook (default: a sample for its kind).")
@json_option
def test_cmd(mesh: str, name: str, event_file: Path | None, as_json: bool) -> None:
    """Run hook NAME once with an event, as the daemon would (no ledger, no reply token).
    Exits with the hook's exit code."""
    paths = paths_for(mesh)
    hook = paths.hooks_dir / name
    if not hook.exists():
        fail(InvalidRequest(f"no hook {name!r} in {paths.hooks_dir}", field="name"), as_json)
    if not os.access(hook, os.X_OK):
        # 126: what a shell exits with for a file it cannot execute.
        message = f"hook {hook} is not executable; chmod +x {hook} (the daemon skips it too)"
        if as_json:
            emit_json({"hook": name, "exit": None, "error": {"code": "hook_not_executable",
                                                             "message": message}})
        else:
            click.echo(f"error: {message}", err=True)
        raise SystemExit(126)
    try:
        stdin, result = asyncio.run(
            dry_run_hook(paths.hooks_dir, name, mesh, paths.socket, _event(event_file)))
    except TidemeshError as exc:
        fail(exc, as_json)
    view = {"hook": name, "exit": result.exit_code, "timed_out": result.timed_out,
            "duration_ms": round(result.duration_s * 1000, 1), "stdin_bytes": len(stdin),
            "stdout_bytes": result.stdout_bytes, "stdout_truncated": result.stdout_cut,
            "isolated": result.isolated, "error": result.error,
            "stdout": result.stdout.decode(errors="replace")}
    if as_json:
        emit_json(view)
    else:
        click.echo(view.pop("stdout"), nl=False)
        click.echo(" ".join(f"{k}={v}" for k, v in view.items() if v is not None), err=True)
    raise SystemExit(Exit.FAILURE if result.exit_code is None else result.exit_code)
