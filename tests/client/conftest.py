"""A real broker with two joined daemons (alice, bob) of mesh ``team``, for the SDK's tests."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.daemon.conftest import daemon  # noqa: F401 - a lone daemon, for calls needing no broker
from tests.daemon.harness import RunningDaemon, run_cli, start_daemon
from tests.e2e.conftest import sqlite_broker  # noqa: F401 - mesh "team" on an SQLite broker
from tests.e2e.harness import Broker
from tidemesh.client import Client

MESH = "team"


@dataclass
class Team:
    broker: Broker
    alice: RunningDaemon
    bob: RunningDaemon

    def restart(self, d: RunningDaemon, while_down: Callable[[], object] = lambda: None,
                kill: bool = False) -> RunningDaemon:
        """Stop ``d`` (SIGKILL with ``kill``), run ``while_down``, and start a new process on
        the same files."""
        if kill:
            d.kill()
        else:
            assert d.stop() == 0, d.log.read_text()[-2000:]
        while_down()
        again = start_daemon(d.home, MESH)
        setattr(self, d.home.name, again)
        wait_connected(again)
        return again


def client(d: RunningDaemon) -> Client:
    return Client(d.paths.socket, mesh=MESH)


def wait_until(check: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def wait_connected(d: RunningDaemon) -> None:
    wait_until(lambda: client(d).health()["connected"])


def publish(sender: RunningDaemon, *bodies: str) -> None:
    """Send each body to topic ``deploys`` under its own id."""
    for body in bodies:
        client(sender).send({"to": "topic:deploys", "body": body}, f"id-{body}")


def wait_inbox(d: RunningDaemon, n: int) -> None:
    wait_until(lambda: len(client(d).inbox(limit=1000)["items"]) >= n)


def _join(broker: Broker, root: Path, label: str) -> RunningDaemon:
    home = root / label
    home.mkdir()
    res = run_cli(home, "daemon", "join", broker.invite(MESH), "--mesh", MESH, "--name", label)
    assert res.returncode == 0, res.stderr + res.stdout
    return start_daemon(home, MESH)


@pytest.fixture
def team(sqlite_broker: Broker, short_tmp: Path) -> Iterator[Team]:  # noqa: F811 - fixture
    """Both daemons of mesh ``team`` connected, and subscribed to topic ``deploys``."""
    t = Team(sqlite_broker, _join(sqlite_broker, short_tmp, "alice"),
             _join(sqlite_broker, short_tmp, "bob"))
    try:
        for d in (t.alice, t.bob):
            wait_connected(d)
        client(t.alice).membership("topic", "subscribe", "deploys", create=True)
        client(t.bob).membership("topic", "subscribe", "deploys")
        yield t
    finally:
        for d in (t.alice, t.bob):
            d.stop()
