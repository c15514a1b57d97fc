"""The audit after key rotations, on stores a real broker and real daemons wrote.

A rotation moves the member's dedupe rows to its new key while its messages keep the key
that sent them; the audit must follow the member across its rotations (docs/audit.md) and
still find a message that really lost its dedupe row.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.harness import RunningDaemon, run_cli
from tests.e2e.harness import Mesh, connected, pubkey, team_on, two_on_topic, wait_for
from tests.spark.broker_stores import execute, scalar

TIDEMESH = [sys.executable, "-m", "tidemesh"]
SPARK_RUN_S = 200   # one audit in its own JVM (see test_audit_cli)

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(2 * SPARK_RUN_S + 120)]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def team(request: pytest.FixtureRequest, short_tmp: Path) -> Iterator[Mesh]:
    with team_on(request.param, request, short_tmp) as m:
        yield m


async def _send_all(alice: RunningDaemon, bob: str, label: str) -> None:
    before = len(alice.client.outbox_list(status="done")["items"])
    alice.client.send({"to": "topic:ops", "body": f"topic {label}"})
    alice.client.send({"to": {"kind": "dm", "ref": bob}, "body": f"dm {label}"})
    alice.client.send({"to": "queue:jobs", "body": f"job {label}"})
    await wait_for(lambda: len(alice.client.outbox_list(status="done")["items"]) >= before + 3)


async def _rotate(mesh: Mesh, label: str) -> RunningDaemon:
    assert mesh.daemons[label].stop() == 0
    res = run_cli(mesh.daemons[label].home, "daemon", "rotate-keypair", "--mesh", "m", "--json")
    assert res.returncode == 0, res.stderr + res.stdout
    d = mesh.restart(label)
    await wait_for(lambda: connected(d))
    return d


async def _scalar(store: str, sql: str) -> object:
    # The PostgreSQL helper runs its own event loop: off this test's.
    return await asyncio.to_thread(scalar, store, sql)


def _audit(store: str, out: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    proc = subprocess.run(
        [*TIDEMESH, "audit", "orphans", "--store", store, "--out", str(out), "--master",
         "local[2]", "--watermark-ms", str(time.time_ns() // 1_000_000), "--json"],
        capture_output=True, text=True, timeout=SPARK_RUN_S, check=False,
        env={**os.environ, "TIDEMESH_AUDIT_PARTITIONS": "2"})
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return proc, json.loads(proc.stdout)


async def test_audit_is_clean_after_a_member_rotated_twice_and_finds_a_real_orphan(
        team: Mesh, short_tmp: Path) -> None:
    alice, bob = await two_on_topic(team, short_tmp)
    async with bob.session() as s, s.post("/v1/queues/consume", json={"name": "jobs"}) as r:
        assert r.status == 200, await r.text()
    keys = [pubkey(alice)]
    await _send_all(alice, pubkey(bob), "first key")
    for n in ("second key", "third key"):
        alice = await _rotate(team, "a")
        keys.append(pubkey(alice))
        await _send_all(alice, pubkey(bob), n)
    assert len(set(keys)) == 3
    store = team.broker.store
    # What made the audit fire: the first key's messages stay, its dedupe rows moved.
    # Keys are hex from the daemons' key files.
    first, last = f"sender_pubkey = '{keys[0]}'", f"sender_pubkey <> '{keys[2]}'"
    assert await _scalar(store, f"SELECT count(*) FROM topic_message WHERE {first}") == 1  # noqa: S608
    assert await _scalar(store, f"SELECT count(*) FROM client_message_dedupe WHERE {last}") == 0  # noqa: S608

    proc, report = _audit(store, short_tmp / "out")
    assert proc.returncode == 0, (report, proc.stderr[-3000:])
    assert report["status"] == "clean" and report["found"] == 0 and report["orphans"] == []
    assert report["rows_checked"] > 0

    # A message of the first key whose dedupe row is really gone is still found, alone.
    lost = await _scalar(store, f"SELECT id FROM message_queue WHERE {first}"  # noqa: S608
                                " AND destination_kind = 'queue'")
    await asyncio.to_thread(execute, store, [
        ("DELETE FROM client_message_dedupe WHERE broker_message_id = ?", (lost,))])
    proc, report = _audit(store, short_tmp / "out")
    assert proc.returncode == 11, (report, proc.stderr[-3000:])
    assert [(o["kind"], o["row_key"], o["sender_pubkey"]) for o in report["orphans"]] == [
        ("message_without_dedupe", lost, keys[0])]
