"""An MCP session: ``tidemesh mcp`` started by the SDK's stdio client, its channel
notifications collected as the client receives them."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from mcp.client.extension import NotificationBinding
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from pydantic import BaseModel

from tests.daemon.harness import RunningDaemon, daemon_env


class Channel(BaseModel):
    """``notifications/claude/channel`` params; meta strings only, as the client demands."""

    content: str
    meta: dict[str, str]


@dataclass
class McpSession:
    client: ClientSession
    pushed: list[Channel] = field(default_factory=list)

    async def call(self, tool: str, **args: Any) -> tuple[bool, dict[str, Any]]:
        res = await self.client.call_tool(tool, args)
        body = res.structured_content
        if body is None:
            body = json.loads(res.content[0].text)  # type: ignore[union-attr]
        return bool(res.is_error), body

    async def ok(self, tool: str, **args: Any) -> dict[str, Any]:
        failed, body = await self.call(tool, **args)
        assert not failed, body
        return body

    async def wait_pushed(self, n: int, timeout: float = 30.0) -> list[Channel]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(self.pushed) < n:
            assert loop.time() < deadline, f"{len(self.pushed)} of {n} pushed: {self.pushed}"
            await asyncio.sleep(0.05)
        return self.pushed


@asynccontextmanager
async def mcp_session(d: RunningDaemon, name: str, *extra: str) -> AsyncIterator[McpSession]:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "tidemesh", "mcp", "--mesh", d.mesh,
                                      "--session", name, *extra],
        env=daemon_env(d.home))
    pushed: list[Channel] = []

    async def on_channel(p: Channel) -> None:
        pushed.append(p)

    binding = NotificationBinding(method="notifications/claude/channel", params_type=Channel,
                                  handler=on_channel)
    with open(d.home / f"mcp-{name}.err", "a") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(
                read, write, notification_bindings=[binding]) as client:
            await client.initialize()
            yield McpSession(client, pushed)
