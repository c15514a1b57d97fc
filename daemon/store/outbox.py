"""Every SQL statement that touches the ``outbox`` table. Functions run on the writer or
reader thread with a connection already inside the right transaction."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from tidemesh.core.accept import Action, OutboxStatus, Outcome, Prior, decide
from tidemesh.core.errors import Conflict, NotFound
from tidemesh.core.outcome import Kind, Settlement, expired
from tidemesh.core.record import record
from tidemesh.daemon.records import Claimed as Claimed
from tidemesh.daemon.records import OutboxRow
from tidemesh.storage.engine import BatchOp
from tidemesh.storage.multirow import insert_rows

COLUMNS = (
    "id, client_message_id, request_fingerprint, payload, dest_kind, dest_ref, enqueued_at,"
    " attempts, next_attempt_at, status, last_error, delivered_at, broker_message_id,"
    " history_id, aborted_at, aborted_by, superseded_by, supersedes"
)
_SELECT_BY_CMID = f"SELECT {COLUMNS} FROM outbox WHERE client_message_id = ?"  # noqa: S608
_SELECT_BY_ID = f"SELECT {COLUMNS} FROM outbox WHERE id = ?"  # noqa: S608
_INSERT_MANY = (
    "INSERT INTO outbox (id, client_message_id, request_fingerprint, payload, dest_kind,"
    " dest_ref, enqueued_at, next_attempt_at, status, supersedes) VALUES "
)
_ROW_MARKS = "(?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?)"
_INSERT = _INSERT_MANY + _ROW_MARKS
_INSERT_CLAIMED = (
    "INSERT INTO outbox (id, client_message_id, request_fingerprint, payload, dest_kind,"
    " dest_ref, enqueued_at, next_attempt_at, status, supersedes, attempts)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'inflight', ?, 1)"
)


@record
class NewRow:
    """What an accept or a requeue writes."""

    id: str
    client_message_id: str
    fingerprint: bytes
    payload: bytes
    dest_kind: str
    dest_ref: str
    now_ms: int
    supersedes: str | None = None
    # Inserted already claimed for the wire (inflight, one attempt): the sender waited idle
    # with room and takes the row from the accept (``OutboxService.submit``).
    claimed: bool = False


@record
class Existing:
    """The row already bound to an id, as much as an accept answer needs."""

    id: str
    status: str
    fingerprint: bytes
    broker_message_id: str | None = None
    history_id: str | None = None
    last_error: str | None = None
    dest_kind: str | None = None


@record
class AcceptResult:
    outcome: Outcome
    existing: Existing | None    # None when this accept inserted the row
    outbox_id: str


def _existing(row: sqlite3.Row) -> Existing:
    return Existing(row["id"], row["status"], row["request_fingerprint"],
                    row["broker_message_id"], row["history_id"], row["last_error"],
                    row["dest_kind"])


def accept_many(conn: sqlite3.Connection, news: Sequence[NewRow]) -> list[AcceptResult]:
    """Spec §4.5.1 steps 4-5 for a group of accepts in one transaction: read every id's row
    with one query, decide each request in arrival order (a later one sees the rows the
    earlier ones insert), then insert the new rows with one statement."""
    ids = list({n.client_message_id for n in news})
    marks = ",".join("?" * len(ids))
    found = {
        r["client_message_id"]: _existing(r)
        for r in conn.execute(
            f"SELECT {COLUMNS} FROM outbox WHERE client_message_id IN ({marks})", ids  # noqa: S608
        )
    }
    results, inserts = [], []
    for new in news:
        known = found.get(new.client_message_id)
        prior = None if known is None else Prior(OutboxStatus(known.status), known.fingerprint)
        outcome = decide(prior, new.fingerprint)
        if outcome.action is Action.INSERT:
            if new.claimed:
                conn.execute(_INSERT_CLAIMED, _insert_args(new))
            else:
                inserts.append(_insert_args(new))
            found[new.client_message_id] = Existing(
                new.id, "inflight" if new.claimed else "pending", new.fingerprint,
                dest_kind=new.dest_kind)
            results.append(AcceptResult(outcome, None, new.id))
        else:
            assert known is not None
            results.append(AcceptResult(outcome, known, known.id))
    # One statement, not executemany's step (and GIL hand-back) per row: storage/multirow.py.
    insert_rows(conn, _INSERT_MANY, inserts, group=_ROW_MARKS)
    return results


ACCEPT = BatchOp("outbox_accept", accept_many)


def _insert_args(new: NewRow) -> tuple[Any, ...]:
    return (new.id, new.client_message_id, new.fingerprint, new.payload, new.dest_kind,
            new.dest_ref, new.now_ms, new.now_ms, new.supersedes)


def _insert(conn: sqlite3.Connection, new: NewRow) -> None:
    conn.execute(_INSERT, _insert_args(new))


def get(conn: sqlite3.Connection, row_id: str) -> OutboxRow:
    row = conn.execute(_SELECT_BY_ID, (row_id,)).fetchone()
    if row is None:
        raise NotFound(f"no outbox row with id {row_id}", id=row_id)
    return OutboxRow(*row)


def chain(conn: sqlite3.Connection, row_id: str) -> list[str]:
    """Ids from the first row of the requeue chain through the last, ``row_id`` among them."""
    first = row_id
    seen = {first}
    while True:
        prev = conn.execute("SELECT supersedes FROM outbox WHERE id = ?", (first,)).fetchone()
        if prev is None or prev[0] is None or prev[0] in seen:
            break
        first = prev[0]
        seen.add(first)
    out = [first]
    while True:
        nxt = conn.execute("SELECT superseded_by FROM outbox WHERE id = ?", (out[-1],)).fetchone()
        if nxt is None or nxt[0] is None or nxt[0] in out:
            return out
        out.append(nxt[0])


def list_rows(
    conn: sqlite3.Connection, status: str | None, limit: int, before: str | None = None
) -> list[OutboxRow]:
    """Newest first; ``before`` pages by row id (ULIDs sort by time)."""
    where, args = [], []
    if status is not None:
        where.append("status = ?")
        args.append(status)
    if before is not None:
        where.append("id < ?")
        args.append(before)
    sql = f"SELECT {COLUMNS} FROM outbox"  # noqa: S608
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY id DESC LIMIT ?"
    out: list[OutboxRow] = []
    size = 0
    for r in conn.execute(sql, (*args, limit)):
        row = OutboxRow(*r)
        size += len(row.payload) + 512
        if out and size > PAGE_BYTES:   # as an inbox page: the caller pages on with before
            break
        out.append(row)
    return out


# What one listing may hold in payloads (the spec's 10 MB); one row is listed whatever its size.
PAGE_BYTES = 10 * 1024 * 1024


def counts(conn: sqlite3.Connection) -> dict[str, int]:
    out = {s.value: 0 for s in OutboxStatus}
    for status, n in conn.execute("SELECT status, COUNT(*) FROM outbox GROUP BY status"):
        out[status] = n
    return out


def oldest_unsent(conn: sqlite3.Connection) -> int | None:
    """enqueued_at of the oldest row not yet settled (pending or inflight)."""
    row = conn.execute("SELECT MIN(enqueued_at) FROM outbox"
                       " WHERE status IN ('pending', 'inflight')").fetchone()
    return None if row[0] is None else int(row[0])


REQUEUEABLE = (OutboxStatus.PENDING.value, OutboxStatus.DEAD.value)


def requeue(conn: sqlite3.Connection, old_id: str, new: NewRow, aborted_by: str) -> None:
    """Spec §4.5.3 in one transaction: retire the old row, insert its successor, link them."""
    old = get(conn, old_id)
    if old.status not in REQUEUEABLE:
        hint = (
            " (it may be on the wire right now; wait for it to settle)"
            if old.status == OutboxStatus.INFLIGHT.value else ""
        )
        raise Conflict(
            f"outbox row {old_id} is {old.status}; only pending or dead rows can be "
            f"requeued{hint}",
            id=old_id, status=old.status,
        )
    taken = conn.execute(_SELECT_BY_CMID, (new.client_message_id,)).fetchone()
    if taken is not None:
        raise Conflict(
            f"client_message_id {new.client_message_id!r} is already used by outbox row "
            f"{taken['id']}; ids are never reused",
            client_message_id=new.client_message_id,
        )
    _insert(conn, new)
    conn.execute(
        "UPDATE outbox SET status = 'aborted', aborted_at = ?, aborted_by = ?, superseded_by = ?"
        " WHERE id = ?",
        (new.now_ms, aborted_by, new.id, old_id),
    )


def reset_inflight(conn: sqlite3.Connection, now_ms: int, delay_ms: int) -> int:
    """Startup recovery (spec §4.11): a row left inflight by a crash is retried; the broker's
    dedupe makes a second send harmless."""
    cur = conn.execute(
        "UPDATE outbox SET status = 'pending', next_attempt_at = ? WHERE status = 'inflight'",
        (now_ms + delay_ms,),
    )
    return cur.rowcount


MAX_AGE_MS = "max_age_ms"   # outbox_meta: the max age negotiated on the last connect


def set_meta(conn: sqlite3.Connection, key: str, value: int, now_ms: int) -> None:
    conn.execute("INSERT INTO outbox_meta (key, value, updated_at) VALUES (?, ?, ?)"
                 " ON CONFLICT (key) DO UPDATE SET value = excluded.value,"
                 " updated_at = excluded.updated_at", (key, value, now_ms))


def get_meta(conn: sqlite3.Connection, key: str) -> int | None:
    row = conn.execute("SELECT value FROM outbox_meta WHERE key = ?", (key,)).fetchone()
    return None if row is None else int(row[0])


def claim_due(
    conn: sqlite3.Connection, now_ms: int, limit: int, max_age_ms: int
) -> tuple[list[Claimed], list[Settlement]]:
    """Take up to ``limit`` pending rows that are due: too old ones go dead at once
    (max_age_exceeded), the rest become inflight with one more attempt."""
    rows = conn.execute(
        "SELECT id, client_message_id, payload, attempts, enqueued_at FROM outbox"
        " WHERE status = 'pending' AND next_attempt_at <= ? ORDER BY next_attempt_at, id"
        " LIMIT ?", (now_ms, limit),
    ).fetchall()
    claimed, dead = [], []
    for r in rows:
        gone = expired(r["id"], r["enqueued_at"], max_age_ms, now_ms)
        if gone is not None:
            dead.append(gone)
            continue
        claimed.append(Claimed(r["id"], r["client_message_id"], r["payload"], r["attempts"] + 1))
    settle_many(conn, dead, from_status="pending")
    conn.executemany(
        "UPDATE outbox SET status = 'inflight', attempts = attempts + 1 WHERE id = ?",
        [(c.id,) for c in claimed],
    )
    return claimed, dead


def unclaim(conn: sqlite3.Connection, row_id: str) -> bool:
    """A row its accept claimed that no sender took goes back to pending; not one a later
    session released and claimed again (it has another attempt by then)."""
    return conn.execute("UPDATE outbox SET status = 'pending', attempts = 0 WHERE id = ?"
                        " AND status = 'inflight' AND attempts = 1", (row_id,)).rowcount == 1


def next_due(conn: sqlite3.Connection) -> int | None:
    row = conn.execute("SELECT MIN(next_attempt_at) FROM outbox WHERE status = 'pending'"
                       ).fetchone()
    return None if row[0] is None else int(row[0])


def settle_many(
    conn: sqlite3.Connection, settlements: Sequence[Settlement], from_status: str = "inflight"
) -> list[bool]:
    """Apply sender outcomes; a row no longer in ``from_status`` is left alone (False)."""
    out = []
    for st in settlements:
        if st.kind is Kind.DONE:
            cur = conn.execute(
                "UPDATE outbox SET status = 'done', broker_message_id = ?, history_id = ?,"
                " delivered_at = ?, last_error = NULL WHERE id = ? AND status = ?",
                (st.broker_message_id, st.history_id, st.now_ms, st.row_id, from_status))
        elif st.kind is Kind.DEAD:
            cur = conn.execute(
                "UPDATE outbox SET status = 'dead', last_error = ?, dead_at = ?"
                " WHERE id = ? AND status = ?",
                (st.last_error, st.now_ms, st.row_id, from_status))
        else:
            cur = conn.execute(
                # No next_attempt_at (429 rate_limited): the row keeps its place.
                "UPDATE outbox SET status = 'pending', last_error = ?,"
                " next_attempt_at = COALESCE(?, next_attempt_at)"
                " WHERE id = ? AND status = ?",
                (st.last_error, st.next_attempt_at, st.row_id, from_status))
        out.append(cur.rowcount == 1)
    return out



def dead_unnotified(conn: sqlite3.Connection, limit: int = 500) -> list[OutboxRow]:
    return [OutboxRow(*r) for r in conn.execute(
        f"SELECT {COLUMNS} FROM outbox WHERE status = 'dead' AND dead_notified_at IS NULL"  # noqa: S608
        " ORDER BY id LIMIT ?", (limit,))]


def mark_notified(conn: sqlite3.Connection, row_ids: Sequence[str], now_ms: int) -> None:
    conn.executemany("UPDATE outbox SET dead_notified_at = ? WHERE id = ?",
                     [(now_ms, i) for i in row_ids])
