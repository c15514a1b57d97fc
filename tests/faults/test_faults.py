"""The bounded fault run of CI, deterministic replay (SevenDB DET-01), and the checker's teeth.

Each run makes a private PostgreSQL cluster (a PostgreSQL restart is one of the faults and
must not touch the shared server), a broker, three daemons behind a proxy, and local programs;
the multi-broker run has three brokers on that database, each behind a proxy, and four daemons.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import sqlite3
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import unavailable
from tests.faults.checker import Ledger, Report, SendResult, Stores, check
from tests.faults.harness import FaultRun, RunConfig
from tests.faults.pgcluster import unavailable_reason
from tests.faults.workload import CLASSIC_FAULTS, FaultKind, FaultOp, Plan, Reuse, make_plan

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


@pytest.fixture(autouse=True)
def _needs_initdb() -> None:
    reason = unavailable_reason()
    if reason:
        unavailable(reason)


def test_a_seed_names_one_plan() -> None:
    assert make_plan(11, 300, 8) == make_plan(11, 300, 8)
    assert make_plan(11, 300, 8) != make_plan(12, 300, 8)
    plan = make_plan(7, 300, 8)
    assert {f.kind for f in plan.faults} == set(CLASSIC_FAULTS)
    assert {op.reuse for op in plan.sends} == set(Reuse)


@pytest.mark.spark
@pytest.mark.timeout(300)
async def test_bounded_fault_run_loses_duplicates_and_orphans_nothing(short_tmp: Path) -> None:
    if shutil.which("java") is None:
        unavailable("java is not installed (the Spark orphan audit needs it)")
    plan = make_plan(seed=2, sends=300, faults=8)  # its PostgreSQL restart is a crash
    report = await FaultRun(RunConfig(plan, short_tmp, settle_timeout=120)).run()
    print(report.table())
    assert report.ok, report.table()
    assert set(report.faults) == set(CLASSIC_FAULTS), "every fault kind fired at least once"
    assert report.counts["reuse_409"] > 0 and report.counts["reuse_same"] > 0
    assert report.counts["deliveries"] > 300


def _per_sender(order: dict[str, list[tuple[str, str, str]]]
                ) -> dict[tuple[str, str], list[tuple[str, str]]]:
    streams: dict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)
    for recipient, entries in order.items():
        for sender, cmid, body in entries:
            streams[(recipient, sender)].append((cmid, body))
    return dict(streams)


@pytest.mark.timeout(300)
async def test_det01_same_seed_twice_gives_the_same_streams_and_inboxes(short_tmp: Path) -> None:
    plan = make_plan(seed=31, sends=150, faults=0)
    runs = []
    for i in range(2):
        root = short_tmp / f"run{i}"
        root.mkdir()
        # One request at a time per program, so each sender's order is the plan's order.
        report = await FaultRun(RunConfig(plan, root, concurrency=1, audit=False)).run()
        assert report.ok, report.table()
        runs.append(report)
    first, second = (_per_sender(r.inbox_order) for r in runs)
    assert first == second, "per-recipient delivery order differs between replays"
    assert {k: sorted(v) for k, v in runs[0].inbox_order.items()} == \
        {k: sorted(v) for k, v in runs[1].inbox_order.items()}
    _assert_send_order(plan, runs[0])


def _log_events(log: Path) -> list[dict[str, Any]]:
    events = []
    for line in log.read_text().splitlines():
        with contextlib.suppress(ValueError):
            events.append(json.loads(line))
    return [e for e in events if isinstance(e, dict)]


def _assert_send_order(plan: Plan, report: Report, only: set[str] | None = None) -> None:
    """With one request at a time per program, each (sender, recipient) stream of the inboxes
    is exactly that sender's accepted sends to that recipient, in the plan's order (of the
    keys in ``only``, when given)."""
    accepted = [op for op in plan.sends if op.reuse is Reuse.NONE
                and (only is None or op.key in only)]
    for (recipient, sender), stream in _per_sender(report.inbox_order).items():
        kept = [(cmid, body) for cmid, body in stream if only is None or cmid in only]
        sent = [(op.key, op.body) for op in accepted if op.sender == sender and (
            op.dest_ref == recipient or (op.dest_kind == "topic" and recipient != sender))]
        assert kept == sent, f"{sender} -> {recipient} not in send order"


def _sent_once(run: FaultRun) -> set[str]:
    """The sends every daemon put on the wire once: those a lost link sent again went back
    to pending behind newer rows, and arrive where their retry was accepted (docs/broker.md,
    "Order"; docs/daemon.md, the sender)."""
    once = set()
    for node in run.nodes.values():
        with contextlib.closing(sqlite3.connect(node.daemon.paths.outbox_db)) as conn:
            once |= {cmid for (cmid,) in conn.execute(
                "SELECT client_message_id FROM outbox WHERE attempts = 1")}
    return once


@pytest.mark.timeout(300)
async def test_three_brokers_a_broker_killed_mid_stream_its_daemons_fail_over(
        short_tmp: Path) -> None:
    sends = 240
    random_faults = make_plan(seed=3, sends=sends, faults=6, daemons=4, brokers=3)
    # The first fault is forced: broker 0 is killed -9 with traffic flowing, while daemons
    # a and d (which start there) still use it. The seeded faults, one of each kind, follow.
    kill_at = sends // 4
    forced = FaultOp(kill_at, FaultKind.BROKER_KILL9, "0", 0.5)
    later = [dataclasses.replace(f, at_answered=kill_at + 1 + f.at_answered * 3 // 4)
             for f in random_faults.faults]
    plan = dataclasses.replace(random_faults, faults=[forced, *later])
    run = FaultRun(RunConfig(plan, short_tmp, concurrency=1, settle_timeout=90, audit=False,
                             brokers=3))
    report = await run.run()
    print(report.table())
    assert report.ok, report.table()
    assert report.brokers == 3 and len(run.nodes) == 4
    assert report.faults[FaultKind.BROKER_KILL9] >= 1
    assert report.counts["accepted"] > 150 and report.counts["reuse_409"] > 0
    killed = f"ws://127.0.0.1:{run.proxies[0].port}"
    for label in ("a", "d"):
        moves = [e for e in _log_events(run.nodes[label].daemon.log)
                 if e.get("event") == "broker_failed_over"]
        assert any(e["failed"] == killed for e in moves), f"{label} never left broker 0: {moves}"
    once = _sent_once(run)
    assert len(once) > 100, "the order check must cover most sends"
    _assert_send_order(plan, report, only=once)


@pytest.mark.timeout(300)
async def test_the_checker_catches_lost_duplicated_and_orphaned(short_tmp: Path) -> None:
    seen: list[str] = []

    async def tamper(ledger: Ledger, stores: Stores) -> None:
        base = ledger.results[0]
        ghost = dataclasses.replace(base.op, key="never-sent", index=10_000)
        lost = Ledger(**{**vars(ledger), "results": [
            *ledger.results, SendResult(ghost, 202, {}, 1)]})
        seen.append(str((await check(lost, stores, audit=False)).counts))
        forgotten = Ledger(**{**vars(ledger), "results": ledger.results[1:]})
        seen.append(str((await check(forgotten, stores, audit=False)).counts))
        twice = dataclasses.replace(stores, sse={k: v + v for k, v in stores.sse.items()})
        seen.append(str((await check(ledger, twice, audit=False)).counts))

    plan = make_plan(seed=5, sends=30, faults=0, reuse_pct=0.0)
    report = await FaultRun(RunConfig(plan, short_tmp, audit=False, after_check=tamper)).run()
    assert report.ok, report.table()
    assert "'lost'" in seen[0] and "'orphaned'" in seen[1] and "'duplicated'" in seen[2], seen


def _refused(run: FaultRun) -> list[dict[str, Any]]:
    return [e for b in run.brokers for e in _log_events(b.home / "broker.out")
            if e.get("event") == "broker_send_rate_limited"]


@pytest.mark.timeout(300)
async def test_under_a_send_budget_faults_lose_and_duplicate_nothing(short_tmp: Path) -> None:
    """The mesh has a small send budget, so daemons are answered 429 and the broker's gate
    holds their later sends back, while daemons, the broker, PostgreSQL and links fail."""
    plan = make_plan(seed=9, sends=240, faults=6)
    run = FaultRun(RunConfig(plan, short_tmp, settle_timeout=120, audit=False,
                             budget=(20.0, 10)))
    report = await run.run()
    print(report.table())
    assert report.ok, report.table()
    assert _refused(run), "the budget never refused a send: the run did not test it"


@pytest.mark.timeout(300)
async def test_under_a_send_budget_every_send_arrives_in_send_order(short_tmp: Path) -> None:
    """Without faults every send counts, those refused 429 and sent again included: the
    daemons pipeline frames behind refused ones, and the broker holds them back until the
    refused sends have come again."""
    plan = make_plan(seed=10, sends=200, faults=0)
    run = FaultRun(RunConfig(plan, short_tmp, concurrency=1, settle_timeout=120, audit=False,
                             budget=(20.0, 10)))
    report = await run.run()
    print(report.table())
    assert report.ok, report.table()
    assert _refused(run), "the budget never refused a send: the run did not test it"
    _assert_send_order(plan, report)
