"""``/v1/sessions``: the agent sessions this daemon keeps messages for (docs/agents.md).

A session is the pair of named consumers its MCP server reads with; registering makes
them (so the daemon holds the session's entries from then on), removing drops them.
"""

from __future__ import annotations

from aiohttp import web

from tidemesh.core.errors import NotFound
from tidemesh.daemon.api.keys import INBOX
from tidemesh.daemon.api.validation import checked, parse_json


async def post_session_register(request: web.Request) -> web.Response:
    data = checked("session_request.schema.json", parse_json(await request.read()))
    return web.json_response(await request.app[INBOX].session_register(data["name"]))


async def get_sessions(request: web.Request) -> web.Response:
    return web.json_response({"sessions": await request.app[INBOX].sessions()})


async def post_session_remove(request: web.Request) -> web.Response:
    data = checked("session_request.schema.json", parse_json(await request.read()))
    if not await request.app[INBOX].session_remove(data["name"]):
        raise NotFound(f"no session {data['name']!r} on this daemon; "
                       "tidemesh session list shows them", field="name")
    return web.json_response({"name": data["name"], "removed": True})
