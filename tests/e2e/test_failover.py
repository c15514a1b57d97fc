"""A mesh served by two brokers on one PostgreSQL: daemons learn both addresses from the
invite and, when the broker they use dies, fail over to the other with nothing lost or
repeated."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import tidemesh
from tests.daemon.harness import RunningDaemon, run_cli, start_daemon
from tests.e2e.harness import Broker, connected, inbox, pubkey, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


@pytest.fixture
def brokers(pg_database: str, short_tmp: Path) -> Iterator[tuple[Broker, Broker]]:
    pair = []
    for label in ("x", "y"):
        home = short_tmp / label
        home.mkdir()
        pair.append(Broker(home, pg_database))
    x, y = pair
    x.cli("mesh", "create", "team")
    x.start()
    y.start()
    try:
        yield x, y
    finally:
        for b in pair:
            b.kill()


def _join(home: Path, invite: str) -> RunningDaemon:
    home.mkdir()
    res = run_cli(home, "daemon", "join", invite, "--mesh", "m", "--name", home.name)
    assert res.returncode == 0, res.stderr
    return start_daemon(home, "m")


async def _send(d: RunningDaemon, to: str, cid: str) -> int:
    async with d.session() as s, s.post("/v1/send", json={"to": to, "body": cid},
                                        headers={"Idempotency-Key": cid}) as r:
        return r.status


async def _bodies(d: RunningDaemon) -> list[str]:
    return [e["body"] for e in await inbox(d)]


async def test_daemons_fail_over_to_the_next_broker_and_lose_nothing(
    brokers: tuple[Broker, Broker], short_tmp: Path
) -> None:
    x, y = brokers
    invite = x.cli("invite", "create", "--mesh", "team", "--uses", "5",
                   "--url", x.url, "--url", y.url)
    a, b = _join(short_tmp / "a", invite), _join(short_tmp / "b", invite)
    try:
        saved = json.loads(a.paths.mesh_file.read_text())
        assert (saved["broker_url"], saved["fallback_urls"]) == (x.url, [y.url])
        await wait_for(lambda: connected(a))
        await wait_for(lambda: connected(b))
        _on_broker(a, x.url)
        to = f"dm:{pubkey(b)}"
        for i in range(5):
            assert await _send(a, to, f"m{i:02}") == 202
        await wait_for(lambda: _has(b, 5))

        x.kill()  # kill -9: the daemons' next address is y
        for i in range(5, 20):  # accepted into the outbox whether or not a link is up
            assert await _send(a, to, f"m{i:02}") == 202
        await wait_for(lambda: _has(b, 20), timeout=60)
        assert await _bodies(b) == [f"m{i:02}" for i in range(20)]
        assert "broker_failed_over" in a.log.read_text()
        _on_broker(a, y.url)   # which broker it is on now, not the invite's first
        assert a.outbox_rows() and {r["status"] for r in a.outbox_rows()} == {"done"}
    finally:
        a.stop()
        b.stop()


def _on_broker(d: RunningDaemon, url: str) -> None:
    health = d.client.health()
    assert (health["broker_url"], health["broker_version"]) == (url, tidemesh.__version__)
    res = run_cli(d.home, "daemon", "status", "--mesh", "m", "--json")
    status = json.loads(res.stdout)
    assert (status["broker_url"], status["broker_version"]) == (url, tidemesh.__version__)


async def _has(d: RunningDaemon, n: int) -> bool:
    return len(await inbox(d)) >= n


async def test_a_join_that_brings_new_addresses_reaches_the_running_daemon(
    brokers: tuple[Broker, Broker], short_tmp: Path
) -> None:
    x, y = brokers
    a = _join(short_tmp / "a", x.cli("invite", "create", "--mesh", "team", "--url", x.url))
    try:
        await wait_for(lambda: connected(a))
        x.kill()   # its only broker: it keeps dialling the dead one
        again = run_cli(a.home, "daemon", "join",
                        y.cli("invite", "create", "--mesh", "team", "--url", x.url,
                              "--url", y.url), "--mesh", "m", "--name", "a")
        assert again.returncode == 0, again.stderr
        assert f"now dials {x.url}, {y.url}" in again.stderr
        await wait_for(lambda: connected(a), timeout=60)   # no restart
        _on_broker(a, y.url)
        assert "broker_addresses_reloaded" in a.log.read_text()
    finally:
        a.stop()


def test_config_show_broker_names_the_store_the_running_broker_was_given_as_a_flag(
    brokers: tuple[Broker, Broker]
) -> None:
    x, _ = brokers   # started with `broker up --store postgresql://…`
    res = run_cli(x.home, "config", "show", "--broker", "--json")
    assert res.returncode == 0, res.stderr
    rows = {r["name"]: r for r in json.loads(res.stdout)["settings"]}
    assert rows["broker.store"]["value"].startswith("postgresql://")
    assert rows["broker.store"]["source"].startswith("running broker (pid ")
    assert rows["broker.listen"]["value"] != "127.0.0.1:7800"
    x.kill()
    res = run_cli(x.home, "config", "show", "--broker", "--json")
    rows = {r["name"]: r for r in json.loads(res.stdout)["settings"]}
    assert rows["broker.store"]["source"].startswith("last run (pid ")
