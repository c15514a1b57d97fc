"""``tidemesh daemon join``: redeem an invite at the broker and save this host's binding."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import click

from tidemesh.cli.commands.common import json_option, paths_for
from tidemesh.cli.output import emit_json, fail
from tidemesh.cli.terminal import printable
from tidemesh.core import invite as invites
from tidemesh.core.errors import Conflict, TidemeshError
from tidemesh.core.exitcodes import Exit
from tidemesh.core.names import short
from tidemesh.core.paths import DaemonPaths
from tidemesh.daemon import admin as admin_daemon
from tidemesh.daemon.admin import AlreadyRunning


@click.command("join")
@click.argument("invite")
@click.option("--mesh", default=None, help="Local mesh name; default: the invite's mesh.")
@click.option("--name", "display_name", default=None, help="How other members see this host.")
@click.option("--broker-url", "broker_urls", multiple=True,
              help="Override the broker addresses in the invite (repeat for several).")
@click.option("--move-aside", is_flag=True,
              help="Join with a new key, first moving this local name's key, outbox and inbox "
                   "into aside-TIME/ of its data folder: to re-bind a name joined to another "
                   "mesh, or to come back after this key was revoked. Says where.")
@click.option("--remint", is_flag=True,
              help="Give this host a new member key of the same mesh in one step (a cloned "
                   "image): joins with a new key and moves the old key, outbox and inbox "
                   "aside as --move-aside does. The old member is left to the host it was "
                   "copied from.")
@click.option("--persistent/--ephemeral", "persistent", default=None,
              help="Keep the key in the data folder (persistent), or in the runtime folder "
                   "for one daemon run (ephemeral); default: ephemeral in CI, else "
                   "persistent (setting identity.persistent). Give `daemon up` the same.")
@json_option
def join_cmd(invite: str, mesh: str | None, display_name: str | None,
             broker_urls: tuple[str, ...], move_aside: bool, remint: bool,
             persistent: bool | None, as_json: bool) -> None:
    """Join a mesh: create this host's key, register it with the broker, save the config.

    A local mesh name stays bound to the mesh it was joined to: an invite for another mesh
    under that name is refused (exit 2) unless --move-aside. A revoked key exits 12.

    In CI the key is ephemeral: the daemon that starts next runs with it, leaves the mesh
    when it stops and removes it (docs/operations.md, CI jobs).

    With --json, prints {mesh, broker_mesh, mesh_id, member_pubkey, broker_urls, joined_at,
    config, moved_aside, ephemeral, name_taken_by}: mesh is the local name that --mesh takes;
    name_taken_by lists the keys of other members already going by --name (also a warning
    on stderr without --json)."""
    try:
        parsed = invites.decode(invite)
        local = mesh or parsed.mesh
        paths = paths_for(local)
        ephemeral = _ephemeral_join(paths, persistent)
        joined = asyncio.run(admin_daemon.join(invite, paths, local, display_name, broker_urls,
                                               move_aside, ephemeral=ephemeral, remint=remint))
    except TidemeshError as exc:
        fail(exc, as_json)
    except AlreadyRunning as exc:
        fail(Conflict(f"{exc}; stop it first (`tidemesh daemon down --mesh {local}`): "
                      "--move-aside, --remint and an ephemeral join change no files under a "
                      "running daemon"),
             as_json, Exit.ALREADY_RUNNING)
    except admin_daemon.LinkError as exc:
        code = Exit.REJECTED if not exc.retryable else Exit.FAILURE
        if as_json:
            # The broker's close reason (invite_used_up, member_revoked …) is the code.
            emit_json({"error": {"code": getattr(exc, "reason", "join_failed"), "message": str(exc),
                                 "retryable": exc.retryable}})
        else:
            click.echo(f"error: {exc}", err=True)
        sys.exit(int(code))
    config = joined.config
    _tell_running_daemon(paths, local, config.broker_urls)
    if as_json:
        # "mesh" is the local name later commands take with --mesh; the broker's may differ.
        emit_json({"mesh": local, "broker_mesh": config.mesh,
                   "mesh_id": config.mesh_id, "member_pubkey": config.member_pubkey,
                   "broker_urls": list(config.broker_urls),
                   "joined_at": config.joined_at, "config": str(paths.mesh_file),
                   "moved_aside": None if joined.moved_aside is None
                   else str(joined.moved_aside), "ephemeral": ephemeral,
                   "name_taken_by": list(joined.name_taken_by)})
        return
    if joined.moved_aside is not None:
        click.echo(f"moved the old key, outbox and inbox of {local!r} to {joined.moved_aside}")
    if ephemeral:
        click.echo(f"ephemeral key in {paths.ephemeral_keypair}: the next daemon runs with "
                   "it, leaves the mesh when it stops and removes it")
    click.echo(f"joined mesh {config.mesh} as {config.member_pubkey}\n"
               f"config saved to {paths.mesh_file}")
    if joined.name_taken_by:
        others = ", ".join(short(k) + "…" for k in joined.name_taken_by)
        click.echo(printable(f"warning: the display name {display_name!r} is taken in mesh "
                             f"{config.mesh} by another key ({others}); members see a key "
                             "prefix beside it to tell you apart"), err=True)


def _tell_running_daemon(paths: DaemonPaths, mesh: str, urls: tuple[str, ...]) -> None:
    """A join again while the mesh's daemon runs (new broker addresses in the invite): the
    daemon re-reads mesh.json on SIGHUP, so it dials them without a restart."""
    if not admin_daemon.is_held(paths.lock_file):
        return
    pid = admin_daemon.holder_pid(paths.lock_file)
    try:
        if pid is None:
            raise ProcessLookupError
        os.kill(pid, signal.SIGHUP)
    except OSError:
        click.echo(f"the daemon of mesh {mesh} runs but could not be told: restart it "
                   f"(`tidemesh daemon restart --mesh {mesh}`) to use {', '.join(urls)}",
                   err=True)
        return
    click.echo(f"the running daemon (pid {pid}) now dials {', '.join(urls)}", err=True)


def _ephemeral_join(paths: DaemonPaths, persistent: bool | None) -> bool:
    """Whether this join makes an ephemeral key (CI); an earlier one is retired first."""
    env = admin_daemon.ephemeral.environment_of(paths, os.environ, persistent)
    for warning in env.warnings:
        click.echo(f"warning: {warning}: a CI runner keeps this mesh identity after the job",
                   err=True)
    if env.persistent:
        return False
    if admin_daemon.is_held(paths.lock_file):
        raise AlreadyRunning(admin_daemon.holder_pid(paths.lock_file))
    asyncio.run(admin_daemon.ephemeral.retire_leftover(paths, "joined_again"))
    return True


__all__ = ["join_cmd"]
