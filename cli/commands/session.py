"""``tidemesh session list|rm``: the agent sessions the daemon keeps messages for."""

from __future__ import annotations

import click

from tidemesh.cli.commands.common import client_for, json_option, mesh_option
from tidemesh.cli.output import emit_json, fail, table
from tidemesh.core.errors import TidemeshError


@click.group("session")
def session_group() -> None:
    """Agent sessions (tidemesh mcp --session NAME) this daemon keeps messages for."""


@session_group.command("list")
@mesh_option
@json_option
def list_cmd(mesh: str, as_json: bool) -> None:
    """Each session, how far it was pushed and read (inbox seqs)."""
    try:
        found = client_for(mesh).sessions()
    except TidemeshError as exc:
        fail(exc, as_json)
    if as_json:
        emit_json({"sessions": found})
        return
    table(found, ["name", "pushed_up_to", "read_up_to"])


@session_group.command("rm")
@mesh_option
@click.argument("name")
@json_option
def rm_cmd(mesh: str, name: str, as_json: bool) -> None:
    """Forget a session: its entries are no longer held for it (its next start pushes
    everything the inbox still holds)."""
    try:
        result = client_for(mesh).session_remove(name)
    except TidemeshError as exc:
        fail(exc, as_json)
    if as_json:
        emit_json(result)
    else:
        click.echo(f"removed session {name}")
