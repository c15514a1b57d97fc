"""``AsyncClient`` against real daemons: the same calls awaited, and its async iterators."""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from pathlib import Path

import pytest

from tests.client.conftest import Team, publish, wait_inbox
from tests.daemon.harness import RunningDaemon
from tidemesh.client import AsyncClient, DaemonNotRunning, Event, Notice
from tidemesh.core import errors


async def test_send_and_errors_over_the_socket_and_tcp(daemon: RunningDaemon) -> None:
    async with AsyncClient(daemon.paths.socket) as c:
        sent = await c.send({"to": "topic:ops", "body": "x"}, "job-1")
        assert sent["status"] == "queued"
        assert (await c.outbox_list())["counts"]["pending"] == 1
        with pytest.raises(errors.InvalidRequest):
            await c.send({"to": "nowhere:x", "body": "x"})
        with pytest.raises(errors.IdempotencyConflict):
            await c.send({"to": "topic:ops", "body": "y"}, "job-1")
    async with AsyncClient(port=daemon.port, token_file=daemon.paths.token_file) as tcp:
        assert (await tcp.outbox_inspect(sent["outbox_id"]))["client_message_id"] == "job-1"
        many = await tcp.send_many([{"to": "topic:ops", "body": "x", "client_message_id": "job-1"},
                                    {"to": "topic:ops", "body": "y", "client_message_id": "job-1"},
                                    {"to": "topic:ops", "body": "z"}])
        assert [r["status"] for r in many] == [202, 409, 202]
        assert many[0]["body"] == sent


async def test_no_daemon_is_daemon_not_running(short_tmp: Path) -> None:
    async with AsyncClient.for_mesh("team", environ={"TIDEMESH_HOME": str(short_tmp)}) as c:
        with pytest.raises(DaemonNotRunning) as caught:
            await c.version()
        assert caught.value.hint == "tidemesh daemon up --mesh team"
        async with aclosing(c.events(since=0)) as stream:
            with pytest.raises(DaemonNotRunning):
                await anext(stream)


@pytest.mark.slow
async def test_consume_acks_as_the_loop_moves_on(team: Team) -> None:
    await asyncio.to_thread(publish, team.bob, "a", "b")
    await asyncio.to_thread(wait_inbox, team.alice, 2)
    async with AsyncClient(team.alice.paths.socket) as alice:
        async with aclosing(alice.consume("worker", idle_timeout=0.5)) as entries:
            bodies = [e["body"] async for e in entries]
        assert bodies == ["a", "b"]
        page = await alice.inbox(consumer="worker")
        assert page["items"] == [] and page["cursor"] == 2


@pytest.mark.slow
async def test_events_follow_a_restarting_daemon_with_no_gap_and_no_repeat(team: Team) -> None:
    """The stream is read while the daemon restarts under it."""
    await asyncio.to_thread(publish, team.bob, "one")
    seen: list[Event | Notice] = []
    got = {n: asyncio.Event() for n in (1, 3)}

    async def follow() -> None:
        c = AsyncClient(team.alice.paths.socket)
        async with c, aclosing(c.events(since=0, idle_timeout=30)) as stream:
            async for item in stream:
                seen.append(item)
                n = sum(isinstance(i, Event) and i.type == "message" for i in seen)
                if n in got:
                    got[n].set()
                if n == 3:
                    return

    reader = asyncio.create_task(follow())
    await asyncio.wait_for(got[1].wait(), 30)
    await asyncio.to_thread(team.restart, team.alice, lambda: publish(team.bob, "two"))
    await asyncio.to_thread(publish, team.bob, "three")
    await asyncio.wait_for(reader, 60)
    events = [i for i in seen if isinstance(i, Event)]
    assert [e.id for e in events] == list(range(1, len(events) + 1))
    assert [e.data["body"] for e in events if e.type == "message"] == ["one", "two", "three"]


async def test_a_file_shared_and_got_through_the_async_client(team: Team,
                                                              short_tmp: Path) -> None:
    src = short_tmp / "notes.txt"
    src.write_bytes(b"minutes\n" * 5000)
    async with AsyncClient(team.bob.paths.socket) as bob, \
            AsyncClient(team.alice.paths.socket) as alice:
        await alice.membership("topic", "subscribe", "files", create=True)
        shared = await bob.file_share(src, "topic:files", message="notes")
        fid = shared["file"]["id"]
        for _ in range(300):
            if any(f["id"] == fid for f in (await alice.file_list())["files"]):
                break
            await asyncio.sleep(0.1)
        got = await alice.file_get(fid, short_tmp / "copy.txt")
        assert Path(got["path"]).read_bytes() == src.read_bytes()
        streamed = b"".join([b async for b in alice.file_stream(fid, block=4096)])
        assert streamed == src.read_bytes()
        with pytest.raises(errors.NotFound):
            await alice.file_get("f" * 32, short_tmp / "none.txt")
        with pytest.raises(errors.NotFound):
            _ = [b async for b in alice.file_stream("f" * 32)]
