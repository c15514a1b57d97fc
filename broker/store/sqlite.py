"""Embedded SQLite adapter (the default store): one file, one writer thread, group commit.

Every write is a function of the connection queued to the writer thread, which drains the
queue into one ``BEGIN IMMEDIATE`` transaction with a savepoint per item and COMMITs
(WAL, ``synchronous=FULL``) before any caller hears back. One failing item rolls back to its
own savepoint and cannot take the others with it; later items see what earlier ones wrote,
so concurrent sends of one key are decided one after the other. Reads use a second
connection. Other processes (the CLI) may write too: ``busy_timeout`` covers them.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import structlog

from tidemesh.broker.accept import (
    AcceptInput,
    AcceptResult,
    Branch,
    DedupeRow,
    Delivery,
    answer_existing,
    branch,
    created,
    failed,
    pick_queue_consumer,
    recipients_for,
)
from tidemesh.broker.store import migrate
from tidemesh.broker.store.base import (
    TABLES,
    Cursor,
    DeliveryRow,
    Member,
    Mesh,
    Reassigned,
    invite_refused,
)
from tidemesh.core.errors import Conflict, NotFound, TidemeshError, Unavailable, UnknownDestination
from tidemesh.core.ids import new_ulid

T = TypeVar("T")
log = structlog.get_logger(__name__)


def _private_folder(folder: Path) -> None:
    """Create the store's folder 0700. A folder that already exists is the operator's choice
    (``sqlite:///srv/shared/broker.db``) and keeps its mode."""
    if folder.exists():
        return
    folder.mkdir(parents=True, mode=0o700)
    os.chmod(folder, 0o700)  # mkdir's mode is narrowed by the umask, never widened


def _private_file(path: Path) -> None:
    """Make the database file 0600 before SQLite opens it: SQLite would create it with the
    umask's mode (usually 0644), and it gives its -wal and -shm files the database file's
    mode. An existing file is narrowed too, so older stores become private."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def connect(path: Path, *, readonly: bool = False) -> sqlite3.Connection:
    """Open a connection with the PRAGMAs of every broker connection, set here only."""
    if not readonly:
        _private_file(path)
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout = 10000")
    conn.execute("PRAGMA foreign_keys = ON")
    if readonly:
        conn.execute("PRAGMA query_only = ON")
    else:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
    return conn


@dataclass(slots=True)
class _Item:
    fn: Callable[[sqlite3.Connection], Any]
    future: asyncio.Future[Any]
    result: Any = None
    error: BaseException | None = None


class SqliteStore:
    """The ``Store`` on one SQLite file; construct with ``SqliteStore.open``."""

    outage_errors: tuple[type[Exception], ...] = (Unavailable,)

    def __init__(self, path: Path, batch_max: int) -> None:
        self.path = path
        self.batch_max = batch_max
        self._wpool = ThreadPoolExecutor(1, thread_name_prefix="broker-sqlite-w")
        self._rpool = ThreadPoolExecutor(1, thread_name_prefix="broker-sqlite-r")
        self._queue: asyncio.Queue[_Item | None] = asyncio.Queue()
        self._wconn: sqlite3.Connection | None = None
        self._rconn: sqlite3.Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self.batches = 0
        self.items = 0
        self.on_batch: Callable[[int, float], None] | None = None

    @classmethod
    async def open(
        cls, path: Path, *, batch_max: int = 512, migrate_now: bool = True
    ) -> SqliteStore:
        store = cls(path, batch_max)
        loop = asyncio.get_running_loop()
        _private_folder(path.parent)

        def _open() -> None:
            store._wconn = connect(path)
            if migrate_now:
                migrate.apply_sqlite(store._wconn)
            else:
                migrate.require_current_sqlite(store._wconn)

        try:
            await loop.run_in_executor(store._wpool, _open)
            store._rconn = await loop.run_in_executor(
                store._rpool, lambda: connect(path, readonly=True))
        except BaseException:
            await store._close_connections()
            raise
        store._task = asyncio.create_task(store._run(), name="broker-sqlite-writer")
        return store

    @property
    def writer_tasks(self) -> Sequence[asyncio.Task[None]]:
        assert self._task is not None
        return [self._task]

    # -- plumbing ------------------------------------------------------------------------

    async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._task is None or self._task.done():
            raise Unavailable("the broker store writer is not running")
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Item(fn, fut))
        return await fut

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._rconn
        if conn is None:
            raise Unavailable("the broker store is closed")
        try:
            return await asyncio.get_running_loop().run_in_executor(self._rpool, fn, conn)
        except sqlite3.Error as exc:
            raise Unavailable(f"the broker store could not be read: {exc}") from exc

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._queue.put_nowait(None)
            await self._task
        await self._close_connections()

    async def _close_connections(self) -> None:
        loop = asyncio.get_running_loop()
        for pool, attr in ((self._wpool, "_wconn"), (self._rpool, "_rconn")):
            conn = getattr(self, attr)
            if conn is not None:
                await loop.run_in_executor(pool, conn.close)
                setattr(self, attr, None)
            pool.shutdown(wait=True)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        stopping = False
        while not stopping:
            first = await self._queue.get()
            if first is None:
                break
            batch = [first]
            while len(batch) < self.batch_max and not self._queue.empty():
                nxt = self._queue.get_nowait()
                if nxt is None:
                    stopping = True
                    break
                batch.append(nxt)
            started = time.perf_counter()
            await loop.run_in_executor(self._wpool, self._commit, batch)
            self.batches += 1
            self.items += len(batch)
            if self.on_batch is not None:
                self.on_batch(len(batch), time.perf_counter() - started)
            for item in batch:
                if item.future.done():
                    continue
                if item.error is not None:
                    item.future.set_exception(item.error)
                else:
                    item.future.set_result(item.result)

    def _commit(self, batch: list[_Item]) -> None:
        conn = self._wconn
        assert conn is not None
        try:
            conn.execute("BEGIN IMMEDIATE")
            for item in batch:
                conn.execute("SAVEPOINT item")
                try:
                    item.result = item.fn(conn)
                except Exception as exc:
                    conn.execute("ROLLBACK TO item")
                    item.error = (exc if isinstance(exc, TidemeshError)
                                  else Unavailable(f"broker store write failed: {exc}"))
                conn.execute("RELEASE item")
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            log.error("broker_commit_failed", error=str(exc), items=len(batch))
            err = Unavailable(f"the broker store could not commit: {exc}")
            for item in batch:
                item.error = err

    # -- membership ----------------------------------------------------------------------

    async def create_mesh(self, name: str, now_ms: int) -> Mesh:
        mesh = Mesh(new_ulid(now_ms), name, now_ms)

        def fn(conn: sqlite3.Connection) -> Mesh:
            try:
                conn.execute("INSERT INTO mesh (id, name, created_at) VALUES (?, ?, ?)",
                             (mesh.id, mesh.name, mesh.created_at))
            except sqlite3.IntegrityError as exc:
                raise Conflict(f"a mesh named {name!r} exists already", field="name") from exc
            return mesh

        return await self._write(fn)

    async def find_mesh(self, name_or_id: str) -> Mesh | None:
        def fn(conn: sqlite3.Connection) -> Mesh | None:
            row = conn.execute("SELECT id, name, created_at FROM mesh WHERE id = ? OR name = ?",
                               (name_or_id, name_or_id)).fetchone()
            return Mesh(*row) if row else None

        return await self._read(fn)

    async def create_invite(self, mesh_id: str, token_sha256: bytes, max_uses: int,
                            expires_at: int | None, now_ms: int) -> str:
        invite_id = new_ulid(now_ms)
        await self._write(lambda c: c.execute(
            "INSERT INTO invite (id, mesh_id, token_sha256, max_uses, created_at, expires_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (invite_id, mesh_id, token_sha256, max_uses, now_ms, expires_at)))
        return invite_id

    async def redeem_invite(self, mesh_id: str, token_sha256: bytes, pubkey: str,
                            display_name: str | None, now_ms: int) -> Member:
        def fn(conn: sqlite3.Connection) -> Member:
            existing = _member(conn, mesh_id, pubkey)
            if existing is not None and existing.revoked_at is None:
                return existing  # a retried join is not a second use of the invite
            if existing is not None:
                raise NotFound("this key was revoked from the mesh", reason="member_revoked")
            row = conn.execute(
                "UPDATE invite SET uses = uses + 1 WHERE mesh_id = ? AND token_sha256 = ?"
                " AND revoked_at IS NULL AND uses < max_uses"
                " AND (expires_at IS NULL OR expires_at > ?) RETURNING id",
                (mesh_id, token_sha256, now_ms)).fetchone()
            if row is None:
                state = conn.execute(INVITE_STATE_SQL, (mesh_id, token_sha256)).fetchone()
                raise invite_refused(state, now_ms)
            conn.execute(
                "INSERT INTO member (mesh_id, pubkey, display_name, invite_id, joined_at)"
                " VALUES (?, ?, ?, ?, ?)", (mesh_id, pubkey, display_name, row[0], now_ms))
            return Member(mesh_id, pubkey, display_name, now_ms, None)

        return await self._write(fn)

    async def add_member(self, mesh_id: str, pubkey: str, now_ms: int) -> None:
        await self._write(lambda c: c.execute(
            "INSERT INTO member (mesh_id, pubkey, joined_at) VALUES (?, ?, ?)"
            " ON CONFLICT DO NOTHING", (mesh_id, pubkey, now_ms)))

    async def get_member(self, mesh_id: str, pubkey: str) -> Member | None:
        return await self._read(lambda c: _member(c, mesh_id, pubkey))

    async def list_members(self, mesh_id: str) -> list[Member]:
        def fn(conn: sqlite3.Connection) -> list[Member]:
            rows = conn.execute(
                "SELECT mesh_id, pubkey, display_name, joined_at, revoked_at FROM member"
                " WHERE mesh_id = ? ORDER BY joined_at, pubkey", (mesh_id,)).fetchall()
            return [Member(*r) for r in rows]

        return await self._read(fn)

    async def revoke_member(self, mesh_id: str, pubkey: str, now_ms: int) -> bool:
        def fn(conn: sqlite3.Connection) -> bool:
            cur = conn.execute("UPDATE member SET revoked_at = ? WHERE mesh_id = ? AND pubkey = ?"
                               " AND revoked_at IS NULL", (now_ms, mesh_id, pubkey))
            return cur.rowcount > 0

        return await self._write(fn)

    # -- destinations --------------------------------------------------------------------

    async def create_topic(self, mesh_id: str, name: str, by: str | None, now_ms: int) -> None:
        await self._write(lambda c: c.execute(
            "INSERT INTO topic (mesh_id, name, created_by, created_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT DO NOTHING", (mesh_id, name, by, now_ms)))

    async def subscribe(self, mesh_id: str, topic: str, pubkey: str, now_ms: int) -> None:
        def fn(conn: sqlite3.Connection) -> None:
            if not conn.execute("SELECT 1 FROM topic WHERE mesh_id = ? AND name = ?",
                                (mesh_id, topic)).fetchone():
                raise UnknownDestination(f"no topic {topic!r} in this mesh", field="name")
            conn.execute("INSERT INTO topic_subscription (mesh_id, topic, member_pubkey,"
                         " subscribed_at) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                         (mesh_id, topic, pubkey, now_ms))

        await self._write(fn)

    async def unsubscribe(self, mesh_id: str, topic: str, pubkey: str) -> None:
        await self._write(lambda c: c.execute(
            "DELETE FROM topic_subscription WHERE mesh_id = ? AND topic = ? AND member_pubkey = ?",
            (mesh_id, topic, pubkey)))

    async def add_queue_consumer(self, mesh_id: str, queue: str, pubkey: str,
                                 now_ms: int) -> None:
        await self._write(lambda c: c.execute(
            "INSERT INTO queue_consumer (mesh_id, queue, member_pubkey, registered_at)"
            " VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING", (mesh_id, queue, pubkey, now_ms)))

    async def remove_queue_consumer(self, mesh_id: str, queue: str, pubkey: str) -> None:
        await self._write(lambda c: c.execute(
            "DELETE FROM queue_consumer WHERE mesh_id = ? AND queue = ? AND member_pubkey = ?",
            (mesh_id, queue, pubkey)))

    # -- accept --------------------------------------------------------------------------

    async def accept(self, item: AcceptInput) -> AcceptResult:
        try:
            return await self._write(lambda c: _accept(c, item))
        except TidemeshError as exc:
            return failed(item, exc)

    # -- receive path --------------------------------------------------------------------

    async def cursor(self, mesh_id: str, pubkey: str) -> Cursor:
        def fn(conn: sqlite3.Connection) -> Cursor:
            row = conn.execute(
                "SELECT epoch, last_seq, acked_seq, compacted_seq FROM recipient_cursor"
                " WHERE mesh_id = ? AND recipient_pubkey = ?", (mesh_id, pubkey)).fetchone()
            return Cursor(*row) if row else Cursor(1, 0, 0, 0)

        return await self._read(fn)

    async def deliveries_after(self, mesh_id: str, pubkey: str, epoch: int, after_seq: int,
                               limit: int) -> list[DeliveryRow]:
        def fn(conn: sqlite3.Connection) -> list[DeliveryRow]:
            rows = conn.execute(DELIVERIES_SQL, (mesh_id, pubkey, epoch, after_seq, limit))
            return [_delivery_row(r) for r in rows.fetchall()]

        return await self._read(fn)

    async def reassign_lapsed(self, lease_before: int, now_ms: int,
                              limit: int = 500) -> list[Reassigned]:
        return await self._write(lambda c: _reassign(c, lease_before, now_ms, limit))

    async def ack(self, mesh_id: str, pubkey: str, epoch: int, seq: int, now_ms: int) -> int:
        def fn(conn: sqlite3.Connection) -> int:
            cur = conn.execute(
                "UPDATE delivery_queue SET acked_at = ? WHERE mesh_id = ? AND recipient_pubkey = ?"
                " AND epoch = ? AND seq <= ? AND acked_at IS NULL",
                (now_ms, mesh_id, pubkey, epoch, seq))
            conn.execute(
                "UPDATE recipient_cursor SET acked_seq = MAX(acked_seq, MIN(?, last_seq)),"
                " updated_at = ? WHERE mesh_id = ? AND recipient_pubkey = ? AND epoch = ?",
                (seq, now_ms, mesh_id, pubkey, epoch))
            return cur.rowcount

        return await self._write(fn)

    # -- retention -----------------------------------------------------------------------

    async def delete_expired_dedupe(self, now_ms: int) -> int:
        def fn(conn: sqlite3.Connection) -> int:
            return conn.execute("DELETE FROM client_message_dedupe WHERE expires_at IS NOT NULL"
                                " AND expires_at < ?", (now_ms,)).rowcount

        return await self._write(fn)

    async def prune_messages(self, created_before: int, stall_before: int) -> int:
        return await self._write(lambda c: _prune(c, created_before, stall_before))

    async def set_info(self, key: str, value: str, now_ms: int) -> None:
        await self._write(lambda c: c.execute(
            "INSERT INTO broker_info (key, value, updated_at) VALUES (?, ?, ?) ON CONFLICT (key)"
            " DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
            (key, value, now_ms)))

    async def get_info(self, key: str) -> str | None:
        def fn(conn: sqlite3.Connection) -> str | None:
            row = conn.execute("SELECT value FROM broker_info WHERE key = ?", (key,)).fetchone()
            return None if row is None else str(row[0])

        return await self._read(fn)

    async def counts(self) -> dict[str, int]:
        def fn(conn: sqlite3.Connection) -> dict[str, int]:
            return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]  # noqa: S608
                    for t in TABLES}

        return await self._read(fn)


def _member(conn: sqlite3.Connection, mesh_id: str, pubkey: str) -> Member | None:
    row = conn.execute("SELECT mesh_id, pubkey, display_name, joined_at, revoked_at FROM member"
                       " WHERE mesh_id = ? AND pubkey = ?", (mesh_id, pubkey)).fetchone()
    return Member(*row) if row else None


INVITE_STATE_SQL = ("SELECT uses, max_uses, expires_at, revoked_at FROM invite"
                    " WHERE mesh_id = ? AND token_sha256 = ?")

CLAIM_SQL = """
INSERT INTO client_message_dedupe (mesh_id, sender_pubkey, client_message_id, broker_message_id,
    history_id, request_fingerprint, destination_kind, destination_ref, first_seen_at, expires_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (mesh_id, sender_pubkey, client_message_id) DO NOTHING
"""

READBACK_SQL = """
SELECT broker_message_id, history_id, request_fingerprint, history_available, first_seen_at
FROM client_message_dedupe WHERE mesh_id = ? AND sender_pubkey = ? AND client_message_id = ?
"""

DELIVERIES_SQL = """
SELECT d.epoch, d.seq, d.broker_message_id, h.history_id,
       COALESCE(t.sender_pubkey, q.sender_pubkey),
       COALESCE(t.client_message_id, q.client_message_id),
       COALESCE(q.destination_kind, 'topic'), COALESCE(t.topic, q.destination_ref),
       COALESCE(t.body, q.body), COALESCE(t.body_encoding, q.body_encoding),
       COALESCE(t.priority, q.priority), COALESCE(t.meta, q.meta),
       COALESCE(t.reply_to, q.reply_to), d.created_at, d.reassigned_at IS NOT NULL
FROM delivery_queue d
LEFT JOIN topic_message t ON t.id = d.broker_message_id
LEFT JOIN message_queue q ON q.id = d.broker_message_id
LEFT JOIN message_history h ON h.broker_message_id = d.broker_message_id
WHERE d.mesh_id = ? AND d.recipient_pubkey = ? AND d.epoch = ? AND d.seq > ?
  AND (t.id IS NOT NULL OR q.id IS NOT NULL)
ORDER BY d.seq LIMIT ?
"""


def _delivery_row(r: Any) -> DeliveryRow:
    meta = json.loads(r[11]) if r[11] is not None else None
    return DeliveryRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], bytes(r[8]), r[9], r[10],
                       meta, r[12], r[13], bool(r[14]))


def _accept(conn: sqlite3.Connection, a: AcceptInput) -> AcceptResult:
    """Spec §4.7.2 inside the writer's savepoint; raising rolls this send back entirely."""
    conn.execute(CLAIM_SQL, (*a.key, a.broker_message_id, a.history_id, a.fingerprint, a.kind,
                             a.ref, a.now_ms, a.expires_at))
    r = conn.execute(READBACK_SQL, a.key).fetchone()
    row = DedupeRow(r[0], r[1], bytes(r[2]), bool(r[3]), r[4])
    if branch(a, row) is not Branch.CREATED:
        return answer_existing(a, row)
    recipients = _b2_recipients(conn, a)  # raises UnknownDestination: savepoint rolls back
    _insert_message(conn, a)
    deliveries = []
    for pubkey in recipients:
        epoch, seq = conn.execute(
            "INSERT INTO recipient_cursor (mesh_id, recipient_pubkey, last_seq, updated_at)"
            " VALUES (?, ?, 1, ?) ON CONFLICT (mesh_id, recipient_pubkey) DO UPDATE"
            " SET last_seq = last_seq + 1, updated_at = excluded.updated_at"
            " RETURNING epoch, last_seq", (a.mesh_id, pubkey, a.now_ms)).fetchone()
        deliveries.append(Delivery(pubkey, epoch, seq))
    conn.executemany(
        "INSERT INTO delivery_queue (mesh_id, recipient_pubkey, epoch, seq, broker_message_id,"
        " created_at) VALUES (?, ?, ?, ?, ?, ?)",
        [(a.mesh_id, d.recipient_pubkey, d.epoch, d.seq, a.broker_message_id, a.now_ms)
         for d in deliveries])
    return created(a, deliveries)


def _b2_recipients(conn: sqlite3.Connection, a: AcceptInput) -> list[str]:
    subscribers: list[str] = []
    consumers: list[str] = []
    if a.kind == "topic":
        if not conn.execute("SELECT 1 FROM topic WHERE mesh_id = ? AND name = ?",
                            (a.mesh_id, a.ref)).fetchone():
            raise UnknownDestination(f"no topic {a.ref!r} in this mesh", field="to.ref")
        subscribers = [r[0] for r in conn.execute(
            "SELECT s.member_pubkey FROM topic_subscription s JOIN member m"
            " ON m.mesh_id = s.mesh_id AND m.pubkey = s.member_pubkey AND m.revoked_at IS NULL"
            " WHERE s.mesh_id = ? AND s.topic = ?", (a.mesh_id, a.ref))]
    elif a.kind == "dm":
        if not conn.execute("SELECT 1 FROM member WHERE mesh_id = ? AND pubkey = ?"
                            " AND revoked_at IS NULL", (a.mesh_id, a.ref)).fetchone():
            raise UnknownDestination("no such member in this mesh", field="to.ref")
    else:
        consumers = [r[0] for r in conn.execute(
            "SELECT c.member_pubkey FROM queue_consumer c JOIN member m"
            " ON m.mesh_id = c.mesh_id AND m.pubkey = c.member_pubkey AND m.revoked_at IS NULL"
            " WHERE c.mesh_id = ? AND c.queue = ?", (a.mesh_id, a.ref))]
        if not consumers:
            raise UnknownDestination(f"no queue {a.ref!r} (it has no consumer)", field="to.ref")
    return recipients_for(a.kind, a.ref, a.sender_pubkey, subscribers, consumers,
                          a.broker_message_id)


def _insert_message(conn: sqlite3.Connection, a: AcceptInput) -> None:
    meta = json.dumps(a.meta, separators=(",", ":")) if a.meta else None
    if a.kind == "topic":
        conn.execute(
            "INSERT INTO topic_message (id, mesh_id, sender_pubkey, client_message_id, topic,"
            " body, body_encoding, priority, meta, reply_to, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (a.broker_message_id, a.mesh_id, a.sender_pubkey, a.client_message_id, a.ref, a.body,
             a.body_encoding, a.priority, meta, a.reply_to, a.now_ms))
    else:
        conn.execute(
            "INSERT INTO message_queue (id, mesh_id, sender_pubkey, client_message_id,"
            " destination_kind, destination_ref, body, body_encoding, priority, meta, reply_to,"
            " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (a.broker_message_id, a.mesh_id, a.sender_pubkey, a.client_message_id, a.kind, a.ref,
             a.body, a.body_encoding, a.priority, meta, a.reply_to, a.now_ms))
    conn.execute(
        "INSERT INTO message_history (history_id, broker_message_id, mesh_id, sender_pubkey,"
        " destination_kind, destination_ref, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (a.history_id, a.broker_message_id, a.mesh_id, a.sender_pubkey, a.kind, a.ref, a.now_ms))


PRUNABLE_SQL = """
SELECT id FROM {table} m WHERE m.created_at < ?
AND NOT EXISTS (SELECT 1 FROM delivery_queue d WHERE d.broker_message_id = m.id
                AND d.acked_at IS NULL AND d.created_at >= ?)
"""


def _prune(conn: sqlite3.Connection, created_before: int, stall_before: int) -> int:
    """Delete old messages with their history and deliveries; flip their dedupe rows."""
    ids: list[str] = []
    for table in ("topic_message", "message_queue"):
        ids += [r[0] for r in conn.execute(PRUNABLE_SQL.format(table=table),
                                           (created_before, stall_before))]
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS prune_ids (id TEXT PRIMARY KEY)")
    conn.execute("DELETE FROM prune_ids")
    conn.executemany("INSERT INTO prune_ids (id) VALUES (?)", [(i,) for i in ids])
    conn.execute(
        "UPDATE recipient_cursor SET compacted_seq = MAX(compacted_seq, (SELECT MAX(d.seq)"
        " FROM delivery_queue d WHERE d.mesh_id = recipient_cursor.mesh_id"
        " AND d.recipient_pubkey = recipient_cursor.recipient_pubkey"
        " AND d.epoch = recipient_cursor.epoch AND d.broker_message_id IN prune_ids))"
        " WHERE EXISTS (SELECT 1 FROM delivery_queue d WHERE d.mesh_id = recipient_cursor.mesh_id"
        " AND d.recipient_pubkey = recipient_cursor.recipient_pubkey"
        " AND d.epoch = recipient_cursor.epoch AND d.broker_message_id IN prune_ids)")
    for table, col in (("delivery_queue", "broker_message_id"),
                       ("message_history", "broker_message_id"),
                       ("topic_message", "id"), ("message_queue", "id")):
        conn.execute(f"DELETE FROM {table} WHERE {col} IN prune_ids")  # noqa: S608
    conn.execute("UPDATE client_message_dedupe SET history_available = 0"
                 " WHERE broker_message_id IN prune_ids")
    conn.execute("DELETE FROM prune_ids")
    return len(ids)


LAPSED_SQL = """
SELECT d.mesh_id, d.recipient_pubkey, d.epoch, d.seq, d.broker_message_id, q.destination_ref
FROM delivery_queue d JOIN message_queue q ON q.id = d.broker_message_id
WHERE q.destination_kind = 'queue' AND d.acked_at IS NULL AND d.reassigned_at IS NULL
  AND d.created_at < ? ORDER BY d.created_at LIMIT ?
"""


def _reassign(conn: sqlite3.Connection, lease_before: int, now_ms: int,
              limit: int) -> list[Reassigned]:
    """Give each lapsed queue delivery to another live consumer, in one transaction: the old
    row is marked (it stays in its recipient's gapless stream), the new one appended."""
    moved = []
    for mesh_id, old, epoch, seq, bmid, queue in conn.execute(LAPSED_SQL,
                                                              (lease_before, limit)).fetchall():
        others = [r[0] for r in conn.execute(
            "SELECT c.member_pubkey FROM queue_consumer c JOIN member m"
            " ON m.mesh_id = c.mesh_id AND m.pubkey = c.member_pubkey AND m.revoked_at IS NULL"
            " WHERE c.mesh_id = ? AND c.queue = ? AND c.member_pubkey != ?", (mesh_id, queue, old))]
        if not others:
            continue  # the only consumer keeps it; it gets it when it comes back
        new = pick_queue_consumer(others, bmid)
        conn.execute("UPDATE delivery_queue SET reassigned_at = ? WHERE mesh_id = ?"
                     " AND recipient_pubkey = ? AND epoch = ? AND seq = ?",
                     (now_ms, mesh_id, old, epoch, seq))
        new_epoch, new_seq = conn.execute(
            "INSERT INTO recipient_cursor (mesh_id, recipient_pubkey, last_seq, updated_at)"
            " VALUES (?, ?, 1, ?) ON CONFLICT (mesh_id, recipient_pubkey) DO UPDATE"
            " SET last_seq = last_seq + 1, updated_at = excluded.updated_at"
            " RETURNING epoch, last_seq", (mesh_id, new, now_ms)).fetchone()
        conn.execute("INSERT INTO delivery_queue (mesh_id, recipient_pubkey, epoch, seq,"
                     " broker_message_id, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                     (mesh_id, new, new_epoch, new_seq, bmid, now_ms))
        moved.append(Reassigned(mesh_id, bmid, old, new))
    return moved
