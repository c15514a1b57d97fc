"""Inbox search: the FTS5 index over text bodies on a real inbox.db, kept in step with the
frames stored, retention's deletes and the setting; and GET /v1/inbox?q= over the socket."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

import pytest

from tests.daemon.local_app import delivery, local_app
from tidemesh.core.errors import InvalidRequest
from tidemesh.core.retention import DAY_MS, InboxPolicy
from tidemesh.core.sqlscript import split_statements
from tidemesh.daemon.records import Page
from tidemesh.daemon.store import inbox, retention, search
from tidemesh.daemon.store.db import INBOX_MIGRATIONS
from tidemesh.daemon.store.inbox import Delivery

NOW = 1_700_000_000_000


def _db(path: Path, on: bool = True) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    INBOX_MIGRATIONS.apply_sqlite(conn)
    search.configure(conn, on, NOW)
    return conn


def _store(conn: sqlite3.Connection, *items: Delivery) -> None:
    conn.execute("BEGIN IMMEDIATE")
    inbox.store_frame(conn, items)
    conn.execute("COMMIT")


def _found(conn: sqlite3.Connection, q: str, **page: object) -> list[str]:
    return [e["body"] for e in search.page(conn, Page(q=q, **page))]  # type: ignore[arg-type]


def _old(seq: int, body: str, age_days: int = 0) -> Delivery:
    at = NOW - age_days * DAY_MS
    return dataclasses.replace(delivery(seq, body=body), sent_at=at, received_at=at)


def test_text_bodies_are_found_by_a_word_and_binary_ones_never(tmp_path: Path) -> None:
    conn = _db(tmp_path / "inbox.db")
    binary = dataclasses.replace(delivery(3), body=b"deploy \xff\xfe",
                                 body_encoding="base64")
    dm = dataclasses.replace(delivery(4, body="the deploy key, opened"), dest_kind="dm",
                             dest_ref="ab" * 32)
    _store(conn, delivery(1, body="Deploy finished"), delivery(2, body="lunch?"), binary, dm)
    assert _found(conn, "deploy") == ["Deploy finished", "the deploy key, opened"]
    assert _found(conn, "nothing") == []
    assert search.check(conn) is None


def test_a_search_pages_with_after_limit_and_the_other_filters(tmp_path: Path) -> None:
    conn = _db(tmp_path / "inbox.db")
    _store(conn, *(delivery(i, body=f"alert {i}", topic="ops" if i % 2 else "dev")
                   for i in range(1, 8)))
    first = search.page(conn, Page(limit=2, q="alert"))
    assert [e["seq"] for e in first] == [1, 2]
    assert [e["seq"] for e in search.page(conn, Page(after=2, limit=3, q="alert"))] == [3, 4, 5]
    assert [e["seq"] for e in search.page(conn, Page(topic="dev", q="alert"))] == [2, 4, 6]
    assert [e["seq"] for e in search.page(conn, Page(q='alert AND "5"'))] == [5]


def test_words_match_the_body_only_never_the_sender_or_topic(tmp_path: Path) -> None:
    conn = _db(tmp_path / "inbox.db")
    _store(conn, delivery(1, body="nothing here", topic="ops.alerts"),
           delivery(2, body="ops alerts, in the text", topic="dev"))
    assert _found(conn, "ops") == ["ops alerts, in the text"]
    assert _found(conn, "alerts", topic="ops.alerts") == []
    assert _found(conn, "nothing", topic="ops.alerts") == ["nothing here"]
    assert _found(conn, "nothing", topic="ops-alerts") == [], "the SQL filter is exact"
    with pytest.raises(InvalidRequest):
        search.page(conn, Page(q="text) OR (ops"))


def test_retention_removes_entries_from_the_index_too(tmp_path: Path) -> None:
    conn = _db(tmp_path / "inbox.db")
    _store(conn, _old(1, "rotate the keys", age_days=40), _old(2, "rotate later"))
    policy = InboxPolicy(30 * DAY_MS, 90 * DAY_MS, 7 * DAY_MS)
    conn.execute("BEGIN IMMEDIATE")
    deleted, _ = retention.inbox_step(conn, retention.InboxCursor(), policy, NOW, 100)
    conn.execute("COMMIT")
    assert deleted == 1
    assert _found(conn, "rotate") == ["rotate later"]
    assert _found(conn, "keys") == []
    assert search.check(conn) is None, "the index agrees with the inbox after the delete"


def test_a_row_rewritten_in_place_stays_in_step_and_can_still_be_deleted(
        tmp_path: Path) -> None:
    """No tidemesh path updates inbox rows today; a repair or migration that does must not
    leave the index told to delete words it never indexed (every later delete would fail)."""
    conn = _db(tmp_path / "inbox.db")
    _store(conn, delivery(1, body="first words"), delivery(2, body="second words"))
    conn.execute("UPDATE inbox SET body = ? WHERE seq = 1", (b"mended text",))
    conn.execute("UPDATE inbox SET body_encoding = 'base64' WHERE seq = 2")
    assert [e["seq"] for e in search.page(conn, Page(q="mended OR words"))] == [1]
    assert search.check(conn) is None
    conn.execute("DELETE FROM inbox")
    assert search.check(conn) is None
    assert _found(conn, "mended OR words OR first") == []


def test_turned_off_the_index_is_emptied_and_turned_on_it_is_filled_again(
        tmp_path: Path) -> None:
    conn = _db(tmp_path / "inbox.db")
    _store(conn, delivery(1, body="before"))
    conn.execute("BEGIN IMMEDIATE")
    assert search.configure(conn, False, NOW) == "emptied"
    conn.execute("COMMIT")
    _store(conn, delivery(2, body="while off"))
    conn.execute("DELETE FROM inbox WHERE seq = 1")   # a delete while off, unindexed
    assert _found(conn, "before OR off") == []
    conn.execute("BEGIN IMMEDIATE")
    assert search.configure(conn, True, NOW) == "filled"
    assert search.configure(conn, True, NOW) is None
    conn.execute("COMMIT")
    assert _found(conn, "before OR off") == ["while off"]
    assert search.check(conn) is None


def test_an_inbox_from_before_search_is_indexed_on_its_first_start(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "inbox.db", isolation_level=None)
    INBOX_MIGRATIONS.sqlite_version(conn)
    for mg in INBOX_MIGRATIONS.load()[:5]:   # the schema before search
        for stmt in split_statements(mg.sql):
            conn.execute(stmt).fetchall()
        conn.execute("INSERT INTO schema_migrations VALUES (?, ?, 0)", (mg.version, mg.name))
    # Written as that schema held it (today's store_frame writes columns added since).
    d = delivery(1, body="older words")
    old_columns = inbox.INBOX_COLUMNS.removesuffix(", traceparent")
    conn.execute(f"INSERT INTO inbox ({old_columns}) VALUES "  # noqa: S608
                 "(1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?, ?, ?, ?)",
                 (d.id, d.mesh, d.sender_pubkey, d.sender_name, d.client_message_id,
                  d.broker_message_id, d.dest_kind, d.dest_ref, d.body, d.body_encoding,
                  d.priority, d.reply_to, d.epoch, d.seq, d.sent_at, d.received_at))
    assert INBOX_MIGRATIONS.apply_sqlite(conn)[0] == 6   # search, then any later ones
    assert _found(conn, "older") == [], "migrated, not yet filled"
    assert search.configure(conn, True, NOW) == "filled"
    assert _found(conn, "older") == ["older words"]


def test_rebuild_gives_back_an_index_that_lost_its_rows(tmp_path: Path) -> None:
    conn = _db(tmp_path / "inbox.db")
    _store(conn, delivery(1, body="kept words"))
    conn.execute("INSERT INTO inbox_fts (inbox_fts) VALUES ('delete-all')")
    assert _found(conn, "kept") == []
    search.rebuild(conn)
    assert _found(conn, "kept") == ["kept words"]


@pytest.mark.parametrize("q", ['"unterminated', "AND", "nocolumn:word", "*", "a OR"])
def test_a_query_fts5_cannot_read_is_an_invalid_request_naming_q(
        tmp_path: Path, q: str) -> None:
    conn = _db(tmp_path / "inbox.db")
    _store(conn, delivery(1, body="a b"))
    with pytest.raises(InvalidRequest) as err:
        search.page(conn, Page(q=q))
    assert err.value.details["field"] == "q"
    assert "not a valid search query" in err.value.message


async def test_get_inbox_q_searches_and_answers_bad_queries_400(short_tmp: Path) -> None:
    async with local_app(short_tmp) as app:
        await app.inbox.store_frame([delivery(1, body="disk full on db1"),
                                     delivery(2, body="all good"),
                                     delivery(3, body="disk replaced")])
        async with app.session() as s:
            async with s.get("/v1/inbox", params={"q": "disk", "limit": 1}) as r:
                page = await r.json()
                assert r.status == 200
                assert [e["body"] for e in page["items"]] == ["disk full on db1"]
            async with s.get("/v1/inbox", params={"q": "disk", "after": page["next_after"]}
                             ) as r:
                assert [e["seq"] for e in (await r.json())["items"]] == [3]
            for q, words in (('"disk', "not a valid search query"), ("  ", "q is empty"),
                             ("x" * 1025, "longer than")):
                async with s.get("/v1/inbox", params={"q": q}) as r:
                    body = await r.json()
                    assert r.status == 400, body
                    assert body["error"]["code"] == "invalid_request"
                    assert body["error"]["field"] == "q" and words in body["error"]["message"]
            async with s.get("/v1/inbox", params={"q": "disk AND"}) as r:
                body = await r.json()
                # near the word the user typed, not the query wrapper's own parenthesis
                assert 'syntax error near "AND"' in body["error"]["message"], body
            async with s.get("/v1/inbox", params={"q": "disk", "consumer": "c"}) as r:
                assert r.status == 400 and (await r.json())["error"]["field"] == "q"
            async with s.get("/v1/version") as r:
                assert "inbox_search" in (await r.json())["ipc_features"]


async def test_with_search_off_q_is_refused_saying_so(short_tmp: Path) -> None:
    async with local_app(short_tmp, fts_enabled=False) as app:
        await app.inbox.store(delivery(1, body="disk full"))
        async with app.session() as s, s.get("/v1/inbox", params={"q": "disk"}) as r:
            body = await r.json()
            assert r.status == 400
            assert body["error"]["reason"] == "search_disabled"
            assert "fts_enabled" in body["error"]["message"]
        async with app.session() as s, s.get("/v1/version") as r:
            assert "inbox_search" not in (await r.json())["ipc_features"]
