"""The broker link ending while a request's frame is still being written.

The reader hands every waiting request the link's end (``LinkClosed``) and the writer raises
its own error to the caller, so the future the reader failed was never read: asyncio logged
"Future exception was never retrieved" for it when it was collected, one line per request
in flight on every link that closed under load (seen in ``bench/members``). And closing a
link cut off mid-write raised ``AttributeError`` from Python 3.11's own event loop."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection

from tests.daemon.test_link_resume import linked
from tidemesh.daemon.link.websocket import BrokerLink, LinkClosed


@contextmanager
def loop_errors() -> Iterator[list[str]]:
    """What the running loop would have logged as unhandled, collected after a GC pass."""
    seen: list[str] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, ctx: seen.append(str(ctx["message"])))
    try:
        yield seen
        gc.collect()
    finally:
        loop.set_exception_handler(None)


async def wait_for_close(ws: ServerConnection, _: dict[str, Any]) -> None:
    await ws.wait_closed()


class CutMidWrite(BrokerLink):
    """A link whose frame is still being written when the connection ends: the reader has
    failed every waiting request before the write fails."""

    async def _send(self, frame: dict[str, Any] | bytes) -> None:
        await self.ws.close()
        await self.wait_closed()
        raise LinkClosed("the broker link closed mid-write")


async def test_a_request_cut_off_mid_write_leaves_no_unread_error() -> None:
    with loop_errors() as unread:
        async with linked(wait_for_close, link_class=CutMidWrite) as link:
            with pytest.raises(LinkClosed, match="mid-write"):
                await asyncio.wait_for(link.request("topic_create", "ops"), 5)
    assert unread == []


async def test_a_link_cut_off_mid_write_closes_cleanly() -> None:
    """A frame over the broker's 1 MiB limit: the broker closes (1009) while most of it is
    still in our buffers, and the link's close then finds the connection already gone."""
    with loop_errors() as unread:
        for _ in range(3):
            async with linked(wait_for_close) as link:
                with pytest.raises(LinkClosed):
                    await asyncio.wait_for(link.request("topic_create", "x" * (8 << 20)), 10)
    assert unread == []
