"""The real broker with a route that blocks its event loop, ``GET /test/block?s=N``, for the
watchdog's test (a test launcher, never installed). Run with the CLI's arguments."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def rig() -> None:
    from websockets.asyncio.server import ServerConnection
    from websockets.http11 import Request, Response

    from tidemesh.broker.server import BrokerServer

    http = BrokerServer.http

    def blocking_http(self: BrokerServer, connection: ServerConnection,
                      request: Request) -> Response | None:
        if request.path.startswith("/test/block"):
            time.sleep(float(request.path.rsplit("=", 1)[-1]))  # the fault under test
            return connection.respond(200, "blocked\n")
        return http(self, connection, request)

    BrokerServer.http = blocking_http  # type: ignore[method-assign]


if __name__ == "__main__":
    rig()
    from tidemesh.cli.main import main

    main()
