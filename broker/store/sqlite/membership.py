"""Meshes, invites and members; topics, subscriptions and queue consumers (SQLite)."""

from __future__ import annotations

import sqlite3
from typing import Any

from tidemesh.broker.store.base import (
    Member,
    Mesh,
    MeshLimits,
    invite_refused,
    rotation_already,
    rotation_counts,
)
from tidemesh.broker.store.sqlite.base import SqliteBase
from tidemesh.broker.store.sqlite.topiclog import hand_out_on
from tidemesh.core.errors import Conflict, NotFound, UnknownDestination
from tidemesh.core.ids import new_ulid
from tidemesh.core.paths import check_name


class Membership(SqliteBase):
    async def create_mesh(self, name: str, now_ms: int) -> Mesh:
        check_name(name, field="name")   # joining hosts make it a folder name
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

    async def mesh_limits(self) -> dict[str, MeshLimits]:
        def fn(conn: sqlite3.Connection) -> dict[str, MeshLimits]:
            rows = conn.execute("SELECT id, member_rate, member_burst FROM mesh"
                                " WHERE member_rate IS NOT NULL OR member_burst IS NOT NULL")
            return {r[0]: MeshLimits(r[1], r[2]) for r in rows}

        return await self._read(fn)

    async def set_mesh_limits(self, mesh_id: str, limits: MeshLimits) -> None:
        await self._write(lambda c: c.execute(
            "UPDATE mesh SET member_rate = ?, member_burst = ? WHERE id = ?",
            (limits.member_rate, limits.member_burst, mesh_id)))

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

    async def mesh_member(self, mesh_id: str, pubkey: str
                          ) -> tuple[Mesh | None, Member | None]:
        def fn(conn: sqlite3.Connection) -> tuple[Mesh | None, Member | None]:
            row = conn.execute(MESH_MEMBER_SQL, (pubkey, mesh_id)).fetchone()
            if row is None:
                return None, None
            return Mesh(*row[:3]), (Member(*row[3:]) if row[3] is not None else None)

        return await self._read(fn)

    async def list_members(self, mesh_id: str) -> list[Member]:
        def fn(conn: sqlite3.Connection) -> list[Member]:
            rows = conn.execute(
                "SELECT mesh_id, pubkey, display_name, joined_at, revoked_at, rotated_to"
                " FROM member"
                " WHERE mesh_id = ? ORDER BY joined_at, pubkey", (mesh_id,)).fetchall()
            return [Member(*r) for r in rows]

        return await self._read(fn)

    async def members_named(self, mesh_id: str, name: str, limit: int) -> list[str]:
        return await self._read(lambda c: [str(r[0]) for r in c.execute(
            "SELECT pubkey FROM member WHERE mesh_id = ? AND display_name = ?"
            " AND revoked_at IS NULL AND rotated_to IS NULL ORDER BY joined_at, pubkey"
            " LIMIT ?", (mesh_id, name, limit))])

    async def revoked_since(self, since_ms: int) -> list[tuple[str, str]]:
        return await self._read(lambda c: [(str(m), str(p)) for m, p in c.execute(
            "SELECT mesh_id, pubkey FROM member WHERE revoked_at >= ?", (since_ms,))])

    async def revoke_member(self, mesh_id: str, pubkey: str, now_ms: int) -> bool:
        def fn(conn: sqlite3.Connection) -> bool:
            cur = conn.execute("UPDATE member SET revoked_at = ? WHERE mesh_id = ? AND pubkey = ?"
                               " AND revoked_at IS NULL", (now_ms, mesh_id, pubkey))
            return cur.rowcount > 0

        return await self._write(fn)

    async def leave_member(self, mesh_id: str, pubkey: str, now_ms: int
                           ) -> dict[str, int] | None:
        """A member's own leave, in one transaction: revoked as `member revoke` does, and its
        subscriptions, queue memberships and undelivered deliveries gone. None when it was
        not a live member. Its unacked queue deliveries stay, for the lease lapse to give
        to another consumer (deleting them would lose the message)."""
        def fn(conn: sqlite3.Connection) -> dict[str, int] | None:
            cur = conn.execute("UPDATE member SET revoked_at = ? WHERE mesh_id = ? AND pubkey = ?"
                               " AND revoked_at IS NULL", (now_ms, mesh_id, pubkey))
            if cur.rowcount == 0:
                return None
            subs = conn.execute("DELETE FROM topic_subscription WHERE mesh_id = ?"
                                " AND member_pubkey = ?", (mesh_id, pubkey)).rowcount
            queues = conn.execute("DELETE FROM queue_consumer WHERE mesh_id = ?"
                                  " AND member_pubkey = ?", (mesh_id, pubkey)).rowcount
            deliveries = conn.execute(LEAVE_DELIVERIES_SQL, (mesh_id, pubkey)).rowcount
            deliveries += conn.execute("DELETE FROM topic_delivery WHERE mesh_id = ?"
                                       " AND recipient_pubkey = ?", (mesh_id, pubkey)).rowcount
            return {"subscriptions": subs, "queues": queues, "deliveries": deliveries}

        return await self._write(fn)

    async def rotate_member(self, mesh_id: str, old_pubkey: str, new_pubkey: str,
                            now_ms: int) -> dict[str, Any]:
        def fn(conn: sqlite3.Connection) -> dict[str, Any]:
            if rotation_already(_member(conn, mesh_id, old_pubkey),
                                _member(conn, mesh_id, new_pubkey), new_pubkey):
                return {"already": True}
            # What the old key's topics logged is handed to it first, as to the old key:
            # its own messages among them stay undelivered to it, and the rest moves below.
            while hand_out_on(conn, [(mesh_id, old_pubkey)], now_ms).more:
                pass
            conn.execute("INSERT INTO member (mesh_id, pubkey, display_name, invite_id,"
                         " joined_at) SELECT mesh_id, ?, display_name, invite_id, joined_at"
                         " FROM member WHERE mesh_id = ? AND pubkey = ?",
                         (new_pubkey, mesh_id, old_pubkey))
            conn.execute("UPDATE member SET revoked_at = ?, rotated_to = ?, rotated_at = ?"
                         " WHERE mesh_id = ? AND pubkey = ?",
                         (now_ms, new_pubkey, now_ms, mesh_id, old_pubkey))
            spanned = conn.execute(SPANNED_SQL, (mesh_id, old_pubkey)).fetchone()[0]
            counts = [conn.execute(sql, (new_pubkey, mesh_id, old_pubkey)).rowcount
                      for sql in ROTATE_SQL]
            return {"already": False, **rotation_counts(counts, int(spanned))}

        return await self._write(fn)

    async def create_topic(self, mesh_id: str, name: str, by: str | None, now_ms: int) -> None:
        await self._write(lambda c: c.execute(
            "INSERT INTO topic (mesh_id, name, created_by, created_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT DO NOTHING", (mesh_id, name, by, now_ms)))

    async def subscribe(self, mesh_id: str, topic: str, pubkey: str, now_ms: int) -> None:
        def fn(conn: sqlite3.Connection) -> None:
            if not conn.execute("SELECT 1 FROM topic WHERE mesh_id = ? AND name = ?",
                                (mesh_id, topic)).fetchone():
                raise UnknownDestination(f"no topic {topic!r} in this mesh", field="name")
            # A new subscriber is given what its topic logs from now on.
            conn.execute("INSERT INTO topic_subscription (mesh_id, topic, member_pubkey,"
                         " subscribed_at, log_pos) SELECT ?1, ?2, ?3, ?4, last_pos FROM topic"
                         " WHERE mesh_id = ?1 AND name = ?2 ON CONFLICT DO NOTHING",
                         (mesh_id, topic, pubkey, now_ms))

        await self._write(fn)

    async def unsubscribe(self, mesh_id: str, topic: str, pubkey: str, now_ms: int) -> None:
        def fn(conn: sqlite3.Connection) -> None:
            # What the topic logged while subscribed is the member's: handed out first.
            while hand_out_on(conn, [(mesh_id, pubkey)], now_ms).more:
                pass
            conn.execute("DELETE FROM topic_subscription WHERE mesh_id = ? AND topic = ?"
                         " AND member_pubkey = ?", (mesh_id, topic, pubkey))

        await self._write(fn)

    async def add_queue_consumer(self, mesh_id: str, queue: str, pubkey: str,
                                 now_ms: int) -> None:
        await self._write(lambda c: c.execute(
            "INSERT INTO queue_consumer (mesh_id, queue, member_pubkey, registered_at)"
            " VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING", (mesh_id, queue, pubkey, now_ms)))

    async def remove_queue_consumer(self, mesh_id: str, queue: str, pubkey: str) -> None:
        await self._write(lambda c: c.execute(
            "DELETE FROM queue_consumer WHERE mesh_id = ? AND queue = ? AND member_pubkey = ?",
            (mesh_id, queue, pubkey)))


def _member(conn: sqlite3.Connection, mesh_id: str, pubkey: str) -> Member | None:
    row = conn.execute("SELECT mesh_id, pubkey, display_name, joined_at, revoked_at, rotated_to"
                       " FROM member WHERE mesh_id = ? AND pubkey = ?",
                       (mesh_id, pubkey)).fetchone()
    return Member(*row) if row else None


MESH_MEMBER_SQL = (
    "SELECT m.id, m.name, m.created_at, b.mesh_id, b.pubkey, b.display_name, b.joined_at,"
    " b.revoked_at, b.rotated_to FROM mesh m"
    " LEFT JOIN member b ON b.mesh_id = m.id AND b.pubkey = ? WHERE m.id = ?")
SPANNED_SQL = ("SELECT COALESCE(SUM(seq_last - seq_first + 1), 0) FROM topic_delivery"
               " WHERE mesh_id = ? AND recipient_pubkey = ?")

# Each takes (new, mesh_id, old), in the order ``rotation_counts`` reads: older keys of the
# member repointed at the newest, subscriptions (with their topic log positions), queue
# memberships, deliveries, dedupe rows, the cursor, the topic log's delivery spans. A queue
# delivery's lease moves with its row: the new key acks it as the old would have.
ROTATE_SQL = (
    "UPDATE member SET rotated_to = ? WHERE mesh_id = ? AND rotated_to = ?",
    "UPDATE topic_subscription SET member_pubkey = ? WHERE mesh_id = ? AND member_pubkey = ?",
    "UPDATE queue_consumer SET member_pubkey = ? WHERE mesh_id = ? AND member_pubkey = ?",
    "UPDATE delivery_queue SET recipient_pubkey = ? WHERE mesh_id = ?"
    " AND recipient_pubkey = ?",
    "UPDATE client_message_dedupe SET sender_pubkey = ? WHERE mesh_id = ?"
    " AND sender_pubkey = ?",
    "UPDATE recipient_cursor SET recipient_pubkey = ? WHERE mesh_id = ?"
    " AND recipient_pubkey = ?",
    "UPDATE topic_delivery SET recipient_pubkey = ? WHERE mesh_id = ?"
    " AND recipient_pubkey = ?",
)


LEAVE_DELIVERIES_SQL = """
DELETE FROM delivery_queue WHERE mesh_id = ? AND recipient_pubkey = ? AND acked_at IS NULL
  AND broker_message_id NOT IN (SELECT id FROM message_queue WHERE destination_kind = 'queue')
"""

INVITE_STATE_SQL = ("SELECT uses, max_uses, expires_at, revoked_at FROM invite"
                    " WHERE mesh_id = ? AND token_sha256 = ?")
