"""The spec's ``POST /v1/topic/post`` and ``POST /v1/heartbeat`` are not served, by the
decision in docs/ipc.md ("Two routes of the spec's list not served"): both are 404
``not_found`` on both listeners, and a topic post is ``/v1/send`` to ``topic:NAME``."""

from __future__ import annotations

import aiohttp

from tests.daemon.harness import RunningDaemon


async def test_topic_post_and_heartbeat_are_404_and_send_covers_a_topic_post(
        daemon: RunningDaemon) -> None:
    tcp = f"http://127.0.0.1:{daemon.port}"
    auth = {"Authorization": f"Bearer {daemon.token}"}
    post = {"topic": "ops", "message": "hi"}
    async with daemon.session() as unix, aiohttp.ClientSession() as s:
        for path, body in (("/v1/topic/post", post), ("/v1/heartbeat", {})):
            async with unix.post(path, json=body) as r:
                assert r.status == 404 and (await r.json())["error"]["code"] == "not_found"
            async with s.post(tcp + path, json=body, headers=auth) as r:
                assert r.status == 404 and (await r.json())["error"]["code"] == "not_found"
        async with unix.post("/v1/send", json={"to": "topic:ops", "body": "hi",
                                               "meta": {"mentions": ["bob"]}}) as r:
            assert r.status == 202
    [row] = daemon.outbox_rows()
    assert (row["dest_kind"], row["dest_ref"]) == ("topic", "ops")
