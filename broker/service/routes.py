"""The one table from a READY-phase frame type to its handler.

The session (``broker/session.py``) decides which frames are legal in which phase; this
table decides who handles each one; the server (``broker/server.py``) only carries it out.
Accepts are *pipelined*: the server starts one task per send, in frame order, under the
connection's in-flight limit, and answers when they have committed; every other frame is
handled before the next one is read.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tidemesh.broker.service.connections import Conn
from tidemesh.core.errors import TidemeshError
from tidemesh.core.wire import FrameType, error_frame

if TYPE_CHECKING:
    from tidemesh.broker.service import BrokerService

Frame = dict[str, Any]
Handler = Callable[[Conn, Frame], Coroutine[Any, Any, Frame | None]]


@dataclass(frozen=True, slots=True)
class Pipelined:
    """How a frame of sends is taken apart into accepts and its answer put together."""

    split: Callable[[Frame], list[Frame]]
    join: Callable[[Frame, list[Frame]], Frame]


@dataclass(frozen=True, slots=True)
class Route:
    handle: Handler                       # for a pipelined route: one send of the frame
    pipelined: Pipelined | None = None


SINGLE = Pipelined(split=lambda f: [f], join=lambda f, results: results[0])
BATCH = Pipelined(split=lambda f: list(f["sends"]),
                  join=lambda f, results: {"type": "send_results", "id": f["id"],
                                           "results": results})


def route_table(svc: BrokerService) -> dict[FrameType, Route]:
    return {
        FrameType.SEND: Route(svc.sends.send, SINGLE),
        FrameType.SEND_BATCH: Route(svc.sends.one_of_batch, BATCH),
        FrameType.REQUEST: Route(svc.destinations.request),
        FrameType.ACK: Route(svc.deliveries.ack),
        FrameType.RESUME: Route(svc.deliveries.resume),
        FrameType.PEERS: Route(svc.connections.peers),
        FrameType.PROFILE: Route(svc.connections.set_profile),
        FrameType.FEATURE_REQUEST: Route(svc.negotiation.negotiate),
    }


async def handle(route: Route, conn: Conn, frame: Frame) -> Frame | None:
    """Run a route that is not pipelined; a refused request gets an ``error`` frame and the
    connection lives on."""
    try:
        return await route.handle(conn, frame)
    except TidemeshError as exc:
        return error_frame(exc.code, exc.message, frame.get("id"),
                           **{k: v for k, v in exc.details.items() if k != "id"})
