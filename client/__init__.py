"""The public Python SDK of a tidemesh daemon: its IPC surface (docs/ipc.md) as typed calls.

    from tidemesh.client import Client
    client = Client.for_mesh("team")
    client.send({"to": "topic:ops", "body": "deployed"}, idempotency_key="deploy-42")
    for entry in client.consume("billing", idle_timeout=5):
        ...                                   # acked when the loop moves on
    for item in client.events(since=0):       # resumes by Last-Event-ID across restarts
        ...

``Client`` blocks (``http.client``); ``AsyncClient`` is its asyncio twin (aiohttp). Both
find a daemon with ``for_mesh(name)`` as the CLI does, or take ``socket_path=``, or
``port=`` and ``token_file=`` for loopback TCP. Failures are the ``core.errors`` tree, and a
daemon that does not answer is ``DaemonNotRunning``, whose ``hint`` says how to start one.
docs/sdk.md has an example and the reference.

Layout: ``calls`` says what each call asks and how its answer reads, and ``stream`` parses
and resumes the event stream, both without I/O; ``sync`` and ``aio`` carry them over a
socket; ``endpoint`` finds the daemon; ``wire`` types the JSON bodies.
"""

from typing import TYPE_CHECKING, Any

from tidemesh.client.calls import Response
from tidemesh.client.errors import DaemonNotAnswering, DaemonNotRunning, IncompatibleDaemon
from tidemesh.client.stream import Event, Notice
from tidemesh.client.sync import Client
from tidemesh.client.wire import (
    AckResult,
    BatchResult,
    InboxEntry,
    InboxPage,
    Memberships,
    OutboxPage,
    PruneResult,
    RequeueResult,
    SendRequest,
    SendResult,
)
from tidemesh.core.paths import MeshNotChosen

if TYPE_CHECKING:
    from tidemesh.client.aio import AsyncClient


def __getattr__(name: str) -> Any:
    # AsyncClient pulls in aiohttp (about 0.25 s); a blocking program never pays for it.
    if name == "AsyncClient":
        from tidemesh.client.aio import AsyncClient

        return AsyncClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "AckResult",
    "AsyncClient",
    "BatchResult",
    "Client",
    "DaemonNotAnswering",
    "DaemonNotRunning",
    "Event",
    "InboxEntry",
    "InboxPage",
    "IncompatibleDaemon",
    "Memberships",
    "MeshNotChosen",
    "Notice",
    "OutboxPage",
    "PruneResult",
    "RequeueResult",
    "Response",
    "SendRequest",
    "SendResult",
]
