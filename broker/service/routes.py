"""The one table from a READY-phase frame type to its handler.

The session (``broker/session.py``) decides which frames are legal in which phase; this
table decides who handles each one; the server (``broker/server.py``) only carries it out.
Accepts are *pipelined*: the server starts one task per frame (a ``send`` or a whole
``send_batch``, one store operation either way), in arrival order, under the connection's
in-flight limit, and answers when it has committed; every other frame is handled before the
next one is read.
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
class Route:
    handle: Handler
    # For a pipelined route (the accepts): how many sends the frame carries, which is how
    # many of the connection's in-flight permits it holds until answered.
    sends: Callable[[Frame], int] | None = None


def one(frame: Frame) -> int:
    return 1


def carried(frame: Frame) -> int:
    return len(frame["sends"])


def route_table(svc: BrokerService) -> dict[FrameType, Route]:
    return {
        FrameType.SEND: Route(svc.sends.send, one),
        FrameType.SEND_BATCH: Route(svc.sends.send_batch, carried),
        FrameType.REQUEST: Route(svc.destinations.request),
        FrameType.ACK: Route(svc.deliveries.ack),
        FrameType.RESUME: Route(svc.deliveries.resume),
        FrameType.PEERS: Route(svc.connections.peers),
        FrameType.PROFILE: Route(svc.connections.set_profile),
        FrameType.FEATURE_REQUEST: Route(svc.negotiation.negotiate),
        FrameType.FILE_OPEN: Route(svc.files.open),
        FrameType.FILE_CHUNK: Route(svc.files.chunk),
        FrameType.FILE_CLOSE: Route(svc.files.close),
        FrameType.FILE_FETCH: Route(svc.files.fetch),
        FrameType.KEY_ROTATE: Route(svc.rotations.rotate),
    }


async def handle(route: Route, conn: Conn, frame: Frame) -> Frame | None:
    """Run a route that is not pipelined; a refused request gets an ``error`` frame and the
    connection lives on."""
    try:
        return await route.handle(conn, frame)
    except TidemeshError as exc:
        return error_frame(exc.code, exc.message, frame.get("id"),
                           **{k: v for k, v in exc.details.items() if k != "id"})
