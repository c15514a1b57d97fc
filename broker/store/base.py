"""The broker's ``Store`` port: one Protocol, two adapters (SQLite default, PostgreSQL).

Row values are frozen dataclasses. Every method is one transaction; ``accept_batch`` calls
(a frame's sends each) from concurrent sessions are group-committed by the adapter (one
transaction, one batch of statements for all their sends, a savepoint per send only when a
statement fails), and each answer leaves only after COMMIT. Must not import websockets or
the server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import orjson

from tidemesh.broker.accept import AcceptInput, AcceptResult, DedupeRow
from tidemesh.broker.store.accept import AcceptRows, Key
from tidemesh.broker.store.files import FileStore
from tidemesh.core import invite as invites
from tidemesh.core import jsonbounds
from tidemesh.core.errors import Conflict, NotFound
from tidemesh.core.jsonbounds import META_DEPTH
from tidemesh.core.record import record
from tidemesh.storage.migrate import Migrations
from tidemesh.storage.postgres import Database as PostgresDatabase
from tidemesh.storage.sqlite import Database as SqliteDatabase
from tidemesh.storage.stats import BatchCounters

# The store's migration sets, numbered alike on both engines (``tidemesh.storage.migrate``).
_BEHIND = "run `tidemesh broker migrate`"
SQLITE_MIGRATIONS = Migrations("broker/sqlite", "the broker store", behind=_BEHIND)
POSTGRES_MIGRATIONS = Migrations("broker/postgres", "the broker store", behind=_BEHIND,
                                 pg_schema="mesh")

TABLES = (
    "mesh", "member", "invite", "topic", "topic_subscription", "queue_consumer",
    "client_message_dedupe", "topic_message", "message_queue", "message_history",
    "recipient_cursor", "delivery_queue", "topic_delivery", "broker_info",
    "file_object", "file_chunk",   # shared files (store/files.py)
)


def invite_refused(row: Sequence[Any] | None, now_ms: int) -> NotFound:
    """The error for an invite that could not be redeemed, saying why; ``row`` is the
    invite's (uses, max_uses, expires_at, revoked_at), or None when no invite has the token."""
    state = None if row is None else (int(row[0]), int(row[1]), row[2], row[3])
    why = invites.refusal(state, now_ms)
    return NotFound(invites.explain_refusal(invites.refusal_reason(why)) or why.value,
                    reason=invites.refusal_reason(why))


@dataclass(frozen=True, slots=True)
class Mesh:
    id: str
    name: str
    created_at: int


@dataclass(frozen=True, slots=True)
class MeshLimits:
    """A mesh's own member send budget; None keeps the broker's setting."""

    member_rate: float | None
    member_burst: int | None


@dataclass(frozen=True, slots=True)
class Member:
    mesh_id: str
    pubkey: str
    display_name: str | None
    joined_at: int
    revoked_at: int | None
    rotated_to: str | None = None   # the key this one was rotated out for (key_rotate)


def rotation_counts(rows: list[int], spanned: int) -> dict[str, int]:
    """What a rotation moved, as the key_rotated frame counts it, from the row counts of the
    stores' ROTATE_SQL statements (repointed keys, subscriptions, queue memberships,
    delivery rows, dedupe rows, cursor, topic delivery spans) and the deliveries the spans
    hold (``SPANNED_SQL``: a span row stands for a run of seqs)."""
    _, subs, queues, deliveries, dedupe, _, _ = rows
    return {"subscriptions": subs, "queues": queues, "deliveries": deliveries + spanned,
            "dedupe": dedupe}


def rotation_already(old: Member | None, new: Member | None, new_pubkey: str) -> bool:
    """Decide a ``key_rotate`` from the two member rows, before anything is written: True
    when this very rotation happened already (a retry after a lost answer or a crash: the
    step is idempotent), False when it is to be done; an error when it cannot be."""
    if old is None:
        raise NotFound("the old key is not a member of this mesh", reason="unknown_member")
    if old.rotated_to == new_pubkey:
        return True
    if old.rotated_to is not None:
        raise Conflict(f"this key was rotated out already, to {old.rotated_to[:16]}…",
                       reason="key_rotated_out")
    if old.revoked_at is not None:
        raise NotFound("this key was revoked from the mesh", reason="member_revoked")
    if new is not None:
        raise Conflict("the new key is a member of this mesh already; make another",
                       field="new_pubkey")
    return False


@dataclass(frozen=True, slots=True)
class Cursor:
    epoch: int
    last_seq: int
    acked_seq: int
    compacted_seq: int


def stored_meta(raw: str | bytes) -> dict[str, Any] | None:
    """A stored meta as a deliver frame carries it. Older versions stored metas nested
    deeper than ``META_DEPTH``; no frame can carry those to the recipient (whose daemon
    would refuse the whole batch, again on every resume), so such a meta is delivered as
    a marker, as the daemon marks a DM it cannot open (docs/threat-model.md)."""
    try:
        value = jsonbounds.loads(raw, max_bytes=len(raw), max_depth=META_DEPTH)
    except (jsonbounds.TooDeep, orjson.JSONDecodeError) as exc:
        return {"tidemesh_meta_unreadable": str(exc)}
    return value if isinstance(value, dict) else None


@record
class DeliveryRow:
    epoch: int
    seq: int
    broker_message_id: str
    history_id: str | None
    sender_pubkey: str
    client_message_id: str | None
    kind: str
    ref: str
    body: bytes
    body_encoding: str
    priority: str
    meta: dict[str, Any] | None
    reply_to: str | None
    created_at: int
    reassigned: bool = False     # a lapsed queue lease: sent void, acked, never stored
    sender_name: str | None = None  # the sender's display name as the broker knows it now
    traceparent: str | None = None  # W3C trace context the sender gave (or its daemon made)

    @classmethod
    def of_record(cls, r: Sequence[Any]) -> DeliveryRow:
        """A row of either store's DELIVERIES_SQL (same columns, same order)."""
        meta = stored_meta(r[11]) if r[11] is not None else None
        return cls(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], bytes(r[8]), r[9], r[10],
                   meta, r[12], r[13], bool(r[14]), r[15], r[16])


def latest_acks(acks: Sequence[tuple[str, str, int, int, int]]
                ) -> dict[tuple[str, str, int], int]:
    """Acks of a batch (mesh, member, epoch, seq, now_ms) → the highest seq per (mesh,
    member, epoch), in (mesh, member) order: acks are cumulative, so it covers the others."""
    latest: dict[tuple[str, str, int], int] = {}
    for m, p, e, s, _ in acks:
        latest[(m, p, e)] = max(s, latest.get((m, p, e), s))
    return dict(sorted(latest.items()))


@dataclass(frozen=True, slots=True)
class Reassigned:
    """A queue delivery whose lease lapsed, moved to another consumer."""

    mesh_id: str
    broker_message_id: str
    from_pubkey: str
    to_pubkey: str


E = TypeVar("E", SqliteDatabase, PostgresDatabase)


class OnEngine(Generic[E]):
    """What both adapters delegate to their write engine (``tidemesh.storage``)."""

    db: E

    @property
    def stats(self) -> BatchCounters:
        return self.db

    @property
    def writer_tasks(self) -> Sequence[asyncio.Task[None]]:
        return self.db.writer_tasks

    async def close(self) -> None:
        await self.db.close()


class Store(FileStore, Protocol):
    """What the broker needs from its database (its shared files: ``files.FileStore``)."""

    # What the database raises while it is down or restarting: a connection that fails on
    # one of these is closed "try again later", not as a broker fault.
    outage_errors: tuple[type[Exception], ...]

    @property
    def stats(self) -> BatchCounters:
        """The write engine's group commits (on SQLite every write's, on PostgreSQL the
        accepts'); its ``on_batch(items, seconds)`` feeds the broker's metrics."""
        ...

    @property
    def writer_tasks(self) -> Sequence[asyncio.Task[None]]:
        """The accept writers, for the composition root to supervise."""
        ...

    async def close(self) -> None: ...

    # membership
    async def create_mesh(self, name: str, now_ms: int) -> Mesh: ...
    async def find_mesh(self, name_or_id: str) -> Mesh | None: ...
    async def create_invite(self, mesh_id: str, token_sha256: bytes, max_uses: int,
                            expires_at: int | None, now_ms: int) -> str: ...
    async def redeem_invite(self, mesh_id: str, token_sha256: bytes, pubkey: str,
                            display_name: str | None, now_ms: int) -> Member: ...
    async def get_member(self, mesh_id: str, pubkey: str) -> Member | None: ...
    async def mesh_member(self, mesh_id: str, pubkey: str
                          ) -> tuple[Mesh | None, Member | None]:
        """The mesh of that id and its member of that key, in one read (a hello's
        lookup: one round trip fewer per connection)."""
        ...
    async def list_members(self, mesh_id: str) -> list[Member]: ...
    async def members_named(self, mesh_id: str, name: str, limit: int) -> list[str]:
        """The keys of the mesh's current members (not revoked, not rotated out) that go by
        display name ``name``, oldest first, at most ``limit``."""
        ...
    async def revoke_member(self, mesh_id: str, pubkey: str, now_ms: int) -> bool: ...
    async def revoked_since(self, since_ms: int) -> list[tuple[str, str]]:
        """(mesh_id, pubkey) of the members revoked (or left) at or after ``since_ms``: one
        statement for every connected member, whatever their number."""
        ...
    async def leave_member(self, mesh_id: str, pubkey: str, now_ms: int
                           ) -> dict[str, int] | None: ...
    async def add_member(self, mesh_id: str, pubkey: str, now_ms: int) -> None: ...
    async def rotate_member(self, mesh_id: str, old_pubkey: str, new_pubkey: str,
                            now_ms: int) -> dict[str, Any]:
        """Move a member to a new key in one transaction (docs/broker.md, "Key rotation"):
        the new key's row, the old one rotated out, and its subscriptions, queue
        memberships, delivery cursor and deliveries (every one, acked or not, so its
        sequence goes on gapless; topic log spans too, after what its topics logged is
        handed to the old key) and send dedupe rows moved to the new key. Returns
        ``already`` and ``rotation_counts``."""
        ...

    # destinations
    async def create_topic(self, mesh_id: str, name: str, by: str | None, now_ms: int) -> None: ...
    async def subscribe(self, mesh_id: str, topic: str, pubkey: str, now_ms: int) -> None: ...
    async def unsubscribe(self, mesh_id: str, topic: str, pubkey: str, now_ms: int) -> None:
        """Drop the subscription, after handing the member what the topic logged while it
        was subscribed (in the same transaction)."""
        ...
    async def add_queue_consumer(self, mesh_id: str, queue: str, pubkey: str,
                                 now_ms: int) -> None: ...
    async def remove_queue_consumer(self, mesh_id: str, queue: str, pubkey: str) -> None: ...

    # the accept transaction (spec §4.7.2)
    accept_rows: AcceptRows  # sends per accept transaction, taken after each commit

    async def accept_batch(self, items: Sequence[AcceptInput]) -> list[AcceptResult]:
        """One frame's sends (B1 passed; one sender's, in arrival order) as one operation of
        the write engine; a result per send, in order. Never raises for a send: a failure
        is that send's 5xx result."""
        ...

    async def accept(self, item: AcceptInput) -> AcceptResult:
        """``accept_batch([item])``."""
        ...

    async def known(self, keys: Sequence[Key]) -> dict[Key, DedupeRow]:
        """B0: the dedupe rows some of ``keys`` already have, read outside any accept
        transaction (PostgreSQL: one query for all of them)."""
        ...

    async def topic_subscribers(self, topics: Sequence[tuple[str, str]]
                                ) -> dict[tuple[str, str], list[str]]:
        """(mesh, topic) → the live members subscribed to it, read outside any accept
        transaction: whose pumps a topic message wakes once it is committed (the accept does
        not list them; each is handed its entries by its own pump)."""
        ...

    # fair load: per-mesh overrides of the member send budget
    async def mesh_limits(self) -> dict[str, MeshLimits]:
        """mesh_id → its override, for the meshes that have one."""
        ...

    async def set_mesh_limits(self, mesh_id: str, limits: MeshLimits) -> None: ...

    # receive path (DESIGN §6)
    async def cursor(self, mesh_id: str, pubkey: str) -> Cursor: ...
    async def reassign_lapsed(self, lease_before: int, now_ms: int,
                              limit: int = 500) -> list[Reassigned]: ...
    async def deliveries_after(self, mesh_id: str, pubkey: str, epoch: int, after_seq: int,
                               limit: int) -> list[DeliveryRow]: ...
    async def hand_out(self, mesh_id: str, pubkey: str, now_ms: int) -> bool:
        """Give the member its next seqs for what its topics logged since it was last given
        any (one span per run of positions, ``broker/topiclog.py``); True if its topics
        logged more than one call hands out. Calls of many members share a transaction."""
        ...

    async def hand_out_page(self, mesh_id: str, pubkey: str, epoch: int, after_seq: int,
                            limit: int, now_ms: int, logged: bool = False
                            ) -> tuple[bool, list[DeliveryRow]]:
        """``hand_out``, then ``deliveries_after`` with what it gave: a pump's wake-up. The
        page is read after the hand-out commits, or before COMMIT in its transaction (the
        answer still comes after it). ``logged``: the member's topics are known to have
        logged something for it (a store may skip asking first)."""
        ...

    async def ack(self, mesh_id: str, pubkey: str, epoch: int, seq: int, now_ms: int) -> int:
        """Cumulative: move the member's cursor to ``seq`` (at most its last seq); returns
        by how many seqs it moved. Calls of many members share a transaction."""
        ...

    # retention (spec §17.5-6)
    async def delete_expired_dedupe(self, now_ms: int) -> int: ...
    async def prune_messages(self, created_before: int, stall_before: int) -> int: ...

    # what the running broker says about itself (``broker_info``)
    async def set_info(self, key: str, value: str, now_ms: int) -> None: ...
    async def get_info(self, key: str) -> str | None: ...

    # operators and tests
    async def counts(self) -> dict[str, int]: ...
