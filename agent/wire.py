"""The server's stdout, counting what reached the pipe.

The SDK's stdio writer takes a message off its stream, writes it and flushes: a push acked
once ``send_notification`` returned was only handed to that writer, and a server killed in
between lost it (acked, never shown). The pusher waits on :meth:`Wire.flushed` instead.
Like the SDK's own default, fd 1 is served from a private duplicate and pointed at stderr,
so a stray print from a library cannot corrupt the protocol stream.
"""

from __future__ import annotations

import asyncio
import os
import sys
from io import TextIOWrapper

import anyio


class Wire:
    """An ``anyio.AsyncFile``-shaped stdout that counts the lines flushed to the pipe."""

    def __init__(self, marker: str) -> None:
        self._marker = marker
        fd = os.dup(1)
        os.dup2(2, 1)   # stray prints now go to stderr, not onto the wire
        sys.stdout = sys.stderr
        self._file = anyio.wrap_file(TextIOWrapper(os.fdopen(fd, "wb"), encoding="utf-8"))
        self._written = 0    # marked lines written, not yet flushed
        self._flushed = 0
        self._changed = asyncio.Event()

    async def write(self, text: str) -> int:
        if self._marker in text[:200]:
            self._written += 1
        return await self._file.write(text)

    async def flush(self) -> None:
        await self._file.flush()
        self._flushed, self._written = self._flushed + self._written, 0
        self._changed.set()

    def __getattr__(self, name: str) -> object:   # the rest of AsyncFile, unchanged
        return getattr(self._file, name)

    @property
    def flushed(self) -> int:
        """How many marked lines (the channel's notifications) reached the pipe."""
        return self._flushed

    async def wait_flushed(self, count: int) -> None:
        while self._flushed < count:
            self._changed.clear()
            await self._changed.wait()
