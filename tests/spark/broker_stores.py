"""Broker stores for the audit tests, filled through the broker's own Store, damaged by SQL.

``fill`` runs real accepts (``Store.accept``, spec §4.7.2) and the broker's retention
(``prune_messages``, ``delete_expired_dedupe``), so the audit is tested against exactly the
rows the broker writes. The ``Damage`` helpers then break rows with plain SQL, each returning
the findings it must cause, written down by hand here rather than derived by any query.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tidemesh.broker.accept import AcceptInput
from tidemesh.broker.store import open_store
from tidemesh.core.ids import new_ulid

DAY = 86_400_000
NOW = 1_800_000_000_000          # fixed clock, > 2^31 like every real epoch-ms value
TTL_DAYS = 30
GRACE_MS = 15 * 60_000
WATERMARK = NOW - GRACE_MS

Finding = tuple[str, str, str]   # (kind, mesh_id, row_key)


def pubkey(name: str) -> str:
    return (name.encode().hex() * 64)[:64]


@dataclass(frozen=True, slots=True)
class Sent:
    """One accepted send and the rows the broker wrote for it."""

    mesh_id: str
    sender: str
    client_message_id: str
    broker_message_id: str
    history_id: str
    kind: str
    deliveries: tuple[str, ...]   # "recipient/epoch/seq"

    @property
    def dedupe_key(self) -> str:
        return f"{self.sender}/{self.client_message_id}"

    @property
    def delete_message_sql(self) -> str:
        table = "topic_message" if self.kind == "topic" else "message_queue"
        return f"DELETE FROM {table} WHERE id = ?"  # noqa: S608 - one of two fixed names


@dataclass(slots=True)
class Filled:
    url: str
    meshes: dict[str, str] = field(default_factory=dict)     # name -> mesh id
    sent: dict[str, Sent] = field(default_factory=dict)      # label -> send


SENDER, R1, R2 = pubkey("sender"), pubkey("r1"), pubkey("r2")

# label -> (mesh name, destination kind, age in ms). Ages put each send where retention and
# the watermark leave it: "pruned" is removed by prune_messages (its dedupe row lives on
# with history_available = false), "expired" keeps its message while its dedupe row is
# deleted by delete_expired_dedupe, "fresh" is still in flight at the watermark.
PLAN: dict[str, tuple[str, str, int]] = {
    **{f"a{i}": ("alpha", "topic", 2 * DAY + i) for i in range(1, 7)},
    "a_dm": ("alpha", "dm", 2 * DAY),
    "a_dm2": ("alpha", "dm", 2 * DAY + 7),
    **{f"b{i}": ("beta", "topic", 3 * DAY + i) for i in range(1, 4)},
    "b_dm": ("beta", "dm", 3 * DAY),
    "b_dm2": ("beta", "dm", 3 * DAY + 4),
    "b_q": ("beta", "queue", 3 * DAY),
    "pruned": ("alpha", "topic", 20 * DAY),
    "pruned_dm": ("beta", "dm", 20 * DAY),
    "expired": ("beta", "topic", (TTL_DAYS + 1) * DAY),
    "fresh": ("alpha", "topic", 60_000),
}


def _input(mesh_id: str, label: str, kind: str, at: int) -> AcceptInput:
    ref = {"topic": "general", "dm": R1, "queue": "jobs"}[kind]
    return AcceptInput(
        mesh_id=mesh_id, sender_pubkey=SENDER, client_message_id=f"cm-{label}", kind=kind,
        ref=ref, body=f"body {label}".encode(), body_encoding="utf8", priority="next",
        meta=None, reply_to=None, fingerprint=bytes(32), broker_message_id=new_ulid(at),
        history_id=new_ulid(at), now_ms=at, expires_at=at + TTL_DAYS * DAY,
    )


async def _fill(url: str, plan: dict[str, tuple[str, str, int]]) -> Filled:
    out = Filled(url)
    store = await open_store(url)
    try:
        for name in sorted({mesh for mesh, _, _ in plan.values()}):
            mesh = await store.create_mesh(name, NOW - 100 * DAY)
            out.meshes[name] = mesh.id
            for member in (SENDER, R1, R2):
                await store.add_member(mesh.id, member, NOW - 100 * DAY)
            await store.create_topic(mesh.id, "general", None, NOW - 100 * DAY)
            for member in (R1, R2):
                await store.subscribe(mesh.id, "general", member, NOW - 100 * DAY)
            await store.add_queue_consumer(mesh.id, "jobs", R2, NOW - 100 * DAY)
        # The sends to be pruned go first and the sweep runs before the rest, so that
        # "expired" (older, but sent after the sweep) keeps its message.
        order = sorted(plan.items(), key=lambda kv: (not kv[0].startswith("pruned"), -kv[1][2]))
        swept = False
        for label, (mesh_name, kind, age) in order:
            if not label.startswith("pruned") and not swept:
                await store.prune_messages(NOW - 10 * DAY, NOW - 10 * DAY)
                swept = True
            item = _input(out.meshes[mesh_name], label, kind, NOW - age)
            result = await store.accept(item)
            assert result.status == 201, (label, result)
            out.sent[label] = Sent(
                item.mesh_id, SENDER, item.client_message_id, item.broker_message_id,
                item.history_id, kind,
                # Delivery rows: a DM's or queue message's. A topic message has none (its
                # subscribers read the topic's log), so its deliveries have no seq yet.
                tuple(f"{d.recipient_pubkey}/{d.epoch}/{d.seq}" for d in result.deliveries
                      if d.seq))
        await store.delete_expired_dedupe(NOW)
    finally:
        await store.close()
    return out


def fill(url: str, plan: dict[str, tuple[str, str, int]] | None = None) -> Filled:
    return asyncio.run(_fill(url, PLAN if plan is None else plan))


def execute(url: str, statements: Iterable[tuple[str, Sequence[object]]]) -> None:
    """Run SQL (``?`` placeholders) against the store, outside the broker's code."""
    if url.startswith("sqlite:"):
        conn = sqlite3.connect(url.removeprefix("sqlite://"))
        try:
            with conn:
                for sql, args in statements:
                    conn.execute(sql, args)
        finally:
            conn.close()
        return
    asyncio.run(_execute_pg(url, list(statements)))


async def _execute_pg(url: str, statements: list[tuple[str, Sequence[object]]]) -> None:
    import asyncpg

    conn = await asyncpg.connect(url, server_settings={"search_path": "mesh"})
    try:
        async with conn.transaction():
            for sql, args in statements:
                await conn.execute(_numbered(sql), *args)
    finally:
        await conn.close()


def _numbered(sql: str) -> str:
    """``?`` placeholders as asyncpg's ``$1, $2, …``."""
    count = iter(range(1, 100))
    return re.sub(r"\?", lambda _: f"${next(count)}", sql)


class Damage:
    """Each method breaks one thing and returns the findings that breakage must produce."""

    def __init__(self, filled: Filled) -> None:
        self.filled = filled

    def _sent(self, label: str) -> Sent:
        return self.filled.sent[label]

    def drop_message_only(self, label: str) -> set[Finding]:
        """Delete the message row alone: checks 1, 3 (history side) and 4 all fire."""
        s = self._sent(label)
        execute(self.filled.url, [(s.delete_message_sql,
                                   (s.broker_message_id,))])
        return ({("dedupe_without_message", s.mesh_id, s.dedupe_key),
                 ("history_without_message", s.mesh_id, s.history_id)}
                | {("delivery_without_message", s.mesh_id, d) for d in s.deliveries})

    def drop_message_keep_dedupe(self, label: str) -> set[Finding]:
        """Check 1: message, history and deliveries gone, dedupe still claims history."""
        s = self._sent(label)
        execute(self.filled.url, [
            (s.delete_message_sql, (s.broker_message_id,)),
            ("DELETE FROM message_history WHERE broker_message_id = ?", (s.broker_message_id,)),
            ("DELETE FROM delivery_queue WHERE broker_message_id = ?", (s.broker_message_id,)),
        ])
        return {("dedupe_without_message", s.mesh_id, s.dedupe_key)}

    def drop_dedupe(self, label: str) -> set[Finding]:
        """Check 2: a young message loses its dedupe row."""
        s = self._sent(label)
        execute(self.filled.url, [(
            "DELETE FROM client_message_dedupe WHERE mesh_id = ? AND sender_pubkey = ?"
            " AND client_message_id = ?", (s.mesh_id, s.sender, s.client_message_id))])
        return {("message_without_dedupe", s.mesh_id, s.broker_message_id)}

    def drop_history(self, label: str) -> set[Finding]:
        """Check 3, message side."""
        s = self._sent(label)
        execute(self.filled.url, [("DELETE FROM message_history WHERE broker_message_id = ?",
                                   (s.broker_message_id,))])
        return {("message_without_history", s.mesh_id, s.broker_message_id)}

    def leave_history_only(self, label: str) -> set[Finding]:
        """Check 3, history side: everything but the history row is gone."""
        s = self._sent(label)
        execute(self.filled.url, [
            (s.delete_message_sql, (s.broker_message_id,)),
            ("DELETE FROM delivery_queue WHERE broker_message_id = ?", (s.broker_message_id,)),
            ("DELETE FROM client_message_dedupe WHERE broker_message_id = ?",
             (s.broker_message_id,)),
        ])
        return {("history_without_message", s.mesh_id, s.history_id)}

    def repoint_delivery(self, label: str) -> set[Finding]:
        """Check 4: one delivery row (a DM's or queue message's) now names a message that
        never existed."""
        s = self._sent(label)
        recipient, epoch, seq = s.deliveries[0].split("/")
        execute(self.filled.url, [(
            "UPDATE delivery_queue SET broker_message_id = ? WHERE mesh_id = ?"
            " AND recipient_pubkey = ? AND epoch = ? AND seq = ?",
            (new_ulid(NOW - DAY), s.mesh_id, recipient, int(epoch), int(seq)))])
        return {("delivery_without_message", s.mesh_id, s.deliveries[0])}


def scalar(url: str, sql: str) -> object:
    """One value read outside the broker's code (``mesh.`` is implied on PostgreSQL)."""
    if url.startswith("sqlite:"):
        conn = sqlite3.connect(url.removeprefix("sqlite://"))
        try:
            return conn.execute(sql).fetchone()[0]
        finally:
            conn.close()
    return asyncio.run(_scalar_pg(url, sql))


async def _scalar_pg(url: str, sql: str) -> object:
    import asyncpg

    conn = await asyncpg.connect(url, server_settings={"search_path": "mesh"})
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()
