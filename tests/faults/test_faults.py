"""The bounded fault run of CI, deterministic replay (SevenDB DET-01), and the checker's teeth.

Each run makes a private PostgreSQL cluster (a PostgreSQL restart is one of the faults and
must not touch the shared server), a broker, three daemons behind a proxy, and local programs.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import unavailable
from tests.faults.checker import Ledger, SendResult, Stores, check
from tests.faults.harness import FaultRun, RunConfig
from tests.faults.pgcluster import unavailable_reason
from tests.faults.workload import FaultKind, Reuse, make_plan

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
    assert {f.kind for f in plan.faults} == set(FaultKind)
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
    assert set(report.faults) == set(FaultKind), "every fault kind fired at least once"
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
    accepted = [op for op in plan.sends if op.reuse is Reuse.NONE]
    for (recipient, sender), stream in first.items():
        sent = [(op.key, op.body) for op in accepted if op.sender == sender and (
            op.dest_ref == recipient or (op.dest_kind == "topic" and recipient != sender))]
        assert stream == sent, f"{sender} -> {recipient} not in send order"


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
