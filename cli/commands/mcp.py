"""``tidemesh mcp``: serve the mesh to an AI coding session over MCP on stdio."""

from __future__ import annotations

import asyncio
import os

import click

from tidemesh.cli.commands.common import mesh_option
from tidemesh.core.agents import check_session_name, session_name_for
from tidemesh.core.errors import InvalidRequest


def _session(value: str | None) -> str:
    try:
        return check_session_name(value) if value else session_name_for(os.getcwd())
    except InvalidRequest as exc:
        raise click.BadParameter(exc.message, param_hint="--session") from None


@click.group("mcp", invoke_without_command=True)
@mesh_option
@click.option("--session", "session_name", default=None, metavar="NAME",
              help="This session's name, its address under the member "
                   "[default: the working folder's name].")
@click.option("--no-receipts", is_flag=True,
              help="Send no delivered/read receipts for what this session is shown.")
@click.pass_context
def mcp_group(ctx: click.Context, mesh: str, session_name: str | None,
              no_receipts: bool) -> None:
    """Run the MCP server on stdio (the client starts it; needs the [mcp] extra)."""
    if ctx.invoked_subcommand is not None:
        return
    try:
        from tidemesh.agent.server import serve
    except ModuleNotFoundError as exc:
        if exc.name is None or not exc.name.startswith("mcp"):
            raise
        raise click.ClickException(
            "tidemesh mcp needs the MCP SDK: pip install 'tidemesh[mcp]'") from None
    asyncio.run(serve(mesh, _session(session_name), receipts=not no_receipts))
