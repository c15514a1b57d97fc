"""Meshes, invites and members; topics, subscriptions and queue consumers (PostgreSQL)."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from tidemesh.broker.store.base import (
    Member,
    Mesh,
    MeshLimits,
    invite_refused,
    rotation_already,
    rotation_counts,
)
from tidemesh.broker.store.postgres.base import PostgresBase
from tidemesh.broker.store.postgres.cluster import REVOKED_CHANNEL
from tidemesh.broker.store.postgres.topiclog import hand_out_on
from tidemesh.core.errors import Conflict, NotFound, UnknownDestination
from tidemesh.core.ids import new_ulid
from tidemesh.core.paths import check_name


class Membership(PostgresBase):
    async def create_mesh(self, name: str, now_ms: int) -> Mesh:
        check_name(name, field="name")   # joining hosts make it a folder name
        mesh = Mesh(new_ulid(now_ms), name, now_ms)
        try:
            await self.pool.execute("INSERT INTO mesh.mesh (id, name, created_at)"
                                    " VALUES ($1, $2, $3)", mesh.id, name, now_ms)
        except asyncpg.UniqueViolationError as exc:
            raise Conflict(f"a mesh named {name!r} exists already", field="name") from exc
        return mesh

    async def find_mesh(self, name_or_id: str) -> Mesh | None:
        r = await self.pool.fetchrow("SELECT id, name, created_at FROM mesh.mesh"
                                     " WHERE id = $1 OR name = $1", name_or_id)
        return Mesh(*r) if r else None

    async def mesh_limits(self) -> dict[str, MeshLimits]:
        rows = await self.pool.fetch("SELECT id, member_rate, member_burst FROM mesh.mesh"
                                     " WHERE member_rate IS NOT NULL OR member_burst IS NOT NULL")
        return {r[0]: MeshLimits(r[1], r[2]) for r in rows}

    async def set_mesh_limits(self, mesh_id: str, limits: MeshLimits) -> None:
        await self.pool.execute("UPDATE mesh.mesh SET member_rate = $1, member_burst = $2"
                                " WHERE id = $3", limits.member_rate, limits.member_burst, mesh_id)

    async def create_invite(self, mesh_id: str, token_sha256: bytes, max_uses: int,
                            expires_at: int | None, now_ms: int) -> str:
        invite_id = new_ulid(now_ms)
        await self.pool.execute(
            "INSERT INTO mesh.invite (id, mesh_id, token_sha256, max_uses, created_at,"
            " expires_at) VALUES ($1, $2, $3, $4, $5, $6)",
            invite_id, mesh_id, token_sha256, max_uses, now_ms, expires_at)
        return invite_id

    async def redeem_invite(self, mesh_id: str, token_sha256: bytes, pubkey: str,
                            display_name: str | None, now_ms: int) -> Member:
        async with self.pool.acquire() as conn, conn.transaction():
            existing = await _member(conn, mesh_id, pubkey)
            if existing is not None and existing.revoked_at is None:
                return existing
            if existing is not None:
                raise NotFound("this key was revoked from the mesh", reason="member_revoked")
            invite_id = await conn.fetchval(
                "UPDATE mesh.invite SET uses = uses + 1 WHERE mesh_id = $1 AND token_sha256 = $2"
                " AND revoked_at IS NULL AND uses < max_uses"
                " AND (expires_at IS NULL OR expires_at > $3) RETURNING id",
                mesh_id, token_sha256, now_ms)
            if invite_id is None:
                state = await conn.fetchrow(INVITE_STATE_SQL, mesh_id, token_sha256)
                raise invite_refused(state, now_ms)
            await conn.execute(
                "INSERT INTO mesh.member (mesh_id, pubkey, display_name, invite_id, joined_at)"
                " VALUES ($1, $2, $3, $4, $5)", mesh_id, pubkey, display_name, invite_id, now_ms)
            return Member(mesh_id, pubkey, display_name, now_ms, None)

    async def add_member(self, mesh_id: str, pubkey: str, now_ms: int) -> None:
        await self.pool.execute("INSERT INTO mesh.member (mesh_id, pubkey, joined_at)"
                                " VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                                mesh_id, pubkey, now_ms)

    async def get_member(self, mesh_id: str, pubkey: str) -> Member | None:
        async with self.pool.acquire() as conn:
            return await _member(conn, mesh_id, pubkey)

    async def mesh_member(self, mesh_id: str, pubkey: str
                          ) -> tuple[Mesh | None, Member | None]:
        r = await self.pool.fetchrow(MESH_MEMBER_SQL, mesh_id, pubkey)
        if r is None:
            return None, None
        return Mesh(*r[:3]), (Member(*r[3:]) if r[3] is not None else None)

    async def list_members(self, mesh_id: str) -> list[Member]:
        rows = await self.pool.fetch(
            "SELECT mesh_id, pubkey, display_name, joined_at, revoked_at, rotated_to"
                " FROM mesh.member"
            " WHERE mesh_id = $1 ORDER BY joined_at, pubkey", mesh_id)
        return [Member(*r) for r in rows]

    async def members_named(self, mesh_id: str, name: str, limit: int) -> list[str]:
        rows = await self.pool.fetch(
            "SELECT pubkey FROM mesh.member WHERE mesh_id = $1 AND display_name = $2"
            " AND revoked_at IS NULL AND rotated_to IS NULL ORDER BY joined_at, pubkey"
            " LIMIT $3", mesh_id, name, limit)
        return [str(r[0]) for r in rows]

    async def revoked_since(self, since_ms: int) -> list[tuple[str, str]]:
        rows = await self.pool.fetch("SELECT mesh_id, pubkey FROM mesh.member"
                                     " WHERE revoked_at >= $1", since_ms)
        return [(str(r[0]), str(r[1])) for r in rows]

    async def revoke_member(self, mesh_id: str, pubkey: str, now_ms: int) -> bool:
        async with self.pool.acquire() as conn, conn.transaction():
            done = await conn.execute(
                "UPDATE mesh.member SET revoked_at = $1 WHERE mesh_id = $2 AND pubkey = $3"
                " AND revoked_at IS NULL", now_ms, mesh_id, pubkey)
            if done.endswith(" 1"):
                await _notify_revoked(conn, mesh_id, pubkey)
        return bool(done.endswith(" 1"))

    async def leave_member(self, mesh_id: str, pubkey: str, now_ms: int
                           ) -> dict[str, int] | None:
        """As the SQLite store's: revoked, subscriptions, queue memberships and undelivered
        non-queue deliveries gone, in one transaction; None when not a live member."""
        async with self.pool.acquire() as conn, conn.transaction():
            done = await conn.execute(
                "UPDATE mesh.member SET revoked_at = $1 WHERE mesh_id = $2 AND pubkey = $3"
                " AND revoked_at IS NULL", now_ms, mesh_id, pubkey)
            if not done.endswith(" 1"):
                return None
            await _notify_revoked(conn, mesh_id, pubkey)
            subs = await conn.execute("DELETE FROM mesh.topic_subscription WHERE mesh_id = $1"
                                      " AND member_pubkey = $2", mesh_id, pubkey)
            queues = await conn.execute("DELETE FROM mesh.queue_consumer WHERE mesh_id = $1"
                                        " AND member_pubkey = $2", mesh_id, pubkey)
            deliveries = await conn.execute(LEAVE_DELIVERIES_SQL, mesh_id, pubkey)
            spans = await conn.execute("DELETE FROM mesh.topic_delivery WHERE mesh_id = $1"
                                       " AND recipient_pubkey = $2", mesh_id, pubkey)
            return {"subscriptions": _count(subs), "queues": _count(queues),
                    "deliveries": _count(deliveries) + _count(spans)}

    async def rotate_member(self, mesh_id: str, old_pubkey: str, new_pubkey: str,
                            now_ms: int) -> dict[str, Any]:
        """As the SQLite store's; the old key's live session row (several brokers) goes
        too: the member's next hello, with the new key, makes its own."""
        async with self.pool.acquire() as conn, conn.transaction():
            # The old row locked first: two rotations of one key are one after the other.
            old = await _member(conn, mesh_id, old_pubkey, lock=True)
            if rotation_already(old, await _member(conn, mesh_id, new_pubkey), new_pubkey):
                return {"already": True}
            # As the SQLite store: the old key's topic logs handed to it first.
            while (await hand_out_on(conn, [(mesh_id, old_pubkey)], now_ms)).more:
                pass
            await conn.execute(
                "INSERT INTO mesh.member (mesh_id, pubkey, display_name, invite_id, joined_at)"
                " SELECT mesh_id, $1, display_name, invite_id, joined_at FROM mesh.member"
                " WHERE mesh_id = $2 AND pubkey = $3", new_pubkey, mesh_id, old_pubkey)
            await conn.execute(
                "UPDATE mesh.member SET revoked_at = $4, rotated_to = $1, rotated_at = $4"
                " WHERE mesh_id = $2 AND pubkey = $3", new_pubkey, mesh_id, old_pubkey, now_ms)
            spanned = await conn.fetchval(SPANNED_SQL, mesh_id, old_pubkey)
            counts = [_count(await conn.execute(sql, new_pubkey, mesh_id, old_pubkey))
                      for sql in ROTATE_SQL]
            await conn.execute("DELETE FROM mesh.member_session WHERE mesh_id = $1"
                               " AND pubkey = $2", mesh_id, old_pubkey)
            return {"already": False, **rotation_counts(counts, int(spanned))}

    async def create_topic(self, mesh_id: str, name: str, by: str | None, now_ms: int) -> None:
        await self.pool.execute("INSERT INTO mesh.topic (mesh_id, name, created_by, created_at)"
                                " VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                                mesh_id, name, by, now_ms)

    async def subscribe(self, mesh_id: str, topic: str, pubkey: str, now_ms: int) -> None:
        try:
            await self.pool.execute(
                "INSERT INTO mesh.topic_subscription (mesh_id, topic, member_pubkey,"
                " subscribed_at, log_pos) VALUES ($1, $2, $3, $4, COALESCE((SELECT last_pos"
                " FROM mesh.topic WHERE mesh_id = $1 AND name = $2), 0))"
                " ON CONFLICT DO NOTHING",
                mesh_id, topic, pubkey, now_ms)
        except asyncpg.ForeignKeyViolationError as exc:
            raise UnknownDestination(f"no topic {topic!r} in this mesh", field="name") from exc

    async def unsubscribe(self, mesh_id: str, topic: str, pubkey: str, now_ms: int) -> None:
        async with self.pool.acquire() as conn, conn.transaction():
            # The topic first, as an accept locks it: nothing is logged between the hand-out
            # of what the topic logged while subscribed (the member's) and the delete.
            await conn.execute("SELECT 1 FROM mesh.topic WHERE mesh_id = $1 AND name = $2"
                               " FOR UPDATE", mesh_id, topic)
            while (await hand_out_on(conn, [(mesh_id, pubkey)], now_ms)).more:
                pass
            await conn.execute("DELETE FROM mesh.topic_subscription WHERE mesh_id = $1"
                               " AND topic = $2 AND member_pubkey = $3", mesh_id, topic, pubkey)

    async def add_queue_consumer(self, mesh_id: str, queue: str, pubkey: str,
                                 now_ms: int) -> None:
        await self.pool.execute(
            "INSERT INTO mesh.queue_consumer (mesh_id, queue, member_pubkey, registered_at)"
            " VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING", mesh_id, queue, pubkey, now_ms)

    async def remove_queue_consumer(self, mesh_id: str, queue: str, pubkey: str) -> None:
        await self.pool.execute("DELETE FROM mesh.queue_consumer WHERE mesh_id = $1"
                                " AND queue = $2 AND member_pubkey = $3", mesh_id, queue, pubkey)


LEAVE_DELIVERIES_SQL = """
DELETE FROM mesh.delivery_queue WHERE mesh_id = $1 AND recipient_pubkey = $2
  AND acked_at IS NULL
  AND broker_message_id NOT IN (SELECT id FROM mesh.message_queue
                                WHERE destination_kind = 'queue')
"""


def _count(status: str) -> int:
    """The row count of an asyncpg command status ("DELETE 3")."""
    return int(status.rsplit(" ", 1)[-1])


INVITE_STATE_SQL = ("SELECT uses, max_uses, expires_at, revoked_at FROM mesh.invite"
                    " WHERE mesh_id = $1 AND token_sha256 = $2")


MEMBER_SQL = ("SELECT mesh_id, pubkey, display_name, joined_at, revoked_at, rotated_to"
              " FROM mesh.member WHERE mesh_id = $1 AND pubkey = $2")
MESH_MEMBER_SQL = (
    "SELECT m.id, m.name, m.created_at, b.mesh_id, b.pubkey, b.display_name, b.joined_at,"
    " b.revoked_at, b.rotated_to FROM mesh.mesh m"
    " LEFT JOIN mesh.member b ON b.mesh_id = m.id AND b.pubkey = $2 WHERE m.id = $1")
MEMBER_LOCKED_SQL = ("SELECT mesh_id, pubkey, display_name, joined_at, revoked_at, rotated_to"
                     " FROM mesh.member WHERE mesh_id = $1 AND pubkey = $2 FOR UPDATE")

SPANNED_SQL = ("SELECT COALESCE(SUM(seq_last - seq_first + 1), 0) FROM mesh.topic_delivery"
               " WHERE mesh_id = $1 AND recipient_pubkey = $2")

# As the SQLite store's ROTATE_SQL, each taking ($1 new, $2 mesh_id, $3 old).
ROTATE_SQL = (
    "UPDATE mesh.member SET rotated_to = $1 WHERE mesh_id = $2 AND rotated_to = $3",
    "UPDATE mesh.topic_subscription SET member_pubkey = $1 WHERE mesh_id = $2"
    " AND member_pubkey = $3",
    "UPDATE mesh.queue_consumer SET member_pubkey = $1 WHERE mesh_id = $2"
    " AND member_pubkey = $3",
    "UPDATE mesh.delivery_queue SET recipient_pubkey = $1 WHERE mesh_id = $2"
    " AND recipient_pubkey = $3",
    "UPDATE mesh.client_message_dedupe SET sender_pubkey = $1 WHERE mesh_id = $2"
    " AND sender_pubkey = $3",
    "UPDATE mesh.recipient_cursor SET recipient_pubkey = $1 WHERE mesh_id = $2"
    " AND recipient_pubkey = $3",
    "UPDATE mesh.topic_delivery SET recipient_pubkey = $1 WHERE mesh_id = $2"
    " AND recipient_pubkey = $3",
)


async def _member(conn: Any, mesh_id: str, pubkey: str, lock: bool = False) -> Member | None:
    r = await conn.fetchrow(MEMBER_LOCKED_SQL if lock else MEMBER_SQL, mesh_id, pubkey)
    return Member(*r) if r else None


async def _notify_revoked(conn: Any, mesh_id: str, pubkey: str) -> None:
    """Every broker hears of it at the commit (NOTIFY is transactional) and closes the
    member's connections at once; the periodic one-statement look is the safety net."""
    await conn.execute("SELECT pg_notify($1, $2)", REVOKED_CHANNEL,
                       json.dumps({"m": mesh_id, "p": pubkey}, separators=(",", ":")))
