"""Every SQL statement on inbox.db: the inbox, the event log, named consumers and the
receive cursor. Functions run on the writer or reader thread."""

from __future__ import annotations

import base64
import sqlite3
from collections.abc import Sequence
from typing import Any

import orjson

from tidemesh.core import jsonbounds, search_query
from tidemesh.core.errors import InvalidRequest
from tidemesh.core.jsonbounds import META_DEPTH
from tidemesh.core.record import record
from tidemesh.daemon.records import Delivery as Delivery
from tidemesh.daemon.records import Event as Event
from tidemesh.daemon.records import Page as Page
from tidemesh.daemon.records import StoreResult as StoreResult
from tidemesh.daemon.records import Void as Void
from tidemesh.daemon.store import handled
from tidemesh.daemon.store import hooks as hook_runs
from tidemesh.storage.multirow import insert_rows

INBOX_COLUMNS = (
    "seq, id, mesh, sender_pubkey, sender_name, client_message_id, broker_message_id,"
    " dest_kind, dest_ref, body, body_encoding, priority, meta, reply_to, broker_epoch,"
    " broker_seq, sent_at, received_at, traceparent"
)


@record
class NewEvent:
    type: str
    data: dict[str, Any]
    created_at: int
    dedupe_key: str | None = None
    hooks: tuple[str, ...] = ()


def entry_view(row: Sequence[Any]) -> dict[str, Any]:
    """An inbox entry as programs read it, from a stored row in ``INBOX_COLUMNS`` order.

    A stored meta that cannot be served (deeper than ``META_DEPTH``, which older versions
    accepted and no response could then be written for, or not JSON) is served as null with
    ``meta_unreadable`` saying why: the entry is still read, and a consumer acks past it."""
    if not row[12]:
        return _view(row, None)
    try:
        return _view(row, jsonbounds.loads(row[12], max_bytes=len(row[12]),
                                           max_depth=META_DEPTH))
    except (jsonbounds.TooDeep, orjson.JSONDecodeError) as exc:
        return {**_view(row, None), "meta_unreadable": str(exc)}


def _view(row: Sequence[Any], meta: Any) -> dict[str, Any]:
    """The entry of ``row`` (``INBOX_COLUMNS`` order) with its meta already parsed: a store
    builds its event from the values it just inserted, with no read-back and no second
    parse of the meta it serialised."""
    (seq, id_, mesh, sender, sender_name, cmid, bmid, kind, ref, body, encoding, priority,
     _, reply_to, epoch, broker_seq, sent_at, received_at, traceparent) = row
    text = (body.decode("utf-8") if encoding == "utf8"
            else base64.b64encode(body).decode("ascii"))
    return {
        "seq": seq, "id": id_, "mesh": mesh, "from": sender, "sender_name": sender_name,
        "client_message_id": cmid, "broker_message_id": bmid,
        "to": {"kind": kind, "ref": ref},
        "body": text, "body_encoding": encoding, "priority": priority,
        "meta": meta,
        "reply_to": reply_to, "sent_at": sent_at, "received_at": received_at,
        "delivery": {"epoch": epoch, "seq": broker_seq}, "traceparent": traceparent,
    }


# Existence is checked before inserting, never with INSERT OR IGNORE: an ignored insert still
# advances an AUTOINCREMENT counter, which would leave gaps in the local sequences.


def _insert_event(conn: sqlite3.Connection, ev: NewEvent, inbox_seq: int | None) -> Event | None:
    if ev.dedupe_key is not None and conn.execute(
        "SELECT 1 FROM events WHERE dedupe_key = ?", (ev.dedupe_key,)
    ).fetchone():
        return None
    cur = conn.execute(
        "INSERT INTO events (type, inbox_seq, data, dedupe_key, created_at)"
        " VALUES (?, ?, ?, ?, ?)",
        (ev.type, inbox_seq, orjson.dumps(ev.data), ev.dedupe_key, ev.created_at),
    )
    event_id = int(cur.lastrowid or 0)
    if ev.hooks:
        # A message's hooks know it by its id; other events by their place in the log.
        key = str(ev.data["id"]) if ev.type == "message" else f"event-{event_id}"
        hook_runs.add_runs(conn, event_id, key, ev.hooks, ev.created_at)
    return Event(event_id, ev.type, ev.data, ev.created_at)


def store_frame(conn: sqlite3.Connection,
                items: Sequence[Delivery | Void]) -> list[StoreResult | None]:
    """Store one frame's deliveries (deduped on sender + client_message_id), an event for
    each new one, and advance the receive cursor past each, void ones too (None for those);
    all in the caller's transaction, so a crash keeps the whole frame (messages, events and
    cursor) or none of it, and the broker sends what is missing again.

    A handful of statements whatever the frame's size (storage/multirow.py: a statement a
    row cost the writer a GIL hand-back from the event loop per row): which keys are
    stored already, the next seq and event id, then one insert each for entries and
    events. This writer is the only one, so the ids it numbers are the ones AUTOINCREMENT
    would have given, gapless."""
    out: list[StoreResult | None] = []
    held = _stored_keys(conn, [d for d in items if not isinstance(d, Void)])
    seq, event_id = _next_id(conn, "inbox", "seq"), _next_id(conn, "events", "id")
    new: list[tuple[int, Delivery, tuple[Any, ...]]] = []   # (place in out, delivery, row)
    for d in items:
        if isinstance(d, Void) or (d.sender_pubkey, d.client_message_id) in held:
            out.append(None if isinstance(d, Void) else StoreResult(None, None))
            continue
        held.add((d.sender_pubkey, d.client_message_id))
        new.append((len(out), d, (
            seq + len(new), d.id, d.mesh, d.sender_pubkey, d.sender_name, d.client_message_id,
            d.broker_message_id, d.dest_kind, d.dest_ref, d.body, d.body_encoding, d.priority,
            orjson.dumps(d.meta) if d.meta is not None else None, d.reply_to, d.epoch, d.seq,
            d.sent_at, d.received_at, d.traceparent)))
        out.append(None)   # set below, with its event
    # The entries first: a delivery the database refuses fails the frame there, as one.
    insert_rows(conn, _INSERT_ENTRIES, [row for _, _, row in new])
    events: list[tuple[Any, ...]] = []
    mark = handled.mark(conn) if new else None
    for place, d, row in new:
        if mark is not None and (d.epoch, d.seq) <= mark:
            # Handled before this inbox was rebuilt: kept for reading, offered to no one.
            out[place] = StoreResult(row[0], None)
            handled.stored_through(conn, row[0], d.received_at)
            continue
        view, eid = _view(row, d.meta), event_id + len(events)
        events.append((eid, "message", row[0], orjson.dumps(view), d.received_at))
        out[place] = StoreResult(row[0], Event(eid, "message", view, d.received_at))
        if d.hooks:   # a message's hooks know it by its id
            hook_runs.add_runs(conn, eid, d.id, d.hooks, d.received_at)
    insert_rows(conn, _INSERT_EVENTS, events)
    if items:  # once per frame, to the furthest position: it only ever moves forward
        last = max(items, key=lambda d: (d.epoch, d.seq))
        _advance_cursor(conn, last.epoch, last.seq,
                        last.at if isinstance(last, Void) else last.received_at)
    return out


_INSERT_ENTRIES = f"INSERT INTO inbox ({INBOX_COLUMNS}) VALUES "  # noqa: S608
_INSERT_EVENTS = "INSERT INTO events (id, type, inbox_seq, data, created_at) VALUES "


def _stored_keys(conn: sqlite3.Connection, deliveries: Sequence[Delivery]
                 ) -> set[tuple[str, str]]:
    """The (sender, client_message_id) of ``deliveries`` already in the inbox, read as one
    aggregated row; each key is looked up by the unique index (CROSS JOIN keeps that
    order: a row-value ``IN (VALUES …)`` scanned the whole index)."""
    if not deliveries:
        return set()
    found = conn.execute(
        "SELECT json_group_array(json_array(i.sender_pubkey, i.client_message_id))"
        " FROM json_each(?) AS j CROSS JOIN inbox AS i"
        " ON i.sender_pubkey = json_extract(j.value, '$[0]')"
        " AND i.client_message_id = json_extract(j.value, '$[1]')",
        (orjson.dumps([[d.sender_pubkey, d.client_message_id] for d in deliveries]),)
    ).fetchone()[0]
    return {(s, c) for s, c in orjson.loads(found)}


def _next_id(conn: sqlite3.Connection, table: str, column: str) -> int:
    """The id AUTOINCREMENT gives ``table``'s next row: above every one it ever gave."""
    sql = ("SELECT MAX(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = ?), 0),"  # noqa: S608
           f" COALESCE((SELECT MAX({column}) FROM {table}), 0)) + 1")
    row = conn.execute(sql, (table,)).fetchone()
    return int(row[0])


def _advance_cursor(conn: sqlite3.Connection, epoch: int, seq: int, now: int) -> None:
    conn.execute(
        "INSERT INTO receive_cursor (id, epoch, seq, updated_at) VALUES (1, ?, ?, ?)"
        " ON CONFLICT (id) DO UPDATE SET epoch = excluded.epoch, seq = excluded.seq,"
        " updated_at = excluded.updated_at"
        " WHERE excluded.epoch > receive_cursor.epoch"
        " OR (excluded.epoch = receive_cursor.epoch AND excluded.seq > receive_cursor.seq)",
        (epoch, seq, now),
    )


def receive_cursor(conn: sqlite3.Connection) -> tuple[int, int] | None:
    row = conn.execute("SELECT epoch, seq FROM receive_cursor WHERE id = 1").fetchone()
    return None if row is None else (int(row[0]), int(row[1]))


def reset_receive_cursor(conn: sqlite3.Connection, epoch: int, seq: int, now: int) -> None:
    """After STALE_SEQUENCE the broker's epoch/seq restart the count; take them as given."""
    conn.execute(
        "INSERT INTO receive_cursor (id, epoch, seq, updated_at) VALUES (1, ?, ?, ?)"
        " ON CONFLICT (id) DO UPDATE SET epoch = excluded.epoch, seq = excluded.seq,"
        " updated_at = excluded.updated_at", (epoch, seq, now))


def add_event(conn: sqlite3.Connection, ev: NewEvent) -> Event | None:
    return _insert_event(conn, ev, None)


def events_after(conn: sqlite3.Connection, after: int, limit: int) -> list[Event]:
    rows = conn.execute(
        "SELECT id, type, data, created_at FROM events WHERE id > ? ORDER BY id LIMIT ?",
        (after, limit),
    ).fetchall()
    return [Event(r[0], r[1], orjson.loads(r[2]), r[3]) for r in rows]


def last_event_id(conn: sqlite3.Connection) -> int:
    """The newest event id ever given, even when retention has since removed that event."""
    return _next_id(conn, "events", "id") - 1


class Served(list[dict[str, Any]]):
    """A page's entries; ``cut`` when the byte budget ended it before ``limit``."""

    cut: bool = False


def page(conn: sqlite3.Connection, p: Page) -> Served:
    source, key, where, args = _source(p)
    where.append(f"{key} > ?")
    args.append(p.after or 0)
    if p.topic is not None:
        where.append("dest_kind = 'topic' AND dest_ref = ?")
        args.append(p.topic)
    if p.sender is not None:
        where.append("sender_pubkey = ?")
        args.append(p.sender)
    sql = (f"SELECT {INBOX_COLUMNS} FROM {source} WHERE {' AND '.join(where)}"  # noqa: S608
           f" ORDER BY {key} LIMIT ?")
    out = Served()
    size = 0
    for row in conn.execute(sql, (*args, p.limit)):
        entry = entry_view(row)
        size += len(entry["body"]) + _ENTRY_OVERHEAD
        if out and size > PAGE_BYTES:
            # A page of 1,000 entries of 1 MB was one 400 MB body, held whole in memory;
            # the caller pages on from the last one served (``next_after``).
            out.cut = True
            break
        out.append(entry)
    return out


# What a page may hold in bodies (the spec's 10 MB); one entry is served whatever its size.
PAGE_BYTES = 10 * 1024 * 1024
_ENTRY_OVERHEAD = 512   # ids, keys, meta and JSON punctuation, roughly, per entry


def _source(p: Page) -> tuple[str, str, list[str], list[object]]:
    """What a page reads from and orders by. A search walks the index first: its rowids are
    the inbox seqs in order, so ``after`` seeks into it and LIMIT ends the walk early."""
    if p.q is None:
        return "inbox", "seq", [], []
    return ("inbox_fts CROSS JOIN inbox ON inbox.seq = inbox_fts.rowid", "inbox_fts.rowid",
            ["inbox_fts MATCH ?"], [search_query.expression(p.q, p.topic, p.sender)])


def consumer_cursor(conn: sqlite3.Connection, name: str) -> int:
    row = conn.execute("SELECT cursor FROM consumers WHERE name = ?", (name,)).fetchone()
    return handled.start(conn) if row is None else int(row[0])


def consumer_ack(conn: sqlite3.Connection, name: str, up_to: int, now: int) -> int:
    """Advance ``name``'s cursor to ``up_to`` (never backwards); returns the cursor."""
    top = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM inbox").fetchone()[0]
    if up_to > top:
        raise InvalidRequest(f"up_to {up_to} is past the newest inbox entry ({top})",
                             field="up_to")
    conn.execute(
        "INSERT INTO consumers (name, cursor, created_at, updated_at) VALUES (?, MAX(?, ?), ?, ?)"
        " ON CONFLICT (name) DO UPDATE SET cursor = MAX(cursor, excluded.cursor),"
        " updated_at = excluded.updated_at",
        (name, up_to, handled.start(conn), now, now),
    )
    # Acking past what retention took from this consumer ends the report of that loss.
    conn.execute("UPDATE consumers SET lost_count = 0, lost_through = NULL"
                 " WHERE name = ? AND lost_through IS NOT NULL AND cursor >= lost_through",
                 (name,))
    return consumer_cursor(conn, name)


def consumer_loss(conn: sqlite3.Connection, name: str) -> dict[str, int] | None:
    """Entries retention removed before this consumer acked them, until it acks past them."""
    row = conn.execute("SELECT lost_count, lost_through FROM consumers WHERE name = ?",
                       (name,)).fetchone()
    if row is None or not row[0]:
        return None
    return {"count": int(row[0]), "through_seq": int(row[1])}


def consumers(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    rows = conn.execute("SELECT name, cursor, updated_at FROM consumers ORDER BY name")
    return [{"name": r[0], "cursor": r[1], "updated_at": r[2]} for r in rows]


def membership_add(conn: sqlite3.Connection, kind: str, name: str, now: int) -> None:
    conn.execute("INSERT INTO memberships (kind, name, since) VALUES (?, ?, ?)"
                 " ON CONFLICT (kind, name) DO NOTHING", (kind, name, now))


def membership_remove(conn: sqlite3.Connection, kind: str, name: str) -> None:
    conn.execute("DELETE FROM memberships WHERE kind = ? AND name = ?", (kind, name))


def memberships(conn: sqlite3.Connection, kind: str) -> list[dict[str, Any]]:
    rows = conn.execute("SELECT name, since FROM memberships WHERE kind = ? ORDER BY name",
                        (kind,))
    return [{"name": r[0], "since": r[1]} for r in rows]


def sender_names(conn: sqlite3.Connection) -> list[tuple[str, str | None]]:
    """Each sender in the inbox with the name of its newest message (on the sender index)."""
    rows = conn.execute(
        "SELECT sender_pubkey, sender_name FROM inbox WHERE seq IN"
        " (SELECT MAX(seq) FROM inbox GROUP BY sender_pubkey)").fetchall()
    return [(r[0], r[1]) for r in rows]


def profile_get(conn: sqlite3.Connection) -> dict[str, Any]:
    row = conn.execute("SELECT data FROM profile WHERE id = 1").fetchone()
    return {} if row is None else dict(orjson.loads(row[0]))


def profile_merge(conn: sqlite3.Connection, patch: dict[str, Any], now: int) -> dict[str, Any]:
    """Apply ``patch`` (a null value removes a field) and return the new profile."""
    merged = {**profile_get(conn), **patch}
    merged = {k: v for k, v in merged.items() if v is not None}
    conn.execute("INSERT INTO profile (id, data, updated_at) VALUES (1, ?, ?)"
                 " ON CONFLICT (id) DO UPDATE SET data = excluded.data,"
                 " updated_at = excluded.updated_at", (orjson.dumps(merged), now))
    return merged


# A session (docs/agents.md) is the pair of named consumers its MCP server keeps:
# session.NAME.push (what it was pushed) and session.NAME.read (what it marked read).
SESSION_CONSUMERS = ("push", "read")


def session_register(conn: sqlite3.Connection, name: str, now: int) -> None:
    for part in SESSION_CONSUMERS:
        conn.execute("INSERT INTO consumers (name, cursor, created_at, updated_at)"
                     " VALUES (?, ?, ?, ?) ON CONFLICT (name) DO NOTHING",
                     (f"session.{name}.{part}", handled.start(conn), now, now))


def sessions(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    rows = conn.execute("SELECT name, cursor, created_at, updated_at FROM consumers"
                        " WHERE name LIKE 'session.%' ORDER BY name")
    found: dict[str, dict[str, Any]] = {}
    for consumer, cursor, created_at, updated_at in rows:
        name, _, part = consumer[len("session."):].rpartition(".")
        if name and part in SESSION_CONSUMERS:
            s = found.setdefault(name, {"name": name, "pushed_up_to": 0, "read_up_to": 0,
                                        "created_at": created_at, "updated_at": 0})
            s["created_at"] = min(s["created_at"], created_at)
            s["pushed_up_to" if part == "push" else "read_up_to"] = cursor
            s["updated_at"] = max(s["updated_at"], updated_at)
    return list(found.values())


def session_remove(conn: sqlite3.Connection, name: str) -> bool:
    """Forget a session's cursors (its entries stop being held for it); True if it was."""
    gone = conn.execute("DELETE FROM consumers WHERE name IN (?, ?)",
                        tuple(f"session.{name}.{p}" for p in SESSION_CONSUMERS)).rowcount
    return bool(gone)
