"""``tidemesh daemon leave|reset|recover`` (docs/operations.md, "Leaving, resetting and
recovering"): leave the mesh at the broker and remove the local data; forget the mesh here
only; check and repair a stopped daemon's files."""

from __future__ import annotations

import contextlib
import os
import sys

import click

from tidemesh.cli.commands.common import json_option, mesh_option, paths_for
from tidemesh.cli.commands.daemon import _stop
from tidemesh.cli.output import emit_json, fail, fields
from tidemesh.core.errors import TidemeshError
from tidemesh.core.exitcodes import Exit
from tidemesh.daemon import admin

yes_option = click.option("--yes", is_flag=True, help="Do not ask for confirmation.")


def _stopped(mesh: str) -> None:
    """Stop the mesh's daemon if it runs (drained, as `daemon down`); fail if it will not.
    What the stop says goes to stderr, so that --json output stays one document."""
    paths = paths_for(mesh)
    if not admin.is_held(paths.lock_file):
        return
    with contextlib.redirect_stdout(sys.stderr):
        stopped = _stop(mesh, None)
    if stopped != Exit.OK:
        fail(TidemeshError(f"the daemon of mesh {mesh} did not stop; nothing was changed"))


@click.command("leave")
@mesh_option
@yes_option
@json_option
def leave(mesh: str, yes: bool, as_json: bool) -> None:
    """Leave the mesh: the broker removes this member (subscriptions, queue memberships,
    undelivered deliveries; its key can no longer connect), then this mesh's local files are
    deleted (outbox included: unsent messages are lost). Stops the daemon first."""
    paths = paths_for(mesh)
    if not yes:
        click.confirm(f"Leave mesh {mesh} for good and delete its local data (key, outbox, "
                      f"inbox, settings) under {paths.data_dir}?", abort=True, err=True)
    _stopped(mesh)
    try:
        left = admin.departure.leave(paths, mesh)
    except TidemeshError as exc:
        fail(exc)
    report = {"mesh": left.mesh, "member_pubkey": left.member_pubkey, "broker": left.broker,
              "removed": left.removed}
    if as_json:
        emit_json(report)
        return
    if left.broker.get("left"):
        click.echo(f"left mesh {mesh}: the broker removed this member "
                   f"({left.broker.get('subscriptions', 0)} subscriptions, "
                   f"{left.broker.get('queues', 0)} queues, "
                   f"{left.broker.get('deliveries', 0)} undelivered deliveries)")
    else:
        click.echo(f"the broker had already removed this member from mesh {mesh}")
    click.echo(f"removed {', '.join(left.removed)}")


@click.command("reset")
@mesh_option
@yes_option
@json_option
def reset(mesh: str, yes: bool, as_json: bool) -> None:
    """Forget the mesh on this host only: the key, the databases and mesh.json are moved
    aside (not deleted); the broker still knows the member. The name can be joined again.
    Stops the daemon first."""
    if not yes:
        click.confirm(f"Move mesh {mesh}'s data on this host aside (the broker is not told)?",
                      abort=True, err=True)
    _stopped(mesh)
    report = admin.departure.reset(paths_for(mesh), mesh, os.environ)
    if as_json:
        emit_json(report)
        return
    if not report["moved"]:
        click.echo(f"mesh {mesh} has no data on this host; nothing to move")
        return
    click.echo(f"moved {', '.join(report['moved'])} to {report['to']}; "
               f"`tidemesh daemon join INVITE --mesh {mesh}` joins again")


@click.command("recover")
@mesh_option
@click.option("--dry-run", is_flag=True, help="Print the check and the plan; change nothing.")
@json_option
def recover(mesh: str, dry_run: bool, as_json: bool) -> None:
    """Check outbox.db, inbox.db and the key files of a stopped daemon and repair what can
    be: a damaged inbox is moved aside (the broker refills it), a damaged outbox's readable
    rows are salvaged into a new one and the rest listed in a report. Exit 0 when all is well
    or repaired, 6 when something needs a backup, or with --dry-run when anything needs
    repair."""
    paths = paths_for(mesh)
    if admin.is_held(paths.lock_file):
        fail(TidemeshError(f"the daemon of mesh {mesh} runs; stop it first "
                           "(`tidemesh daemon down`)"))
    plan = admin.recovery.check(paths, mesh)
    out = plan.to_json()
    out["dry_run"] = dry_run
    if not dry_run and plan.actions:
        out["done"] = admin.recovery.carry_out(plan, paths, os.environ,
                                               admin.current_host_fingerprint())
    # A dry run that finds damage is not a success: a script checking a home must see it.
    code = Exit.UNHEALTHY if plan.unrepairable or (dry_run and plan.actions) else Exit.OK
    if as_json:
        emit_json(out)
        sys.exit(int(code))
    for f in plan.findings:
        line = f"{f.target}: {f.state}" + (f" ({f.detail})" if f.detail else "")
        click.echo(line + (f"\n  plan: {f.plan}" if f.action != "none" else ""))
    if not plan.actions:
        click.echo("nothing to repair")
    elif dry_run:
        click.echo("dry run: nothing was changed; run without --dry-run to carry out the plan")
    else:
        for d in out["done"]:
            fields(d)
    sys.exit(int(code))
