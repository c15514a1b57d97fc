"""No single delivery can stop the inbox writer (docs/threat-model.md, "Poison DMs").

A frame is stored whole, in one transaction, as ever. When that fails, its deliveries are
tried one by one; one that fails alone (twice: a passing fault gets its second chance) is
stored as a dead entry in its place — its seq, ids and sender kept, its content dropped,
``meta.tidemesh_dead`` naming the reason — so the receive cursor passes it, it is acked, and
the ones after it arrive. If even the dead entry cannot be written, the fault is the
database's, not the message's: the error goes up and the link retries the frame later.
Consecutive failed writes degrade ``/v1/health`` (``WriteHealth``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Sequence

import structlog

from tidemesh.daemon.records import Delivery, StoreResult, Void

log = structlog.get_logger("tidemesh.daemon.inbox")

Item = Delivery | Void
Store = Callable[[Sequence[Item]], Awaitable[list[StoreResult | None]]]

# Failed frame writes in a row past which the daemon says it is unhealthy.
UNHEALTHY_AFTER = 3


@dataclasses.dataclass(slots=True)
class WriteHealth:
    """The inbox writer's record: failed frame writes in a row, the last error, and how
    many deliveries were stored dead since start."""

    failing: int = 0
    last_error: str | None = None
    last_failed_at_ms: int | None = None
    stored_dead: int = 0

    @property
    def healthy(self) -> bool:
        return self.failing < UNHEALTHY_AFTER

    def view(self) -> dict[str, object]:
        return {"healthy": self.healthy, "failing": self.failing,
                "last_error": self.last_error, "last_failed_at_ms": self.last_failed_at_ms,
                "stored_dead": self.stored_dead}

    def failed(self, exc: BaseException) -> None:
        self.failing += 1
        self.last_error = f"{type(exc).__name__}: {exc}"[:500]
        self.last_failed_at_ms = int(time.time() * 1000)


async def store_guarded(store: Store, items: Sequence[Item],
                        health: WriteHealth) -> list[StoreResult | None]:
    """``store(items)``; on failure, each item alone, and one that fails alone stored dead."""
    try:
        results = await store(items)
    except Exception as exc:
        health.failed(exc)
        log.error("inbox_write_failed", deliveries=len(items), error=repr(exc)[:300])
        results = [await _one(store, it, health) for it in items]
    health.failing = 0
    return results


async def _one(store: Store, item: Item, health: WriteHealth) -> StoreResult | None:
    for _ in range(2):
        try:
            return (await store([item]))[0]
        except Exception as exc:
            error = exc
    assert isinstance(item, Delivery)   # a void delivery writes nothing that can fail alone
    reason = f"{type(error).__name__}: {error}"[:500]
    result = (await store([dead(item, reason)]))[0]   # a failure here is the database's
    health.stored_dead += 1
    log.error("inbox_delivery_stored_dead", broker_message_id=item.broker_message_id,
              sender=item.sender_pubkey[:16], reason=reason)
    return result


def dead(d: Delivery, reason: str) -> Delivery:
    """``d`` as an entry that keeps its place, sender and ids but nothing it carried."""
    return dataclasses.replace(d, body=b"", body_encoding="base64", reply_to=None,
                               meta={"tidemesh_dead": reason}, hooks=())
