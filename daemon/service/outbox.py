"""Use cases of the send path: accept a send, list and inspect the outbox, requeue a row.

Knows nothing of HTTP: it takes validated values and returns plain dicts, a ``SendOutcome``
(the HTTP layer chooses its status and body), or raises the ``core.errors`` tree. Never
imports aiohttp or websockets.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

import orjson
import structlog

from tidemesh.core.accept import Action
from tidemesh.core.errors import InvalidRequest, TidemeshError
from tidemesh.core.fingerprint import prefix, request_fingerprint
from tidemesh.core.ids import client_message_id_problem, new_ulid, ordered_ulid, ordered_ulids
from tidemesh.core.names import is_key
from tidemesh.core.outcome import Settlement
from tidemesh.core.send import DestinationKind, SendRequest
from tidemesh.daemon.records import (
    BatchItem,
    BoundRow,
    Claimed,
    OutboxRow,
    SendKind,
    SendOutcome,
)
from tidemesh.daemon.store import outbox
from tidemesh.daemon.store.db import Connection, Database

log = structlog.get_logger(__name__)
Clock = Callable[[], float]
# (recipient ed25519 pubkey hex, body, body_encoding) -> sealed bytes
Sealer = Callable[[SendRequest, str], SendRequest]  # (request, client_message_id): sealed
# Raises to refuse a send before it is stored (the pre-send hook: 403 send_vetoed).
Gate = Callable[[SendRequest], Awaitable[None]]


class Hand(Protocol):
    """The sender of the live link, offering to take a lone send straight from its accept:
    the row is inserted already claimed (inflight) in the accept's own transaction, so an
    idle daemon's message costs no claim transaction of its own before it goes out."""

    def reserve(self) -> bool:
        """A place on the wire for one row, if the sender waits with nothing on the wire and
        nothing accepted before is still waiting for its claim (so the row keeps its place)."""

    def take(self, row: Claimed) -> bool:
        """Put the reserved row on the wire; False if the session ended meanwhile."""

    def release(self) -> None:
        """Give a reserved place back (the accept inserted nothing, or failed)."""


# The accept table's actions as the service reports them.
KINDS = {Action.INSERT: SendKind.NEW, Action.ACCEPTED: SendKind.REPLAY,
          Action.DUPLICATE: SendKind.DUPLICATE, Action.CONFLICT: SendKind.CONFLICT}


def _bound(res: outbox.AcceptResult, new: outbox.NewRow) -> BoundRow:
    """The row the id is bound to: the one this accept inserted, or the one it found."""
    row = res.existing
    if row is None:
        return BoundRow(res.outbox_id, "pending", prefix(new.fingerprint),
                        dest_kind=new.dest_kind)
    return BoundRow(row.id, row.status, prefix(row.fingerprint), row.broker_message_id,
                    row.history_id, row.last_error, row.dest_kind)


def _item_refusal(exc: TidemeshError) -> TidemeshError:
    """A 4xx refuses one send of a batch; a 5xx is the daemon's own and fails the batch."""
    if exc.http_status >= 500:
        raise exc
    return exc


def fingerprint_of(req: SendRequest) -> bytes:
    return request_fingerprint(req.to.kind.value, req.to.ref, req.body, req.priority.value,
                               req.meta, req.reply_to, req.meta_jcs)


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def row_view(row: OutboxRow, chain: list[str] | None = None) -> dict[str, Any]:
    """An outbox row as operators see it (times ISO-8601 UTC, fingerprint as a prefix)."""
    view: dict[str, Any] = {
        "id": row.id,
        "client_message_id": row.client_message_id,
        "status": row.status,
        "attempts": row.attempts,
        "enqueued_at": _iso(row.enqueued_at),
        "next_attempt_at": _iso(row.next_attempt_at),
        "delivered_at": _iso(row.delivered_at),
        "last_error": row.last_error,
        "broker_message_id": row.broker_message_id,
        "history_id": row.history_id,
        "aborted_at": _iso(row.aborted_at),
        "aborted_by": row.aborted_by,
        "superseded_by": row.superseded_by,
        "supersedes": row.supersedes,
        "to": {"kind": row.dest_kind, "ref": row.dest_ref},
        "request_fingerprint_prefix": prefix(row.request_fingerprint),
        "payload_bytes": len(row.payload),
    }
    if chain is not None:
        view["chain"] = chain
    return view


class OutboxService:
    def __init__(self, db: Database, clock: Clock = time.time,
                 sealer: Sealer | None = None, admit: Callable[[], None] | None = None,
                 gate: Gate | None = None) -> None:
        self.db = db
        self.gate = gate
        self.clock = clock
        self.sealer = sealer
        # Raises (507) while new sends must be refused, e.g. under the disk floor.
        self.admit = admit
        # Set when a new row lands, so the sender wakes without polling.
        self.accepted = asyncio.Event()
        # The live link's sender while it runs (``Hand``); None between sessions.
        self.hand: Hand | None = None

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def _new_row(
        self, req: SendRequest, cmid: str, supersedes: str | None = None,
        row_id: str | None = None, now: int | None = None, claimed: bool = False,
    ) -> outbox.NewRow:
        now = self._now_ms() if now is None else now
        return outbox.NewRow(
            id=row_id or ordered_ulid(now), client_message_id=cmid,
            fingerprint=fingerprint_of(req),
            payload=orjson.dumps(self._sealed(req, cmid).to_payload()), dest_kind=req.to.kind.value,
            dest_ref=req.to.ref, now_ms=now, supersedes=supersedes, claimed=claimed,
        )

    def _sealed(self, req: SendRequest, cmid: str) -> SendRequest:
        """DMs are sealed once, here, and stored sealed; the fingerprint stays the
        plaintext's so a caller's retry still matches. Sealing is deterministic per
        (recipient, id, body), so the cold path seals a retry to the same bytes."""
        if req.to.kind is not DestinationKind.DM:
            return req
        if self.sealer is None:
            raise RuntimeError("a DM was accepted without a sealing key")
        return self.sealer(req, cmid)

    async def submit(self, req: SendRequest) -> SendOutcome:
        """Accept one send (spec §4.5.1): what the accept table made of it, with its row."""
        if self.admit is not None:
            self.admit()
        if self.gate is not None:
            await self.gate(req)
        hand = self.hand
        if hand is None or not hand.reserve():
            new = self._new_row(req, req.client_message_id or new_ulid())
            return self._outcome(await self.db.submit(outbox.ACCEPT, new), new)
        try:
            new = self._new_row(req, req.client_message_id or new_ulid(), claimed=True)
            res = await self.db.submit(outbox.ACCEPT, new)
        except BaseException:
            hand.release()
            raise
        if res.outcome.action is not Action.INSERT:
            hand.release()
        elif not hand.take(Claimed(new.id, new.client_message_id, new.payload, 1)):
            # The session ended between the reservation and the commit: the row waits,
            # pending, for the next one (whose start may already have released the rest).
            try:
                await self.db.write(lambda conn: outbox.unclaim(conn, new.id), durable=False)
            except TidemeshError as exc:   # the send is stored: a restart releases the row
                log.warning("outbox_unclaim_failed", outbox_id=new.id, error=str(exc))
            self.accepted.set()
        return self._outcome(res, new)

    async def submit_many(self, items: Sequence[BatchItem]) -> list[SendOutcome | TidemeshError]:
        """Accept a batch as if each send came on its own, in order, and all in one outbox
        transaction: the answer of each, or the 4xx that refused it (kept from ``items``,
        or the pre-send hook's veto). A refusal of the whole batch (the disk floor, the
        database) raises, and then nothing was stored."""
        if self.admit is not None:
            self.admit()
        gated = [await self._gated(it) for it in items]
        # Row ids rising in request order: the sender sends by (due time, id).
        now = self._now_ms()
        ids = iter(ordered_ulids(sum(isinstance(g, SendRequest) for g in gated), now))
        prepared = [g if isinstance(g, TidemeshError) else self._batch_row(g, next(ids), now)
                    for g in gated]
        rows = [p for p in prepared if isinstance(p, outbox.NewRow)]
        # One write: the whole batch commits in one transaction, each decided in order.
        results = await self.db.write(lambda conn: outbox.accept_many(conn, rows)) if rows else []
        accepted = iter(zip(results, rows, strict=True))
        return [p if isinstance(p, TidemeshError) else self._outcome(*next(accepted))
                for p in prepared]

    async def _gated(self, item: BatchItem) -> BatchItem:
        """The item, or the 4xx the pre-send hook refused it with (403 send_vetoed)."""
        if self.gate is None or isinstance(item, TidemeshError):
            return item
        try:
            await self.gate(item)
        except TidemeshError as exc:
            return _item_refusal(exc)
        return item

    def _batch_row(self, req: SendRequest, row_id: str, now: int) -> outbox.NewRow | TidemeshError:
        """The row of one send of a batch, or the 4xx sealing refused it with (a DM key that
        is no member's)."""
        try:
            return self._new_row(req, req.client_message_id or new_ulid(now), row_id=row_id,
                                 now=now)
        except TidemeshError as exc:
            return _item_refusal(exc)

    def _outcome(self, res: outbox.AcceptResult, new: outbox.NewRow) -> SendOutcome:
        oc = res.outcome
        if oc.action is Action.INSERT and not new.claimed:
            self.accepted.set()
        return SendOutcome(
            KINDS[oc.action], new.client_message_id, prefix(new.fingerprint), _bound(res, new),
            queue_status=oc.status, conflict=oc.conflict, shows_broker_id=oc.with_broker_id,
            shows_reason=oc.with_reason,
        )

    async def list_rows(
        self, status: str | None = None, limit: int = 50, before: str | None = None
    ) -> dict[str, Any]:
        def _read(conn: Connection) -> dict[str, Any]:
            rows = outbox.list_rows(conn, status, limit, before)
            view: dict[str, Any] = {"items": [row_view(r) for r in rows],
                                    "counts": outbox.counts(conn)}
            if 0 < len(rows) < limit and outbox.list_rows(conn, status, 1, rows[-1].id):
                view["more"] = True   # cut by the byte budget: page on with before=next_before
                view["next_before"] = rows[-1].id
            return view

        return await self.db.read(_read)

    async def snapshot(self) -> tuple[dict[str, int], int]:
        """Counts by status and the lag: how long the oldest unsent row has waited (ms)."""
        def _read(conn: Connection) -> tuple[dict[str, int], int | None]:
            return outbox.counts(conn), outbox.oldest_unsent(conn)

        counts, oldest = await self.db.read(_read)
        return counts, 0 if oldest is None else max(0, self._now_ms() - oldest)

    async def inspect(self, row_id: str) -> dict[str, Any]:
        """One row, its requeue chain, and the request it sends (the stored payload)."""
        def _read(conn: Connection) -> dict[str, Any]:
            row = outbox.get(conn, row_id)
            return {**row_view(row, outbox.chain(conn, row_id)),
                    "request": orjson.loads(row.payload)}

        return await self.db.read(_read)

    async def requeue(
        self, row_id: str, new_client_message_id: str | None = None,
        patch: SendRequest | None = None, aborted_by: str = "operator",
    ) -> dict[str, Any]:
        """Spec §4.5.3: abort ``row_id`` and queue a successor under a fresh id, atomically."""
        cmid = new_client_message_id or new_ulid()
        problem = client_message_id_problem(cmid)
        if problem:
            raise InvalidRequest(f"new_client_message_id {problem}", field="new_client_message_id")
        if patch is not None and patch.to.kind is DestinationKind.DM and not is_key(patch.to.ref):
            raise InvalidRequest("a requeue's patch names a DM's member by its full key (a name "
                                 "or prefix is resolved only at a send)", field="patch_payload.to")
        if patch is not None and self.gate is not None:
            # A new body is a new send: the pre-send hook's veto holds for it too.
            await self.gate(dataclasses.replace(patch, client_message_id=cmid))
        now = self._now_ms()

        def _requeue(conn: Connection) -> str:
            old = outbox.get(conn, row_id)
            if patch is not None:
                new = self._new_row(patch, cmid, supersedes=row_id)
            else:
                new = outbox.NewRow(
                    id=ordered_ulid(now), client_message_id=cmid,
                    fingerprint=old.request_fingerprint, payload=old.payload,
                    dest_kind=old.dest_kind, dest_ref=old.dest_ref, now_ms=now,
                    supersedes=row_id,
                )
            outbox.requeue(conn, row_id, new, aborted_by)
            return new.id

        new_id = await self.db.write(_requeue)
        self.accepted.set()
        return {"aborted_row_id": row_id, "new_row_id": new_id, "new_client_message_id": cmid}

    # -- the sender's side ---------------------------------------------------------------

    async def record_max_age(self, max_age_ms: int) -> None:
        """Keep the max age the broker's dedupe window allows (retention reads it)."""
        now = self._now_ms()
        await self.db.write(lambda conn: outbox.set_meta(conn, outbox.MAX_AGE_MS, max_age_ms, now))

    async def claim(self, limit: int, max_age_ms: int
                    ) -> tuple[list[Claimed], list[Settlement]]:
        now = self._now_ms()
        # Not durable: a claim a power cut undoes leaves the rows pending, sent again, and
        # the broker answers the resend; no sync of its own on the path of a message.
        return await self.db.write(
            lambda conn: outbox.claim_due(conn, now, limit, max_age_ms), durable=False)

    async def release_inflight(self) -> int:
        """Rows a previous session put on the wire and never settled go back to pending."""
        now = self._now_ms()
        return await self.db.write(lambda conn: outbox.reset_inflight(conn, now, 0))

    async def settle_many(self, settlements: list[Settlement]) -> list[bool]:
        # Not durable, as the claim: a settlement lost to a power cut is made again from
        # the broker's answer to the resend (a duplicate carries the same message id).
        return await self.db.write(lambda conn: outbox.settle_many(conn, settlements),
                                   durable=False)

    async def next_due(self) -> int | None:
        return await self.db.read(outbox.next_due)

    async def dead_to_notify(self) -> list[dict[str, Any]]:
        return await self.db.read(lambda conn: [row_view(r) for r in outbox.dead_unnotified(conn)])

    async def mark_notified(self, row_ids: list[str]) -> None:
        now = self._now_ms()
        await self.db.write(lambda conn: outbox.mark_notified(conn, row_ids, now))
