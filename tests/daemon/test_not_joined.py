"""A daemon that has joined no mesh serves IPC, and the routes that must ask the broker
(topics, queues, peers) answer 409 ``not_joined``, which says what to do, instead of a 503
"try again shortly" that waiting never makes true."""

from __future__ import annotations

from pathlib import Path

from tests.daemon.harness import run_cli, start_daemon
from tidemesh.core.exitcodes import Exit

BROKER_ROUTES = [("POST", f"/v1/{path}", {"name": "ops"}) for path in (
    "topics/create", "topics/subscribe", "topics/unsubscribe", "queues/consume",
    "queues/leave")] + [("GET", "/v1/peers", None)]


async def test_broker_routes_of_a_daemon_joined_to_no_mesh_say_so(short_tmp: Path) -> None:
    d = start_daemon(short_tmp)
    try:
        async with d.session() as s:
            for method, path, body in BROKER_ROUTES:
                async with s.request(method, path, json=body) as r:
                    assert r.status == 409, (path, r.status, await r.text())
                    error = (await r.json())["error"]
                assert error["code"] == "not_joined", path
                assert "tidemesh daemon join" in error["message"], path
            async with s.get("/v1/topics") as r:
                assert r.status == 200, "local reads need no broker"
            async with s.post("/v1/profile", json={"summary": "before joining"}) as r:
                assert r.status == 200 and (await r.json())["published"] is False
        cli = run_cli(short_tmp, "topic", "subscribe", "--mesh", "t", "ops")
        assert cli.returncode == Exit.CONFLICT, cli.stdout + cli.stderr
        assert cli.stderr.startswith("error: not_joined: this daemon has joined no mesh")
    finally:
        assert d.stop() == 0


async def test_a_file_share_of_a_daemon_joined_to_no_mesh_says_so(short_tmp: Path) -> None:
    d = start_daemon(short_tmp)
    src = short_tmp / "notes.txt"
    src.write_text("minutes\n")
    try:
        async with d.session() as s, s.post("/v1/file/share",
                                            json={"path": str(src), "to": "topic:ops"}) as r:
            assert r.status == 409, await r.text()
            assert (await r.json())["error"]["code"] == "not_joined"
    finally:
        assert d.stop() == 0
