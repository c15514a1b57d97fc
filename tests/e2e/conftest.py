from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import Broker, Mesh, sqlite_broker_with_team, team_on


@pytest.fixture
def sqlite_broker(short_tmp: Path) -> Iterator[Broker]:
    b = sqlite_broker_with_team(short_tmp)
    b.start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def mesh(sqlite_broker: Broker, short_tmp: Path) -> Iterator[Mesh]:
    m = Mesh(sqlite_broker, "team")
    try:
        yield m
    finally:
        for label, d in m.daemons.items():
            code = d.proc.poll()
            if code not in (None, 0, -9):
                print(f"--- daemon {label} exited {code}:\n{d.log.read_text()[-3000:]}")
            d.stop()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def any_mesh(request: pytest.FixtureRequest, short_tmp: Path) -> Iterator[Mesh]:
    """Mesh ``team`` on a started broker, once on each store (SQLite, PostgreSQL)."""
    with team_on(request.param, request, short_tmp) as m:
        yield m
