"""``tidemesh broker up|migrate|mesh|invite|member|topic`` (``daemon join`` is in join.py).

Operator commands talk to the broker's store directly (the cold path); they share the
broker's settings (``--store`` > ``TIDEMESH_BROKER_STORE`` > broker.toml > the store of the
broker running, else last run, from this home > embedded SQLite).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click

from tidemesh.broker import admin
from tidemesh.broker.admin import (
    SQLITE_MIGRATIONS,
    BrokerSettings,
    SchemaBehind,
    SchemaTooNew,
    Store,
    store_source,
)
from tidemesh.cli.commands.common import json_option
from tidemesh.cli.lazy import LazyGroup
from tidemesh.cli.output import emit_json, fail, readable, table
from tidemesh.core import invite as invites
from tidemesh.core.errors import InvalidRequest, NotFound, TidemeshError

T = TypeVar("T")


def _settings(flags: Mapping[str, Any]) -> BrokerSettings:
    try:
        return admin.settings_from(flags)
    except TidemeshError as exc:
        fail(exc)


def _operator_settings(store: str | None, creates: bool = False
                       ) -> tuple[BrokerSettings, admin.running.RunningBroker | None]:
    """The broker's settings, with the store a command acts on when none is named: the
    running broker's, else the one it last ran on, else the embedded one (which only
    ``creates`` may make); stderr says which, so a wrong guess shows. Also the broker whose
    store it is, when chosen through one."""
    settings = _settings({"broker.store": store})
    try:
        chosen = admin.running.operator_store(settings.broker_store, os.environ, creates)
    except TidemeshError as exc:
        fail(exc)
    if chosen.note is not None:
        click.echo(chosen.note, err=True)
    return dataclasses.replace(settings, broker_store=chosen.url), chosen.broker


def _run(store: str | None, fn: Callable[[Store], Awaitable[T]], creates: bool = False) -> T:
    settings, _ = _operator_settings(store, creates)
    try:
        return asyncio.run(admin.with_store(settings, fn))
    except TidemeshError as exc:
        fail(exc)
    except (OSError, SchemaTooNew, SchemaBehind) as exc:
        fail(TidemeshError(f"the broker store is unavailable: {exc}"))


def _checked_duration(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    """A malformed duration is a usage error (exit 2), found before any store is opened."""
    try:
        invites.parse_duration_ms(value)
    except InvalidRequest as exc:
        raise click.BadParameter(exc.message) from None
    return value


_STORE_FILE_HELP = ("A file of this user's, mode 0600, holding the store URL: keeps its "
                    "password out of the process list (as TIDEMESH_BROKER_STORE does).")


def _store_from(store: str | None, store_file: Path | None) -> str | None:
    """The store the command line names; a password on it is warned of (every local user
    reads command lines), a bad --store-file is exit 2."""
    try:
        url, exposed = store_source.chosen_store(store, store_file)
    except TidemeshError as exc:
        fail(exc)
    if exposed:
        click.echo(f"warning: {store_source.CMDLINE_WARNING}", err=True)
    return url


def store_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--store URL`` and ``--store-file PATH``, handed to the command as ``store``."""

    @functools.wraps(fn)
    def named(*args: Any, store: str | None, store_file: Path | None, **kwargs: Any) -> Any:
        return fn(*args, store=_store_from(store, store_file), **kwargs)

    named = click.option("--store-file", type=click.Path(dir_okay=False, path_type=Path),
                         default=None, metavar="PATH", help=_STORE_FILE_HELP)(named)
    return click.option("--store", default=None, metavar="URL",
                        help="sqlite:///PATH or postgresql://…; default: the store of the "
                             "broker running (else last run) from this home, else "
                             "embedded SQLite.")(named)


@click.group("broker", cls=LazyGroup, lazy_subcommands={
    "install-service": "tidemesh.cli.commands.service:broker_install",
    "uninstall-service": "tidemesh.cli.commands.service:broker_uninstall"})
def broker_group() -> None:
    """Run and administer the broker."""


@broker_group.command("up")
@click.option("--store", default=None, metavar="URL",
              help="sqlite:///PATH or postgresql://…; default: TIDEMESH_BROKER_STORE, else "
                   "broker.toml's, else embedded SQLite. A password here is in the process "
                   "list: use TIDEMESH_BROKER_STORE or --store-file.")
@click.option("--store-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="PATH", help=_STORE_FILE_HELP)
@click.option("--listen", default=None, metavar="HOST:PORT", help="Where to listen.")
@click.option("--public-url", default=None, help="ws(s):// address to print into invites.")
def up(store: str | None, store_file: Path | None, listen: str | None,
       public_url: str | None) -> None:
    """Serve the broker in the foreground (prints one JSON line when ready)."""
    # Only here: the server, the service and their loops are the slow part of a start, and
    # the operator commands below open the store without them.
    from tidemesh.broker import main as broker_main

    url = _store_from(store, store_file)
    broker_main.up(_settings({"broker.store": url, "broker.listen": listen,
                              "broker.public_url": public_url}),
                   password_on_command_line=store_file is None and url is not None
                   and store_source.has_password(url))


@broker_group.command("console-token")
def console_token_cmd() -> None:
    """Print the token of the broker's /console (made on first ask, kept 0600); open
    http://127.0.0.1:PORT/console?token=TOKEN once and the browser keeps it in a cookie."""
    click.echo(admin.console_token(os.environ))


@broker_group.command("migrate")
@store_option
def migrate_cmd(store: str | None) -> None:
    """Apply pending store migrations (forward only)."""

    async def fn(s: Store) -> None:
        return None  # opening the store applies them

    _run(store, fn, creates=True)
    click.echo(f"broker store is at schema version {len(SQLITE_MIGRATIONS.load())}")


@broker_group.group("mesh")
def mesh_group() -> None:
    """Meshes."""


@mesh_group.command("create")
@store_option
@json_option
@click.argument("name")
def mesh_create(store: str | None, as_json: bool, name: str) -> None:
    """Create a mesh. NAME is 1-64 letters, digits, '.', '_' or '-', starting with a letter
    or digit: a joining host makes it a folder name (exit 2 otherwise)."""
    mesh = _run(store, lambda s: s.create_mesh(name, admin.now_ms()), creates=True)
    if as_json:
        emit_json({"id": mesh.id, "name": mesh.name, "created_at": mesh.created_at})
    else:
        click.echo(f"mesh {mesh.name} created (id {mesh.id})")


@mesh_group.command("limits")
@store_option
@click.option("--mesh", required=True, help="Mesh name.")
@click.option("--rate", type=float, default=None,
              help="New sends per second per member; 0: no limit.")
@click.option("--burst", type=int, default=None,
              help="Sends a member may make at once after a quiet spell.")
@click.option("--clear", is_flag=True, help="Drop the override: use the broker's settings.")
def mesh_limits(store: str | None, mesh: str, rate: float | None, burst: int | None,
                clear: bool) -> None:
    """Set a mesh's own per-member send budget (overrides limits.member_rate and
    limits.member_burst; an option left out keeps the broker's). Running brokers on this
    store apply it within auth.recheck_s."""
    if clear == (rate is not None or burst is not None):
        fail(InvalidRequest("give --rate and/or --burst, or --clear"))
    found = _run(store, lambda s: admin.set_mesh_limits(s, mesh, rate, burst))
    click.echo(f"mesh {found.name}: member_rate {_or_broker(rate)}, "
               f"member_burst {_or_broker(burst)}")


def _or_broker(value: float | int | None) -> str:
    return "the broker's" if value is None else str(value)


@broker_group.group("invite")
def invite_group() -> None:
    """Invites."""


@invite_group.command("create")
@store_option
@click.option("--mesh", required=True, help="Mesh name.")
@click.option("--uses", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--expires", default="7d", show_default=True, callback=_checked_duration,
              help="30m, 12h, 7d, 2w.")
@click.option("--url", "urls", multiple=True, help="Broker address in the invite; repeat it "
              "for a mesh served by several brokers (daemons fail over in this order). "
              "Default broker.public_url, else the address the broker serves (recorded when "
              "it starts).")
@json_option
def invite_create(store: str | None, mesh: str, uses: int, expires: str, urls: tuple[str, ...],
                  as_json: bool) -> None:
    """Print an invite string for `tidemesh daemon join`.

    With --json, prints {invite, invite_id, mesh, expires_at}."""
    settings, broker = _operator_settings(store)
    # The broker whose store this is serves at the address it recorded; the store's own
    # record names whichever broker on it started last.
    served = broker.url if broker is not None and not settings.broker_public_url else None

    async def make(s: Store) -> admin.CreatedInvite:
        chosen = urls or (served or await admin.invite_url(
            s, settings.broker_public_url, admin.public_url(settings)),)
        return await admin.create_invite(s, mesh, chosen, uses, expires)

    created = _run(settings.broker_store, make)
    if as_json:
        emit_json({"invite": created.text, "invite_id": created.invite_id, "mesh": mesh,
                   "expires_at": created.expires_at})
    else:
        click.echo(created.text)


@broker_group.group("member")
def member_group() -> None:
    """Members."""


@member_group.command("list")
@store_option
@json_option
@click.option("--mesh", required=True, help="Mesh name.")
def member_list(store: str | None, as_json: bool, mesh: str) -> None:
    """List the members of a mesh (times in UTC; --json: epoch milliseconds)."""
    members = _run(store, lambda s: admin.list_members(s, mesh))
    rows = [{"pubkey": m.pubkey, "display_name": m.display_name, "joined_at": m.joined_at,
             "revoked_at": m.revoked_at} for m in members]
    if as_json:
        emit_json(rows)
    else:   # times a person reads (UTC); --json keeps epoch milliseconds
        table([{k: "-" if v is None else v for k, v in readable(r).items()} for r in rows],
              ["pubkey", "display_name", "joined_at", "revoked_at"])


@member_group.command("revoke")
@store_option
@click.option("--mesh", required=True, help="Mesh name.")
@click.argument("pubkey")
@json_option
def member_revoke(store: str | None, mesh: str, pubkey: str, as_json: bool) -> None:
    """Revoke a member: its connections close (4002) and it can never connect again.

    With --json, prints {mesh, pubkey, revoked: true}."""
    if not _run(store, lambda s: admin.revoke(s, mesh, pubkey)):
        fail(NotFound(f"no active member {pubkey} in mesh {mesh}"), as_json)
    if as_json:
        emit_json({"mesh": mesh, "pubkey": pubkey, "revoked": True})
    else:
        click.echo(f"revoked {pubkey}")


@broker_group.group("topic")
def topic_group() -> None:
    """Topics."""


@topic_group.command("create")
@store_option
@click.option("--mesh", required=True, help="Mesh name.")
@click.argument("name")
@json_option
def topic_create(store: str | None, mesh: str, name: str, as_json: bool) -> None:
    """Create a topic (members subscribe to it from their daemon).

    With --json, prints {mesh, topic}."""
    _run(store, lambda s: admin.create_topic(s, mesh, name))
    if as_json:
        emit_json({"mesh": mesh, "topic": name})
    else:
        click.echo(f"topic {name} exists in mesh {mesh}")


__all__ = ["broker_group"]
