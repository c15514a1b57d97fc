"""Use cases of the receive side: store a delivery once, page the inbox, named consumers,
and the durable event log that SSE streams replay."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import structlog

from tidemesh.core.errors import InvalidRequest
from tidemesh.core.hooks import HookPlan
from tidemesh.daemon.service.events import EventBus
from tidemesh.daemon.service.inbox_writes import WriteHealth, store_guarded
from tidemesh.daemon.store import files, handled, inbox, retention, search
from tidemesh.daemon.store.db import Connection, Database

Clock = Callable[[], float]
log = structlog.get_logger(__name__)


class InboxService:
    def __init__(self, db: Database, bus: EventBus, clock: Clock = time.time,
                 hooks: HookPlan | None = None, search_enabled: bool = True) -> None:
        self.db = db
        # [inbox] fts_enabled, which open_inbox applied to the index.
        self.search_enabled = search_enabled
        self.bus = bus
        self.clock = clock
        # The hooks an event fires are recorded in the transaction that stores it.
        self.hooks = hooks if hooks is not None else HookPlan({}, enabled=False)
        self.write_health = WriteHealth()

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    async def store(self, delivery: inbox.Delivery) -> inbox.StoreResult:
        """Store one delivery: a frame of one."""
        result = (await self.store_frame([delivery]))[0]
        assert result is not None
        return result

    async def store_frame(self, items: Sequence[inbox.Delivery | inbox.Void]
                          ) -> list[inbox.StoreResult | None]:
        """Store one broker frame's deliveries in one transaction, whole or not at all
        (group-committed with other frames); publish their events after COMMIT. None for a
        void delivery, which only moves the receive cursor. A frame that fails is stored
        delivery by delivery, one that fails alone as dead (``inbox_writes``)."""
        items = [self._with_hooks(d) if isinstance(d, inbox.Delivery) else d for d in items]
        results = await store_guarded(self._store, items, self.write_health)
        for result in results:
            if result is not None and result.event is not None:
                self.bus.publish(result.event)
                for extra in result.extra:
                    self.bus.publish(extra)
        return results

    async def _store(self, items: Sequence[inbox.Delivery | inbox.Void]
                     ) -> list[inbox.StoreResult | None]:
        return await self.db.submit(
            files.STORE_FRAMES, (items, self.hooks.for_event("file_shared", {})))

    def _with_hooks(self, d: inbox.Delivery) -> inbox.Delivery:
        hooks = self.hooks.for_message(d.dest_kind, d.dest_ref)
        # dataclasses.replace costs more than the rest of the loop's work per delivery.
        return d if hooks == d.hooks else dataclasses.replace(d, hooks=hooks)

    async def record_event(self, type_: str, data: dict[str, Any],
                           dedupe_key: str | None = None) -> inbox.Event | None:
        ev = inbox.NewEvent(type_, data, self._now_ms(), dedupe_key,
                            self.hooks.for_event(type_, data))
        stored = await self.db.write(partial(inbox.add_event, ev=ev))
        if stored is not None:
            self.bus.publish(stored)
        return stored

    async def page(self, p: inbox.Page) -> dict[str, Any]:
        if p.q is not None and not self.search_enabled:
            raise InvalidRequest("inbox search is off on this daemon ([inbox] fts_enabled = "
                                 "false): no index to search; drop q", field="q",
                                 reason="search_disabled")
        items = await self.db.read(partial(search.page, p=p))
        return {"items": items, "next_after": items[-1]["seq"] if items else (p.after or 0),
                "more": items.cut}

    async def consumer_read(self, name: str, p: inbox.Page) -> dict[str, Any]:
        def _read(conn: Connection) -> dict[str, Any]:
            cursor = inbox.consumer_cursor(conn, name)
            items = inbox.page(conn, inbox.Page(cursor, p.limit, p.topic, p.sender))
            out: dict[str, Any] = {"consumer": name, "cursor": cursor, "items": items,
                                   "more": items.cut}
            lost = inbox.consumer_loss(conn, name)
            if lost is not None:
                out["lost"] = lost
            return out

        return await self.db.read(_read)

    async def consumer_ack(self, name: str, up_to: int) -> dict[str, Any]:
        now = self._now_ms()
        cursor = await self.db.write(partial(inbox.consumer_ack, name=name, up_to=up_to, now=now))
        return {"consumer": name, "cursor": cursor}

    async def session_register(self, name: str) -> dict[str, Any]:
        await self.db.write(partial(inbox.session_register, name=name, now=self._now_ms()))
        return next(s for s in await self.sessions() if s["name"] == name)

    async def sessions(self) -> list[dict[str, Any]]:
        return await self.db.read(inbox.sessions)

    async def session_remove(self, name: str) -> bool:
        return await self.db.write(partial(inbox.session_remove, name=name))

    async def consumers(self) -> list[dict[str, Any]]:
        return await self.db.read(inbox.consumers)

    async def events_after(self, after: int, limit: int = 500) -> list[inbox.Event]:
        return await self.db.read(partial(inbox.events_after, after=after, limit=limit))

    async def last_event_id(self) -> int:
        return await self.db.read(inbox.last_event_id)

    async def event_bounds(self) -> tuple[int, int]:
        """(highest event id retention removed, newest event id given): a stream may resume
        after any id between them."""
        def _read(conn: Connection) -> tuple[int, int]:
            return retention.events_pruned_through(conn), inbox.last_event_id(conn)

        return await self.db.read(_read)

    async def receive_cursor(self) -> tuple[int, int] | None:
        return await self.db.read(inbox.receive_cursor)

    async def record_handled(self, epoch: int, acked_seq: int) -> None:
        """The broker's acknowledged position, taken as handled by an earlier inbox."""
        now = self._now_ms()
        if await self.db.write(partial(handled.record, epoch=epoch, acked_seq=acked_seq,
                                       now=now)):
            log.info("inbox_handled_mark_recorded", epoch=epoch, acked_seq=acked_seq)

    async def reset_receive_cursor(self, epoch: int, seq: int) -> None:
        now = self._now_ms()
        await self.db.write(partial(inbox.reset_receive_cursor, epoch=epoch, seq=seq, now=now))

    async def profile(self) -> dict[str, Any]:
        return await self.db.read(inbox.profile_get)
