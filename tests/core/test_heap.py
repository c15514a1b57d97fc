"""Trimming the heap after a burst: when (pure) and that the call works here."""

from __future__ import annotations

import sys

import pytest

from tidemesh.core import heap


def test_a_trim_is_due_once_a_burst_has_gone_quiet() -> None:
    policy = heap.TrimPolicy(threshold=100, quiet=10)
    # A burst of 200 goes quiet: one trim. Work after it trims again only once there is
    # enough of it and it too has gone quiet.
    totals = [0, 50, 120, 200, 205, 206, 290, 295, 295, 380, 307 + 100, 408]
    assert [policy.due(t) for t in totals] == [
        False, False, False, False, True, False, False, False, False, False, False, True]


def test_work_below_the_threshold_never_trims_however_quiet() -> None:
    policy = heap.TrimPolicy(threshold=100, quiet=10)
    assert not any(policy.due(t) for t in range(0, 99, 3))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_trim_calls_the_c_library() -> None:
    freed = [bytearray(4096) for _ in range(10_000)]
    del freed
    assert heap.trim() in (True, False)   # None only where there is no malloc_trim
