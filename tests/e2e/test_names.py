"""A DM names its member as a person does: ``dm:@bob``, a key prefix, or the full key."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.daemon.harness import RunningDaemon
from tests.e2e.harness import Mesh, connected, inbox, pubkey, wait_for

pytestmark = pytest.mark.slow


async def _send(d: RunningDaemon, to: str, body: str) -> tuple[int, dict[str, object]]:
    async with d.session() as s, s.post("/v1/send", json={"to": to, "body": body}) as r:
        return r.status, await r.json()


async def _outbox_rows(d: RunningDaemon) -> int:
    async with d.session() as s, s.get("/v1/outbox", params={"limit": 1000}) as r:
        return len((await r.json())["items"])


async def _sees(d: RunningDaemon, other: RunningDaemon) -> bool:
    async with d.session() as s, s.get("/v1/peers") as r:
        return pubkey(other) in {p["pubkey"] for p in (await r.json())["peers"]}


async def test_a_dm_by_name_or_prefix_reaches_the_member(mesh: Mesh, short_tmp: Path) -> None:
    alice, bob = mesh.add("alice", short_tmp), mesh.add("bob", short_tmp)
    await wait_for(lambda: connected(alice))
    await wait_for(lambda: _sees(alice, bob))
    bob_key = pubkey(bob)
    by_name = await _send(alice, "dm:@bob", "by name")
    assert by_name[0] == 202, by_name
    by_prefix = await _send(alice, "dm:" + bob_key[:16], "by prefix")
    assert by_prefix[0] == 202, by_prefix

    async def both() -> bool:
        return len(await inbox(bob)) == 2

    await wait_for(both)
    assert sorted(e["body"] for e in await inbox(bob)) == ["by name", "by prefix"]
    assert {e["to"]["ref"] for e in await inbox(bob)} == {bob_key}


async def test_an_unknown_name_is_refused_before_any_outbox_row(mesh: Mesh,
                                                                 short_tmp: Path) -> None:
    alice, bob = mesh.add("alice", short_tmp), mesh.add("bob", short_tmp)
    await wait_for(lambda: connected(alice))
    await wait_for(lambda: _sees(alice, bob))
    rows = await _outbox_rows(alice)
    status, body = await _send(alice, "dm:@carol", "to nobody")
    assert status == 404, body
    err = body["error"]
    assert err["code"] == "unknown_member"   # type: ignore[index]
    assert "@bob" in {c["label"].split(" ")[0] for c in err["candidates"]}  # type: ignore[index]
    assert await _outbox_rows(alice) == rows
    async with alice.session() as s, s.post("/v1/send_batch", json={"sends": [
            {"to": "dm:@carol", "body": "x"}, {"to": "dm:@bob", "body": "y"}]}) as r:
        results = (await r.json())["results"]
    assert [x["status"] for x in results] == [404, 202]
    assert results[0]["body"]["error"]["code"] == "unknown_member"


async def test_a_name_outlives_the_peer_leaving_once_it_wrote(mesh: Mesh,
                                                              short_tmp: Path) -> None:
    """Offline members are known by the messages they sent: the inbox is the directory."""
    alice, bob = mesh.add("alice", short_tmp), mesh.add("bob", short_tmp)
    await wait_for(lambda: connected(alice))
    await wait_for(lambda: connected(bob))
    assert (await _send(bob, "dm:" + pubkey(alice), "hi alice"))[0] == 202

    async def arrived() -> bool:
        return len(await inbox(alice)) == 1

    await wait_for(arrived)
    mesh.daemons.pop("bob").stop()

    async def gone() -> bool:
        return not await _sees(alice, bob)

    await wait_for(gone)
    status, body = await _send(alice, "dm:@bob", "while you were out")
    assert status == 202, body
