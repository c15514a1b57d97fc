"""``tidemesh mcp install``: the MCP configuration of the clients people use, made here.

Claude Code reads a project's ``.mcp.json`` (``mcpServers``); Codex reads
``[mcp_servers.NAME]`` tables of its ``config.toml``; any other client takes the same JSON
shape as Claude Code. Building them is pure; ``merge_json`` writes a project file, keeping
every other server it names.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

SERVER = "tidemesh"


def command(mesh: str, session: str | None) -> list[str]:
    args = ["tidemesh", "mcp", "--mesh", mesh]
    return [*args, "--session", session] if session else args


def json_config(mesh: str, session: str | None) -> dict[str, Any]:
    cmd = command(mesh, session)
    return {"mcpServers": {SERVER: {"type": "stdio", "command": cmd[0], "args": cmd[1:]}}}


def claude_add_line(mesh: str, session: str | None) -> str:
    return shlex.join(["claude", "mcp", "add", "--scope", "project", SERVER, "--",
                       *command(mesh, session)])


def codex_toml(mesh: str, session: str | None) -> str:
    cmd = command(mesh, session)
    args = ", ".join(json.dumps(a) for a in cmd[1:])
    return f'[mcp_servers.{SERVER}]\ncommand = "{cmd[0]}"\nargs = [{args}]\n'


def merge_json(path: Path, mesh: str, session: str | None) -> dict[str, Any]:
    """``path`` (a project's ``.mcp.json``) with this server set, other servers kept."""
    doc: dict[str, Any] = json.loads(path.read_text("utf-8")) if path.exists() else {}
    if not isinstance(doc, dict) or not isinstance(doc.get("mcpServers", {}), dict):
        raise ValueError(f"{path} is not an MCP configuration (an object with mcpServers)")
    doc.setdefault("mcpServers", {}).update(json_config(mesh, session)["mcpServers"])
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n", "utf-8")
    tmp.replace(path)
    return doc
