"""An outbox listing is bounded in bytes as an inbox page is (issue 47, item 6)."""

from __future__ import annotations

from pathlib import Path

from tests.daemon.local_app import local_app


async def test_an_outbox_listing_stops_at_its_byte_budget_and_pages_on(short_tmp: Path) -> None:
    async with local_app(short_tmp) as app, app.session() as s:
        for i in range(12):
            async with s.post("/v1/send", json={"to": "topic:ops", "body": "y" * 1_000_000},
                              headers={"Idempotency-Key": f"big-{i}"}) as r:
                assert r.status in (200, 202), await r.text()
        async with s.get("/v1/outbox?limit=1000") as r:
            first = await r.json()
        assert first["more"] is True and len(first["items"]) < 12
        async with s.get(f"/v1/outbox?limit=1000&before={first['next_before']}") as r:
            rest = await r.json()
    ids = [row["id"] for row in first["items"] + rest["items"]]
    assert len(ids) == len(set(ids)) == 12 and "more" not in rest
