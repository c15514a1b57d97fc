"""The real daemon with one fault built in, chosen by ``TM_TEST_RIG``, for the tests of what
the daemon does when its own parts misbehave (a test launcher, never installed):

- ``stubborn``: the retention task ignores every cancel;
- ``thread``: the retention task waits in a thread that never returns;
- ``failing``: the retention task fails twice (a store restarting), then runs;
- ``block``: a route, ``GET /v1/test/block?s=N``, blocks the event loop for N seconds;
- ``ipc_v2``: the daemon speaks IPC API v2 (a future daemon, for the compatibility policy);
- ``new_clis``: the daemon works only with CLIs and SDKs of 9.x;
- ``pre_compat_v2``: a daemon older than ``GET /v1/compat`` (no such route) that speaks IPC
  API v2, which only its ``/v1/version`` says;
- ``rotate_kill:STEP``: ``daemon rotate-keypair`` (or the start that settles a pending
  rotation) is killed (-9) as soon as it has recorded STEP (``key_rotation.reached``).

Run as ``python rigged_daemon.py daemon up --foreground --mesh M`` (the CLI's arguments).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


async def _ignores_cancel(*_args: object, **_kw: object) -> None:
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            continue


async def _waits_in_a_thread(*_args: object, **_kw: object) -> None:
    await asyncio.to_thread(time.sleep, 3600)


_FAILURES = [RuntimeError("the store is restarting"), OSError("connection reset")]


async def _fails_twice(*_args: object, **_kw: object) -> None:
    if _FAILURES:
        raise _FAILURES.pop(0)
    await asyncio.Event().wait()


async def _block(request: web.Request) -> web.Response:
    seconds = float(request.query.get("s", "6"))
    time.sleep(seconds)  # the fault under test: the whole loop stops
    return web.json_response({"blocked_s": seconds})


def rig(kind: str) -> None:
    from tidemesh.core import compat
    from tidemesh.daemon import main as daemon_main
    from tidemesh.daemon.service.retention import RetentionService

    if kind == "stubborn":
        RetentionService.run = _ignores_cancel  # type: ignore[method-assign,assignment]
    elif kind == "thread":
        RetentionService.run = _waits_in_a_thread  # type: ignore[method-assign,assignment]
    elif kind == "failing":
        RetentionService.run = _fails_twice  # type: ignore[method-assign,assignment]
    elif kind == "block":
        build = daemon_main.build_app

        def build_app(max_body_bytes: int) -> web.Application:
            app = build(max_body_bytes)
            app.router.add_get("/v1/test/block", _block)
            return app

        daemon_main.build_app = build_app
    elif kind == "ipc_v2":
        compat.IPC_API = "v2"
    elif kind.startswith("rotate_kill:"):
        from tidemesh.daemon.membership import key_rotation

        step = kind.split(":", 1)[1]
        reached = key_rotation.reached

        def kill_at(name: str) -> None:
            reached(name)
            if name == step:
                os.kill(os.getpid(), signal.SIGKILL)

        key_rotation.reached = kill_at
    elif kind == "pre_compat_v2":
        from tidemesh.daemon.process import server

        compat.IPC_API = "v2"
        server.ROUTES = [r for r in server.ROUTES
                         if getattr(r, "path", None) != "/v1/compat"]
    elif kind == "new_clis":
        compat.COMPATIBLE_CLIS = ">=9.0.0,<10.0.0"
        compat.COMPATIBLE_SDKS = dict.fromkeys(compat.COMPATIBLE_SDKS, "9.x")
    else:
        raise SystemExit(f"unknown TM_TEST_RIG {kind!r}")


if __name__ == "__main__":
    rig(os.environ["TM_TEST_RIG"])
    from tidemesh.cli.main import main

    main()
