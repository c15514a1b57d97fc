"""``tidemesh daemon backup|restore``: a member's identity and configuration in one
passphrase-sealed file (docs/operations.md, "Backup and restore"), and ``rotate-token``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from tidemesh.cli.commands.common import client_for, json_option, mesh_option, paths_for
from tidemesh.cli.output import emit_json, fail, fields
from tidemesh.client import DaemonNotRunning
from tidemesh.core.errors import TidemeshError
from tidemesh.core.exitcodes import Exit
from tidemesh.daemon import admin

PASSPHRASE_ENV = "TIDEMESH_BACKUP_PASSPHRASE"  # noqa: S105 - a variable name

passphrase_file_option = click.option(
    "--passphrase-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
    help=f"Read the passphrase from this file's first line (else ${PASSPHRASE_ENV}, else a "
         "prompt).")


def _passphrase(file: Path | None, confirm: bool) -> bytes:
    if file is not None:
        try:
            lines = file.read_bytes().splitlines()
        except OSError as exc:
            fail(TidemeshError(f"cannot read the passphrase file {file}: {exc.strerror}"))
        return lines[0] if lines else b""
    if os.environ.get(PASSPHRASE_ENV):
        return os.environ[PASSPHRASE_ENV].encode()
    return str(click.prompt("Backup passphrase", hide_input=True, err=True,
                            confirmation_prompt=confirm)).encode()


@click.command("backup")
@mesh_option
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Write the sealed backup here (0600, replaced atomically).")
@passphrase_file_option
@json_option
def backup(mesh: str, out: Path, passphrase_file: Path | None, as_json: bool) -> None:
    """Seal this member's keypair, key archive, host fingerprint, mesh and daemon
    configuration, hooks folder and subscriptions with a passphrase. Never the outbox or
    inbox."""
    paths = paths_for(mesh)
    secret = _passphrase(passphrase_file, confirm=True)
    try:
        data, summary = admin.backup.make(paths, mesh, secret)
        admin.backup.write_private_bytes(out, data)
    except TidemeshError as exc:
        fail(exc)
    report = {**summary, "out": str(out), "bytes": len(data)}
    if as_json:
        emit_json(report)
        return
    click.echo(f"backup of mesh {mesh} written to {out} ({len(data)} bytes); it holds "
               f"{', '.join(summary['holds'])}; not the outbox or inbox")


@click.command("restore")
@click.argument("file", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--mesh", default=None,
              help="Restore under this local mesh name [default: the one in the backup].")
@passphrase_file_option
@json_option
def restore(file: Path, mesh: str | None, passphrase_file: Path | None, as_json: bool) -> None:
    """Restore a backup into this home: the same member, this host adopted (as accept-host
    does), a new local token. Refuses where the mesh already has an identity."""
    try:
        data = file.read_bytes()
    except OSError as exc:
        fail(TidemeshError(f"cannot read {file}: {exc.strerror}"))
    secret = _passphrase(passphrase_file, confirm=False)
    try:
        contents = admin.backup.unseal(data, secret)
        name = mesh or admin.backup.mesh_of(contents)
        paths = paths_for(name)
        if admin.is_held(paths.lock_file):
            fail(TidemeshError(f"a daemon runs for mesh {name}; stop it first"))
        done = admin.backup.restore(contents, paths, name, admin.current_host_fingerprint())
    except TidemeshError as exc:
        fail(exc)
    report = {"mesh": done.mesh, "member_pubkey": done.member_pubkey, "written": done.written,
              "host_adopted": done.host_adopted, "subscriptions": done.subscriptions,
              "new_token": True}
    if as_json:
        emit_json(report)
        return
    fields(report)
    click.echo(f"restored; start it with `tidemesh daemon up --mesh {done.mesh}`")


@click.command("rotate-token")
@mesh_option
@json_option
def rotate_token(mesh: str, as_json: bool) -> None:
    """Write a new local bearer token; a running daemon still accepts the old one for
    ipc.token_grace_s (60 s), so programs can re-read the token file."""
    paths = paths_for(mesh)
    try:
        report = client_for(mesh, timeout=5.0).rotate_token()
        report["daemon_running"] = True
    except DaemonNotRunning:
        if admin.is_held(paths.lock_file):
            fail(TidemeshError(f"the daemon of mesh {mesh} holds its lock but does not answer; "
                               "nothing was changed"))
        if not paths.runtime_dir.exists():
            fail(TidemeshError(f"no daemon files for mesh {mesh} at {paths.runtime_dir}"))
        # Stopped: nobody holds the old token, so it simply stops existing.
        admin.token_rotation.write_token(paths.token_file, admin.token_rotation.new_token())
        report = {"rotated": True, "token_file": str(paths.token_file),
                  "previous_valid_s": 0, "daemon_running": False}
    except TidemeshError as exc:
        fail(exc)
    if as_json:
        emit_json(report)
        sys.exit(int(Exit.OK))
    grace = report["previous_valid_s"]
    click.echo(f"new local token in {report['token_file']}"
               + (f"; the previous one is accepted for {grace:g} s more" if grace else ""))
