"""``tidemesh file share|get|list``: shared files, over IPC through ``tidemesh.client``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from tidemesh.cli.commands.common import client_for, json_option, mesh_option
from tidemesh.cli.output import emit_json, fail, fields, table, when
from tidemesh.client.errors import DaemonNotRunning
from tidemesh.core.errors import TidemeshError
from tidemesh.core.files import safe_name

_RESUME_SHARE = ("run the same `tidemesh file share` again to resume it from the chunks "
                 "already uploaded")


@click.group("file")
def file_group() -> None:
    """Share files with members (up to the broker's files.max_bytes, streamed in chunks,
    sealed end to end for a DM) and fetch the ones shared with you."""


@file_group.command("share")
@mesh_option
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--to", "to", required=True, metavar="DEST",
              help="topic:NAME, dm:MEMBER or queue:NAME, as for `tidemesh send`.")
@click.option("--message", default=None, help="The announcement's text (default: the name).")
@click.option("--persistent", is_flag=True,
              help="Keep it at the broker past files.retention_days.")
@json_option
def share_cmd(mesh: str, path: Path, to: str, message: str | None, persistent: bool,
              as_json: bool) -> None:
    """Upload PATH and announce it to DEST. Run it again after a cut to resume: the same file
    to the same DEST is the same share, announced once."""
    try:
        out = client_for(mesh).file_share(path, to, message=message, persistent=persistent)
    except DaemonNotRunning as exc:
        # A cut share is not lost: the broker keeps the chunks, and the same share resumes.
        fail(DaemonNotRunning(exc.reason, hint=exc.hint, then=_RESUME_SHARE), as_json)
    except TidemeshError as exc:
        fail(exc, as_json)
    if as_json:
        emit_json(out)
        return
    f = out["file"]
    fields({"id": f["id"], "name": f["name"], "size": f["size"], "sha256": f["sha256"],
            "sealed": f["sealed"], "persistent": f["persistent"],
            "resumed_from": f"{out['resumed_from']} of {f['chunks']} chunks",
            "announcement": out["announcement"]["status"]})


@file_group.command("get")
@mesh_option
@click.argument("file_id", metavar="ID")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to write it (default: its announced name, in this folder).")
@json_option
def get_cmd(mesh: str, file_id: str, out: Path | None, as_json: bool) -> None:
    """Fetch file ID, verified against its SHA-256 before it is written. Run it again after a
    cut to resume with the chunks already written."""
    client = client_for(mesh)
    try:
        if out is None:
            known = {f["id"]: f for f in client.file_list(1000)["files"]}
            name = known[file_id]["name"] if file_id in known else file_id
            out = Path(safe_name(name))
        got = client.file_get(file_id, out)
    except TidemeshError as exc:
        fail(exc, as_json)
    if as_json:
        emit_json(got)
        return
    fields({"path": got["path"], "size": got["file"]["size"],
            "sha256": got["file"]["sha256"], "resumed_from": got["resumed_from"]})


@file_group.command("list")
@mesh_option
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True)
@json_option
def list_cmd(mesh: str, limit: int, as_json: bool) -> None:
    """Files you shared and files shared with you, newest first."""
    try:
        data: dict[str, Any] = client_for(mesh).file_list(limit)
    except TidemeshError as exc:
        fail(exc, as_json)
    if as_json:
        emit_json(data)
        return
    rows = [{"id": f["id"], "direction": f["direction"], "name": f["name"], "size": f["size"],
             "peer": f["to"]["kind"] + ":" + f["to"]["ref"][:16] if f["direction"] == "shared"
             else f["from"][:16], "sealed": f["sealed"], "at": when(f["created_at"])}
            for f in data["files"]]
    table(rows, ["id", "direction", "name", "size", "peer", "sealed", "at"])
