from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import Broker, Mesh, sqlite_broker_with_team


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
    home = short_tmp / "broker"
    home.mkdir()
    store = (f"sqlite://{home}/broker.db" if request.param == "sqlite"
             else request.getfixturevalue("pg_database"))
    broker = Broker(home, store)
    broker.cli("mesh", "create", "team")
    broker.start()
    m = Mesh(broker, "team")
    try:
        yield m
    finally:
        for d in m.daemons.values():
            d.stop()
        broker.stop()
