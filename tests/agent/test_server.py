"""``tidemesh mcp`` through the official MCP SDK's client, over stdio, with real daemons."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
from pathlib import Path
from typing import Any

from tests.agent.harness import mcp_session
from tests.daemon.harness import run_cli
from tests.e2e.harness import Mesh, connected, pubkey, wait_for


async def test_two_sessions_exchange_a_session_dm_with_push_and_receipts(
        any_mesh: Mesh, short_tmp: Path) -> None:
    a, b = any_mesh.add("a", short_tmp), any_mesh.add("b", short_tmp)
    await wait_for(lambda: connected(a))
    await wait_for(lambda: connected(b))
    async with mcp_session(a, "alpha") as sa, mcp_session(b, "beta") as sb:
        [me] = [p for p in (await sb.ok("mesh_peers"))["peers"] if p["self"]]
        assert me["name"] == "b" and f"session:{pubkey(b)}/beta" in me["sessions"]
        tools = {t.name for t in (await sa.client.list_tools()).tools}
        assert {"mesh_send", "mesh_inbox", "mesh_wait", "mesh_receipts"} <= tools
        sent = await sa.ok("mesh_send", to="b/beta", body="hello beta",
                           idempotency_key="k1")
        assert sent["to"] == f"session:{pubkey(b)}/beta"
        again = await sa.ok("mesh_send", to="b/beta", body="hello beta",
                            idempotency_key="k1")
        assert again["outbox_id"] == sent["outbox_id"]
        [note] = await sb.wait_pushed(1)
        assert note.content == "hello beta"
        assert note.meta["sender_key"] == pubkey(a)
        assert note.meta["from_session"] == f"session:{pubkey(a)}/alpha"
        peek = await sb.ok("mesh_inbox", peek=True)
        assert [m["body"] for m in peek["messages"]] == ["hello beta"]
        read = await sb.ok("mesh_inbox")
        assert read["marked_read_up_to"] is not None
        assert (await sb.ok("mesh_inbox"))["messages"] == []

        async def state() -> str:
            [r] = (await sa.ok("mesh_receipts"))["receipts"]
            return str(r["state"])
        await wait_for(lambda: _is(state(), "read"))
        # The SDK says the same, per recipient session.
        [view] = a.client.receipts()
        assert view["recipients"] == {f"{pubkey(b)}/beta": "read"}
    # Only one message went: the retried send was the same send.
    assert len([n for n in sb.pushed if n.content == "hello beta"]) == 1


async def _is(value: object, want: str) -> bool:
    return await value == want  # type: ignore[misc]


async def test_a_session_away_gets_what_came_once_when_it_returns(
        mesh: Mesh, short_tmp: Path) -> None:
    a, b = mesh.add("a", short_tmp), mesh.add("b", short_tmp)
    await wait_for(lambda: connected(a))
    await wait_for(lambda: connected(b))
    async with mcp_session(a, "alpha") as sa:
        await sa.ok("mesh_send", to=f"session:{pubkey(b)}/beta", body="while away")
        await sa.ok("mesh_send", to=f"session:{pubkey(b)}/other", body="not for beta")
        await wait_for(lambda: _outbox_done(a))
    async with mcp_session(b, "beta") as sb:
        [note] = await sb.wait_pushed(1)
        assert note.content == "while away"
        waited = await sb.ok("mesh_wait", timeout_s=5)
        assert [m["body"] for m in waited["messages"]] == ["while away"]
    async with mcp_session(b, "beta") as sb:
        got = await sb.ok("mesh_wait", timeout_s=1)
        assert [m["body"] for m in got["messages"]] == ["while away"]
        assert sb.pushed == []   # pushed once, in the first run


def _outbox_done(d: object) -> bool:
    rows = d.outbox_rows()  # type: ignore[attr-defined]
    return bool(rows) and all(r["status"] == "done" for r in rows)


async def test_bad_input_and_a_stopped_daemon_are_tool_errors(
        mesh: Mesh, short_tmp: Path) -> None:
    a = mesh.add("a", short_tmp)
    await wait_for(lambda: connected(a))
    async with mcp_session(a, "alpha") as sa:
        failed, body = await sa.call("mesh_send", to=5, body="x")
        assert failed and body["error"]["code"] == "invalid_request"
        failed, body = await sa.call("mesh_send", to="topic:ops", body="x" * 300_000)
        assert failed and "body" in body["error"]["message"]
        failed, body = await sa.call("mesh_send", to="nobody-here", body="x")
        assert failed and body["error"]["code"] == "not_found"
        failed, body = await sa.call("mesh_send", to="session:zz/beta", body="x")
        assert failed and body["error"]["code"] == "invalid_request"
        assert a.stop() == 0
        failed, body = await sa.call("mesh_peers")
        assert failed and body["error"]["code"] == "daemon_not_running"
        # The server is still there.
        assert {t.name for t in (await sa.client.list_tools()).tools}


async def test_a_session_registers_and_session_list_and_rm_show_and_forget_it(
        mesh: Mesh, short_tmp: Path) -> None:
    a, b = mesh.add("a", short_tmp), mesh.add("b", short_tmp)
    await wait_for(lambda: connected(a))
    await wait_for(lambda: connected(b))
    async with mcp_session(a, "alpha") as sa, mcp_session(b, "beta") as sb:
        await sb.ok("mesh_send", to="a/alpha", body="to alpha")
        await sa.wait_pushed(1)
        await sa.ok("mesh_inbox")
    listed = json.loads(run_cli(a.home, "session", "list", "--mesh", "m", "--json").stdout)
    [alpha] = listed["sessions"]
    assert alpha["name"] == "alpha" and alpha["pushed_up_to"] == alpha["read_up_to"] > 0
    assert run_cli(a.home, "session", "rm", "--mesh", "m", "alpha").returncode == 0
    assert a.client.sessions() == []
    gone = run_cli(a.home, "session", "rm", "--mesh", "m", "alpha", "--json")
    assert gone.returncode != 0 and "no session" in gone.stdout


def _server_pid(session: str) -> int:
    """The pid of the `tidemesh mcp` this test started for ``session`` (a unique name)."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"mcp" in argv and session.encode() in argv:
                return int(proc.name)
    raise AssertionError(f"no tidemesh mcp for {session}")


async def test_a_server_killed_mid_push_loses_nothing_and_shows_nothing_twice(
        mesh: Mesh, short_tmp: Path) -> None:
    a, b = mesh.add("a", short_tmp), mesh.add("b", short_tmp)
    await wait_for(lambda: connected(a))
    await wait_for(lambda: connected(b))
    name = f"beta-{secrets.token_hex(4)}"
    bodies = [f"m{i}" for i in range(30)]
    async with mcp_session(a, "alpha") as sa:
        for body in bodies:
            await sa.ok("mesh_send", to=f"session:{pubkey(b)}/{name}", body=body,
                        idempotency_key=body)
        await wait_for(lambda: _outbox_done(a))
    first: list[Any] = []
    with contextlib.suppress(Exception):
        async with mcp_session(b, name) as sb:
            first.append(sb)
            await sb.wait_pushed(1)
            os.kill(_server_pid(name), signal.SIGKILL)
            await asyncio.sleep(0.5)   # what the pipe still held is read before its end
    # Read after the session closed: a push written before the kill is in the pipe still.
    seen = [n.content for n in first[0].pushed]
    async with mcp_session(b, name) as sb:
        waited = await sb.ok("mesh_inbox", limit=200)
        assert [m["body"] for m in waited["messages"]] == bodies   # each once, in order
        await wait_for(lambda: set(seen) | {n.content for n in sb.pushed} == set(bodies))
