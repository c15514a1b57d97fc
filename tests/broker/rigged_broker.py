"""The real broker with a route that blocks its event loop, ``GET /test/block?s=N``, for the
watchdog's test (a test launcher, never installed). Run with the CLI's arguments.

``TM_TEST_RIG`` adds one fault for the key rotation's tests:

- ``no_key_rotation``: a broker from before the feature (not advertised, frame unknown);
- ``rotate_kill_before_commit``: killed (-9) on receiving ``key_rotate``, nothing written;
- ``rotate_kill_after_commit``: killed (-9) once the rotation committed, before it answers.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

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
    rig_rotation(os.environ.get("TM_TEST_RIG", ""))


def rig_rotation(kind: str) -> None:
    from tidemesh.broker.service.connections import Conn, now_ms
    from tidemesh.broker.service.rotation import Rotations
    from tidemesh.core import features

    if kind == "no_key_rotation":
        advertise = features.advertise

        def older(*args: Any) -> dict[str, Any]:
            return {k: v for k, v in advertise(*args).items() if k != features.KEY_ROTATION}

        features.advertise = older
    elif kind.startswith("rotate_kill_"):
        async def die(self: Rotations, conn: Conn, frame: dict[str, Any]) -> dict[str, Any]:
            if kind == "rotate_kill_after_commit":
                await self.store.rotate_member(conn.mesh_id, frame["old_pubkey"],
                                               frame["new_pubkey"], now_ms())
            os.kill(os.getpid(), signal.SIGKILL)
            raise AssertionError("unreachable")

        Rotations.rotate = die  # type: ignore[method-assign]


if __name__ == "__main__":
    rig()
    from tidemesh.cli.main import main

    main()
