"""A store call whose cancel comes back as another error, as asyncpg's does for a query
cancelled on a connection PostgreSQL just dropped (found by the three-broker fault run)."""

from __future__ import annotations

import asyncio


class CancelAsOutage:
    """``call`` waits for good. The first cancel ends it with ``ConnectionResetError``;
    later ones stay cancels, so a test of code that loses the first can still end."""

    def __init__(self) -> None:
        self.calls = 0
        self.lost = False

    async def call(self, *_: object, **__: object) -> None:
        self.calls += 1
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if self.lost:
                raise
            self.lost = True
            raise ConnectionResetError("connection closed in the middle of operation") from None

    async def called(self, times: int = 1) -> None:
        """Until ``call`` has been entered ``times`` times."""
        while self.calls < times:
            await asyncio.sleep(0)
