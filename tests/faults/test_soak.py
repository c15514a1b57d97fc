"""The restart soak, bounded (``bench/soak.py`` runs 500 cycles by hand): every way a daemon
stops and every way its broker fails, in turn, under traffic; no hang, no unplanned exit,
nothing lost or duplicated."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import unavailable
from tests.faults.harness import FaultRun, RunConfig
from tests.faults.pgcluster import unavailable_reason
from tests.faults.workload import SOAK_FAULTS, make_soak_plan

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def test_the_soak_goes_round_every_fault() -> None:
    plan = make_soak_plan(3, 14, sends_per_cycle=10)
    assert [f.kind for f in plan.faults] == list(SOAK_FAULTS) * 2
    assert plan == make_soak_plan(3, 14, sends_per_cycle=10)


@pytest.mark.timeout(600)
async def test_bounded_soak_has_no_hang_and_loses_nothing(short_tmp: Path) -> None:
    reason = unavailable_reason()
    if reason:
        unavailable(reason)
    plan = make_soak_plan(seed=7, cycles=28, sends_per_cycle=12)
    report = await FaultRun(RunConfig(plan, short_tmp, concurrency=4, settle_timeout=120,
                                      audit=False, answer_within=5.0)).run()
    print(report.table())
    assert {f for f in report.faults} == set(SOAK_FAULTS)
    for bad in ("lost", "duplicated", "orphaned", "stuck", "wrong_answer", "out_of_order",
                "crashed", "hang"):
        assert report.counts[bad] == 0, report.table()
