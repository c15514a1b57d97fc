"""``tidemesh daemon rotate-keypair`` and ``daemon archive-cleanup`` (docs/operations.md, "A
key leaked: rotate it"): move the member to a new key, and expire rotated-out keys."""

from __future__ import annotations

import contextlib
import os
import sys
import time

import click

from tidemesh.cli.commands.common import json_option, mesh_option, paths_for
from tidemesh.cli.commands.daemon import _start_detached
from tidemesh.cli.commands.departure import _stopped
from tidemesh.cli.output import emit_json, fail, fields
from tidemesh.core.errors import TidemeshError
from tidemesh.core.exitcodes import Exit
from tidemesh.core.settings import ConfigError
from tidemesh.daemon import admin


def _grace_days(mesh: str) -> int:
    from tidemesh.daemon import main as daemon_main

    try:
        return int(daemon_main.prepare(mesh, os.environ, {}).settings
                   .crypto_key_grace_period_days)
    except ConfigError as exc:
        fail(exc)


@click.command("rotate-keypair")
@mesh_option
@json_option
def rotate_keypair(mesh: str, as_json: bool) -> None:
    """Move this member to a new key: the broker learns it in one step signed by the old and
    the new key and rotates the old one out (its hellos are refused); subscriptions, queues
    and undelivered messages follow. The old key's X25519 half stays in keypair-archive.json
    for [crypto] key_grace_period_days, so DMs sealed to it still open. Stops the daemon
    first and starts it again; a rotation a crash left unfinished is finished."""
    paths = paths_for(mesh)
    grace = _grace_days(mesh)
    running = admin.is_held(paths.lock_file)
    _stopped(mesh)
    try:
        report = admin.key_rotation.rotate(paths, grace)
    except TidemeshError as exc:
        fail(exc)
    report["grace_period_days"] = grace
    report["restarted"] = False
    if running:
        with contextlib.redirect_stdout(sys.stderr):
            report["restarted"] = _start_detached(mesh, False, None, None, [],
                                                  as_json) == Exit.OK
    if as_json:
        emit_json(report)
        return
    click.echo(f"mesh {mesh}: member key rotated from {report['old_pubkey'][:16]}… to "
               f"{report['new_pubkey'][:16]}…"
               + (" (a rotation left unfinished was finished)" if report["resumed"] else ""))
    if report.get("broker"):
        fields(report["broker"])
    click.echo(f"the old key's DMs open for {grace} days more (keypair-archive.json)"
               + ("; the daemon was started again" if report["restarted"] else ""))


@click.command("archive-cleanup")
@mesh_option
@json_option
def archive_cleanup(mesh: str, as_json: bool) -> None:
    """Delete the rotated-out keys of keypair-archive.json whose grace period ended (the
    daemon also does it daily). DMs sealed to them can no longer be opened."""
    path = paths_for(mesh).keypair_archive
    ka = admin.keyarchive
    gone = ka.cleanup(path, int(time.time() * 1000))
    report = {"mesh": mesh, "expired": ka.summary(gone),
              "kept": ka.summary(ka.load(path).keys)}
    if as_json:
        emit_json(report)
        return
    click.echo(f"expired {len(gone)} archived keys; {len(report['kept'])} kept")
