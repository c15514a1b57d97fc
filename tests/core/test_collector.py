"""The server's collector settings take effect and keep the start's objects out of walks."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from tidemesh.core import collector


@pytest.fixture
def restored_gc() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


@pytest.mark.usefixtures("restored_gc")
def test_a_tuned_process_collects_young_objects_less_often_and_skips_the_frozen() -> None:
    collector.tune_for_server()
    assert gc.get_threshold() == collector.THRESHOLDS
    assert gc.get_threshold()[0] > 700          # CPython's default young generation
    assert gc.get_freeze_count() > 1000         # the modules and classes of the start
    # Cycles are still collected: a young collection finds one.
    a: list[object] = []
    a.append(a)
    del a
    assert gc.collect(0) >= 1
