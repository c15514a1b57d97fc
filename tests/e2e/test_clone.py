"""Clone detection with real daemons and a real broker: one member's data dir copied to a
second "host" (its own host fingerprint, TIDEMESH_HOST_ID), both daemons running."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sqlite3
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.harness import RunningDaemon, run_cli, start_daemon
from tests.e2e.harness import Broker, Mesh, connected, inbox, pubkey, wait_for
from tidemesh.daemon.membership import identity

pytestmark = pytest.mark.slow


@pytest.fixture(params=["warn", "refuse_new", "refuse_both"])
def policy_mesh(request: pytest.FixtureRequest, short_tmp: Path) -> Iterator[Mesh]:
    home = short_tmp / "broker"
    home.mkdir()
    broker = Broker(home, f"sqlite://{home}/broker.db",
                    env={"TIDEMESH_CLONE_POLICY": request.param})
    broker.cli("mesh", "create", "team")
    broker.start()
    m = Mesh(broker, "team")
    try:
        yield m
    finally:
        m.stop()


def _twins(mesh: Mesh, root: Path) -> tuple[RunningDaemon, Path, dict[str, str]]:
    """Daemon ``a`` joined and connected on host-a; ``b``'s home a copy of a's data made
    before a started (a cloned VM image), set to host-b and not started."""
    home_a, home_b = root / "a", root / "b"
    home_a.mkdir()
    res = run_cli(home_a, "daemon", "join", mesh.broker.invite(mesh.name), "--mesh", "m",
                  "--name", "a")
    assert res.returncode == 0, res.stderr + res.stdout
    shutil.copytree(home_a, home_b)
    # Each daemon writes its host's fingerprint on its first start (as on a fresh clone
    # after `tidemesh daemon accept-host`).
    a = start_daemon(home_a, "m", {identity.HOST_ID_ENV: "host-a"})
    mesh.daemons["a"] = a
    return a, home_b, {identity.HOST_ID_ENV: "host-b"}


async def _health(d: RunningDaemon) -> dict[str, Any]:
    async with d.session() as s, s.get("/v1/health") as r:
        return dict(await r.json())


def _events(d: RunningDaemon, type_: str) -> list[dict[str, Any]]:
    conn = sqlite3.connect(d.paths.inbox_db)
    try:
        rows = conn.execute("SELECT data FROM events WHERE type = ?", (type_,)).fetchall()
    finally:
        conn.close()
    return [json.loads(data) for (data,) in rows]


def _closes(d: RunningDaemon, code: int) -> int:
    return sum(1 for line in d.log.read_text().splitlines()
               if '"broker_link_closed"' in line and f'"code": {code}' in line)


def _broker_metric(b: Broker, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{b.port}/metrics", timeout=5).read()
    return sum(float(m.group(1)) for m in re.finditer(
        rf"^{name}{{[^}}]*}} (\S+)$", text.decode(), re.MULTILINE))


async def _daemon_metric(d: RunningDaemon, name: str) -> float:
    async with d.session() as s, s.get("/v1/metrics") as r:
        text = await r.text()
    return sum(float(m.group(1)) for m in re.finditer(
        rf"^{name}{{[^}}]*}} (\S+)$", text, re.MULTILINE))


async def test_clone_is_noticed_and_the_policy_decides(policy_mesh: Mesh,
                                                        short_tmp: Path) -> None:
    mesh = policy_mesh
    policy = mesh.broker.env["TIDEMESH_CLONE_POLICY"]
    a, home_b, env_b = _twins(mesh, short_tmp)
    await wait_for(lambda: connected(a))
    b = start_daemon(home_b, "m", env_b)
    mesh.daemons["b"] = b
    assert pubkey(a) == pubkey(b)

    try:
        await wait_for(lambda: _events(b, "clone_suspected"))
    except AssertionError:
        print((mesh.broker.home / "broker.out").read_text()[-4000:])
        print(b.log.read_text()[-4000:])
        raise
    assert _broker_metric(mesh.broker, "cm_broker_clone_suspected_total") >= 1
    assert '"member_clone_suspected"' in (mesh.broker.home / "broker.out").read_text()
    assert await _daemon_metric(b, "cm_daemon_clone_suspected_total") >= 1
    status = json.loads(run_cli(b.home, "daemon", "status", "--mesh", "m", "--json").stdout)
    assert status["clone_suspected"] is True and status["link_state"] == "clone_suspected"
    health_b = await _health(b)
    assert health_b["clone_suspected"] is True

    if policy == "warn":
        # Both stay connected, nobody takes the session from the other: no flapping.
        await wait_for(lambda: connected(b))
        await wait_for(lambda: _events(a, "clone_suspected"))   # the older one is told too
        assert await _daemon_metric(a, "cm_daemon_clone_suspected_total") >= 1
        told = _events(a, "clone_suspected")[0]
        assert told["how"] == "told" and told["receives_deliveries"] is False
        # The newest (b) receives the member's deliveries; a stays connected for its sends.
        c = mesh.add("c", short_tmp)
        await wait_for(lambda: connected(c))
        async with c.session() as s, s.post("/v1/send", json={
                "to": f"dm:{pubkey(a)}", "body": "to the member"}) as r:
            assert r.status in (200, 202), await r.text()
        await wait_for(lambda: _has_body(b, "to the member"))
        async with a.session() as s, s.post("/v1/send", json={
                "to": f"dm:{pubkey(c)}", "body": "from the older twin"}) as r:
            assert r.status in (200, 202), await r.text()
        await wait_for(lambda: _has_body(c, "from the older twin"))
        assert await connected(a) and await connected(b)
        assert not await _has_body(a, "to the member"), "deliveries go to one twin only"
        assert _closes(a, 4011) == 0 and _closes(b, 4011) == 0
        assert _closes(a, 4013) == 0 and _closes(b, 4013) == 0
    elif policy == "refuse_new":
        # b is refused (4013) and keeps retrying with backoff; a keeps its session.
        assert health_b["connected"] is False
        assert await connected(a)
        # Retried with backoff, refused each time: counted each time, one event for the spell.
        await wait_for(lambda: b.log.read_text().count('"event": "clone_suspected"') >= 2)
        assert b.proc.poll() is None, "retryable: the daemon does not exit"
        assert len(_events(b, "clone_suspected")) == 1
        assert await _daemon_metric(b, "cm_daemon_clone_suspected_total") >= 2
        assert _closes(a, 4013) == 0 and _closes(a, 4011) == 0
    else:
        # refuse_both: the live session of the other host is closed with the same reason,
        # and the key stays quarantined: a's reconnects are refused too, and neither twin
        # gets in while the other keeps trying (they took turns before).
        await wait_for(lambda: _closes(a, 4013) >= 1)
        await wait_for(lambda: _events(a, "clone_suspected"))
        for n in (2, 3):
            for d in (a, b):
                await wait_for(lambda d=d, n=n: d.log.read_text().count(
                    '"event": "clone_suspected"') >= n)
                health = await _health(d)
                assert health["connected"] is False and health["clone_suspected"] is True
        assert a.proc.poll() is None and b.proc.poll() is None
        assert len(_events(a, "clone_suspected")) == 1 and len(_events(b, "clone_suspected")) == 1


async def _has_body(d: RunningDaemon, body: str) -> bool:
    return any(item.get("body") == body for item in await inbox(d))


@pytest.fixture(params=["warn", "refuse_new", "refuse_both"])
def two_brokers(request: pytest.FixtureRequest, pg_database: str,
                short_tmp: Path) -> Iterator[tuple[Broker, Broker]]:
    pair = []
    for label in ("x", "y"):
        home = short_tmp / label
        home.mkdir()
        pair.append(Broker(home, pg_database, env={"TIDEMESH_CLONE_POLICY": request.param,
                                                   "TIDEMESH_LOG_FORMAT": "json"}))
    pair[0].cli("mesh", "create", "team")
    for b in pair:
        b.start()
    try:
        yield pair[0], pair[1]
    finally:
        for b in pair:
            b.kill()


@pytest.mark.postgres
async def test_clones_on_two_brokers_do_not_take_the_session_from_each_other(
        two_brokers: tuple[Broker, Broker], short_tmp: Path) -> None:
    """Before clone detection each took the session from the other (4011), in a loop."""
    x, y = two_brokers
    policy = x.env["TIDEMESH_CLONE_POLICY"]
    mesh = Mesh(x, "team")
    try:
        a, home_b, env_b = _twins(mesh, short_tmp)
        await wait_for(lambda: connected(a))
        mesh_file = next(home_b.rglob("mesh.json"))
        mesh_file.write_text(mesh_file.read_text().replace(x.url, y.url))
        b = start_daemon(home_b, "m", env_b)
        mesh.daemons["b"] = b
        await wait_for(lambda: _events(b, "clone_suspected"))
        assert _broker_metric(y, "cm_broker_clone_suspected_total") >= 1
        if policy == "refuse_both":
            # y asks x, over NOTIFY, to close a's session with the same reason, and x
            # quarantines the key too: a is refused when it comes back, instead of getting
            # straight back in until b's next retry closes it again.
            await wait_for(lambda: _closes(a, 4013) >= 1)
            await wait_for(lambda: _events(a, "clone_suspected"))
            assert (await _health(a))["connected"] is False
            assert a.proc.poll() is None and b.proc.poll() is None
            return
        await wait_for(lambda: _events(a, "clone_suspected"))   # told across the brokers
        if policy == "warn":
            await wait_for(lambda: connected(b))
        # A few seconds of both running: nobody is taken over, a keeps its session.
        for _ in range(30):
            await asyncio.sleep(0.1)
            assert await connected(a)
        assert _closes(a, 4011) == 0 and _closes(b, 4011) == 0
        if policy == "warn":
            assert await connected(b)
        else:
            assert not await connected(b) and _closes(b, 4013) == 0   # refused at the hello
            assert "clone_suspected" in b.log.read_text()
    finally:
        mesh.stop()


async def test_a_home_copied_on_the_same_host_is_refused_and_once_adopted_is_a_clone(
        mesh: Mesh, short_tmp: Path) -> None:
    """``cp -a`` of a stopped daemon's home on the same host: same machine id, same MAC,
    same files. The copy is refused at start; adopted with accept-host while the original
    runs, the broker tells them apart and one DM still reaches only one of them."""
    a = mesh.add("a", short_tmp)
    await wait_for(lambda: connected(a))
    assert a.stop() == 0
    copy = short_tmp / "copy"
    shutil.copytree(a.home, copy, symlinks=True, ignore=shutil.ignore_patterns(
        "sock", "*.lock", "*.out", "http.port"))
    up = run_cli(copy, "daemon", "up", "--mesh", "m")
    assert up.returncode == 4, up.stdout + up.stderr
    assert "is a copy of another data folder on this host" in up.stdout + up.stderr, up
    a = mesh.restart("a")   # the original starts as before
    await wait_for(lambda: connected(a))
    assert run_cli(copy, "daemon", "accept-host", "--mesh", "m").returncode == 0
    b = start_daemon(copy, "m")
    mesh.daemons["b"] = b
    await wait_for(lambda: _events(b, "clone_suspected"))
    c = mesh.add("c", short_tmp)
    await wait_for(lambda: connected(c))
    for i in range(5):
        async with c.session() as s, s.post("/v1/send", json={
                "to": f"dm:{pubkey(a)}", "body": f"once {i}"},
                headers={"Idempotency-Key": f"once-{i}"}) as r:
            assert r.status in (200, 202), await r.text()

    async def all_five() -> bool:
        got = [e["body"] for d in (a, b) for e in await inbox(d)
               if e["body"].startswith("once")]
        return len(set(got)) == 5

    await wait_for(all_five)
    await asyncio.sleep(1.0)
    got = [e["body"] for d in (a, b) for e in await inbox(d) if e["body"].startswith("once")]
    assert sorted(got) == [f"once {i}" for i in range(5)], "each DM consumed by one copy"
