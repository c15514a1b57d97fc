"""Inbox search end to end: messages a real broker delivered (a topic post and a sealed DM,
opened on the recipient's host) are found by a word through IPC, the SDK and the CLI; gone
from the results once retention removed them; a bad query is a 400; with the setting off the
index is emptied and q is refused, and turned on again the next start fills it."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.harness import RunningDaemon, run_cli, start_daemon
from tests.e2e.harness import (
    Broker,
    Mesh,
    inbox,
    pubkey,
    sqlite_broker_with_team,
    two_on_topic,
    wait_for,
)
from tidemesh.client import AsyncClient, Client
from tidemesh.core.errors import InvalidRequest
from tidemesh.core.retention import DAY_MS
from tidemesh.daemon.process.stores import open_outbox
from tidemesh.daemon.service.retention import RetentionService, RetentionSettings
from tidemesh.daemon.store.db import INBOX_MIGRATIONS, Database

pytestmark = pytest.mark.slow


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def either_mesh(request: pytest.FixtureRequest, short_tmp: Path) -> Iterator[Mesh]:
    """Mesh ``team`` on a broker of each store: search is the daemon's alone, whichever."""
    if request.param == "sqlite":
        broker = sqlite_broker_with_team(short_tmp)
    else:
        (short_tmp / "broker").mkdir()
        broker = Broker(short_tmp / "broker", request.getfixturevalue("pg_database"))
        broker.cli("mesh", "create", "team")
    broker.start()
    m = Mesh(broker, "team")
    try:
        yield m
    finally:
        m.stop()


async def _search(d: RunningDaemon, q: str) -> tuple[int, dict[str, Any]]:
    async with d.session() as s, s.get("/v1/inbox", params={"q": q}) as r:
        return r.status, await r.json()


async def _bodies(d: RunningDaemon, q: str) -> list[str]:
    status, page = await _search(d, q)
    assert status == 200, page
    return [e["body"] for e in page["items"]]


def _indexed(d: RunningDaemon) -> int:
    """Documents the index holds (its rows in the FTS5 data, read beside the daemon)."""
    conn = sqlite3.connect(d.paths.inbox_db)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM inbox_fts WHERE inbox_fts MATCH"
                                " 'disk OR rotation OR good'").fetchone()[0])
    finally:
        conn.close()


def _migrate_inbox(conn: sqlite3.Connection) -> None:
    INBOX_MIGRATIONS.apply_sqlite(conn)


async def _prune_later(d: RunningDaemon, later_ms: int) -> int:
    """Retention on the stopped daemon's inbox, the clock ``later_ms`` on (as `daemon prune`
    opens it: no start-up step, so only the triggers keep the index in step)."""
    out = await open_outbox(d.paths.outbox_db, 8, recover=False)
    inn = await Database.open(d.paths.inbox_db, _migrate_inbox)
    try:
        svc = RetentionService(out, inn, RetentionSettings(),
                               clock=lambda: time.time() + later_ms / 1000)
        return int((await svc.prune_inbox())["deleted"])
    finally:
        await out.close()
        await inn.close()


async def test_received_messages_are_found_until_retention_removes_them(
        either_mesh: Mesh, short_tmp: Path) -> None:
    mesh = either_mesh
    a, b = await two_on_topic(mesh, short_tmp)
    async with a.session() as s:
        for cid, to, body in (("c1", "topic:ops", "disk full on db1"),
                              ("c2", "topic:ops", "all good"),
                              ("c3", f"dm:{pubkey(b)}", "the rotation plan, sealed")):
            async with s.post("/v1/send", json={"to": to, "body": body},
                              headers={"Idempotency-Key": cid}) as r:
                assert r.status == 202, await r.text()
    await wait_for(lambda: _count(b, 3))

    assert await _bodies(b, "disk") == ["disk full on db1"]
    assert await _bodies(b, "rotation") == ["the rotation plan, sealed"], "DMs opened on host"
    assert await _bodies(b, "disk OR good") == ["disk full on db1", "all good"]
    assert Client(b.paths.socket).inbox(q="rot*")["items"][0]["to"]["kind"] == "dm"
    async with AsyncClient(b.paths.socket) as ac:
        assert len((await ac.inbox(q="disk", limit=1))["items"]) == 1
    res = run_cli(b.home, "inbox", "--mesh", "m", "--search", "disk", "--json")
    assert res.returncode == 0, res.stderr
    assert [e["body"] for e in json.loads(res.stdout)["items"]] == ["disk full on db1"]

    status, err = await _search(b, '"disk')
    assert status == 400 and err["error"]["field"] == "q", err
    with pytest.raises(InvalidRequest, match="not a valid search query"):
        Client(b.paths.socket).inbox(q="disk AND")
    res = run_cli(b.home, "inbox", "--mesh", "m", "--search", "disk AND")
    assert res.returncode != 0 and "not a valid search query" in res.stderr + res.stdout

    assert b.stop() == 0
    assert await _prune_later(b, 31 * DAY_MS) == 3
    b = mesh.daemons["b"] = start_daemon(b.home, "m")
    assert await _bodies(b, "disk OR rotation OR good") == []
    assert _indexed(b) == 0


async def test_with_the_setting_off_there_is_no_index_and_q_says_why(
        mesh: Mesh, short_tmp: Path) -> None:
    a, b = await two_on_topic(mesh, short_tmp)
    async with a.session() as s, s.post("/v1/send", json={"to": "topic:ops", "body": "disk"},
                                        headers={"Idempotency-Key": "c1"}) as r:
        assert r.status == 202
    await wait_for(lambda: _count(b, 1))
    assert _indexed(b) == 1

    assert b.stop() == 0
    b = mesh.daemons["b"] = start_daemon(b.home, "m",
                                         extra_env={"TIDEMESH_INBOX_FTS_ENABLED": "false"})
    assert _indexed(b) == 0
    status, err = await _search(b, "disk")
    assert status == 400 and err["error"]["reason"] == "search_disabled", err
    assert "fts_enabled" in err["error"]["message"]
    assert [e["body"] for e in await inbox(b)] == ["disk"], "the inbox itself is untouched"

    assert b.stop() == 0
    b = mesh.daemons["b"] = start_daemon(b.home, "m")
    assert await _bodies(b, "disk") == ["disk"], "the next start with it on fills the index"


async def _count(d: RunningDaemon, n: int) -> bool:
    return len(await inbox(d)) >= n
