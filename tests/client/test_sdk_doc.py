"""Every Python block of docs/sdk.md runs as written, against a real broker and daemon; and
the event types it and `tidemesh events --help` name are every type the daemon emits."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.client.conftest import Team, _join, client, publish, wait_inbox, wait_until
from tests.daemon.harness import RunningDaemon, run_cli
from tests.e2e.harness import Broker

DOCS = Path(__file__).resolve().parents[2] / "docs"
SDK_DOC = DOCS / "sdk.md"
pytestmark = pytest.mark.slow


def blocks() -> list[str]:
    """Every Python block of docs/sdk.md, verbatim, in order."""
    found = re.findall(r"```python\n(.*?)```", SDK_DOC.read_text("utf-8"), re.DOTALL)
    assert found, "docs/sdk.md has no Python example"
    return found


def example() -> str:
    """The first Python block under "## Example"."""
    section = SDK_DOC.read_text("utf-8").split("## Example", 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found, "docs/sdk.md has no Python example"
    return found.group(1)


def _run(block: str) -> None:
    exec(compile(block, str(SDK_DOC), "exec"), {"__name__": "sdk_example"})  # noqa: S102


def test_the_example_sends_consumes_with_acks_and_follows_events(
        team: Team, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    publish(team.bob, "build 41 passed", "build 42 passed")
    wait_inbox(team.alice, 2)
    monkeypatch.setenv("TIDEMESH_HOME", str(team.alice.home))  # alice's host

    _run(example())

    out = capsys.readouterr().out.splitlines()
    assert "sent deploy-v42 queued" in out
    consumed = [line.split(" ", 3)[3] for line in out if line.startswith("consumed ")]
    assert consumed == ["build 41 passed", "build 42 passed"]
    assert sum(line.endswith(" message") for line in out if line.startswith("event ")) == 2
    assert client(team.alice).inbox(consumer="audit-log")["items"] == [], "all acked"
    wait_until(lambda: [e["body"] for e in client(team.bob).inbox()["items"]][-1:] == [
        "v42 is live"])


@pytest.fixture
def newcomer(sqlite_broker: Broker, short_tmp: Path) -> Iterator[RunningDaemon]:
    """A host that has just joined mesh ``team``, where no topic exists yet."""
    d = _join(sqlite_broker, short_tmp, "alice")
    try:
        wait_until(lambda: client(d).health()["connected"])
        yield d
    finally:
        d.stop()


def test_every_block_runs_as_written_for_a_new_member(
        newcomer: RunningDaemon, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TIDEMESH_HOME", str(newcomer.home))
    found = blocks()
    assert len(found) >= 3
    for block in found:
        _run(block)
    out = capsys.readouterr().out.splitlines()
    assert "sent deploy-v42 queued" in out and "sent deploy-v43 queued" in out
    assert "batch ['queued', 'queued', 'queued']" in out
    assert "shared notes.txt 1 chunk(s)" in out and "got True" in out
    # Nothing the examples sent is left dead: each went where it was meant to (a shared
    # file's announcement is one send).
    wait_until(lambda: client(newcomer).outbox_list()["counts"]["done"] == 6)
    assert client(newcomer).outbox_list()["counts"]["dead"] == 0


def _ipc_event_types() -> list[str]:
    row = next(line for line in (DOCS / "ipc.md").read_text("utf-8").splitlines()
               if line.startswith("| `GET /v1/events`"))
    return re.findall(r"`(\w+)`", row.split("|")[2])


def test_sdk_doc_and_events_help_name_every_event_type() -> None:
    types = _ipc_event_types()
    assert "hook_failed" in types and "message" in types
    section = SDK_DOC.read_text("utf-8").split("### `events(since)`", 1)[1].split("\n\n")[1]
    helped = run_cli(Path("/nonexistent"), "events", "--help").stdout
    for t in types:
        assert f"`{t}`" in section, t
        assert t in helped, t
