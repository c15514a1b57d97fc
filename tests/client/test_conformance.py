"""The conformance scenario that every SDK runs (sdk/conformance/scenario.json), through the
Python SDK, against a real broker and two daemons found by mesh name."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.client.conformance import Runner, load, mismatch
from tests.daemon.harness import RunningDaemon, run_cli, start_daemon
from tests.e2e.harness import Broker
from tidemesh.client import Client

pytestmark = pytest.mark.slow


def _join(broker: Broker, root: Path, label: str, mesh: str) -> RunningDaemon:
    home = root / label
    home.mkdir()
    res = run_cli(home, "daemon", "join", broker.invite(mesh), "--mesh", mesh, "--name", label)
    assert res.returncode == 0, res.stderr + res.stdout
    return start_daemon(home, mesh)


def test_the_python_sdk_passes_the_conformance_scenario(sqlite_broker: Broker,
                                                        short_tmp: Path) -> None:
    scenario = load()
    mesh = scenario["mesh"]
    daemons = {label: _join(sqlite_broker, short_tmp, label, mesh)
               for label in scenario["daemons"]}

    def client(label: str) -> Client:
        tcp = scenario["daemons"][label]["transport"] == "tcp"
        return Client.for_mesh(mesh, tcp=tcp,
                               environ={"TIDEMESH_HOME": str(daemons[label].home)})

    def restart(label: str, kill: bool, while_down: Callable[[], None]) -> None:
        d = daemons[label]
        if kill:
            d.kill()
        else:
            assert d.stop() == 0, d.log.read_text()[-2000:]
        while_down()
        daemons[label] = start_daemon(d.home, mesh)

    try:
        Runner({label: client(label) for label in daemons}, restart).run(scenario["steps"])
    finally:
        for d in daemons.values():
            d.stop()


def test_the_matchers_say_what_differs() -> None:
    saved = {"row": "01J"}
    assert mismatch({"a": {"$ref": "row"}, "b": [1, {"$in": [2, 3]}]},
                    {"a": "01J", "b": [1, 3], "extra": True}, saved) is None
    assert mismatch({"a": {"$ref": "row"}}, {"a": "02K"}, saved) == "$.a: expected '01J', got '02K'"
    assert mismatch({"items": {"$len": 0}}, {"items": [1]}, saved) is not None
    assert mismatch({"x": {"$present": True}}, {}, saved) == "$.x: presence is not True"
    assert mismatch(["a"], ["a", "b"], saved) is not None
