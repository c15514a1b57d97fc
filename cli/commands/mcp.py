"""``tidemesh mcp``: serve the mesh to an AI coding session over MCP on stdio."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

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


@mcp_group.command("install")
@mesh_option
@click.option("--client", "client_kind", type=click.Choice(["claude-code", "codex", "json"]),
              required=True, help="Which client's configuration.")
@click.option("--session", "session_name", default=None, metavar="NAME",
              help="Pin the session name [default: the folder the client starts in].")
@click.option("--print", "print_only", is_flag=True,
              help="claude-code: print the configuration instead of writing .mcp.json.")
def install_cmd(mesh: str, client_kind: str, session_name: str | None,
                print_only: bool) -> None:
    """Write or print the MCP configuration that starts `tidemesh mcp` in a client.

    claude-code writes the project's .mcp.json (other servers kept) and prints the
    equivalent `claude mcp add` line; codex prints the config.toml table; json prints the
    generic mcpServers document.
    """
    from tidemesh.agent import install

    session = _session(session_name) if session_name else None
    if client_kind == "codex":
        click.echo("# add to ~/.codex/config.toml\n" + install.codex_toml(mesh, session), nl=False)
    elif client_kind == "json" or print_only:
        click.echo(json.dumps(install.json_config(mesh, session), indent=2))
    else:
        target = Path.cwd() / ".mcp.json"
        try:
            install.merge_json(target, mesh, session)
        except (ValueError, OSError) as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(f"wrote {target.name} (server {install.SERVER!r}); the same as:\n"
                   f"  {install.claude_add_line(mesh, session)}")
