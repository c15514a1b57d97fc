"""The example of docs/sdk.md runs as written, against a real broker and daemon."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.client.conftest import Team, client, publish, wait_inbox, wait_until

SDK_DOC = Path(__file__).resolve().parents[2] / "docs" / "sdk.md"
pytestmark = pytest.mark.slow


def example() -> str:
    """The first Python block under "## Example", verbatim."""
    section = SDK_DOC.read_text("utf-8").split("## Example", 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found, "docs/sdk.md has no Python example"
    return found.group(1)


def test_the_example_sends_consumes_with_acks_and_follows_events(
        team: Team, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    publish(team.bob, "build 41 passed", "build 42 passed")
    wait_inbox(team.alice, 2)
    monkeypatch.setenv("TIDEMESH_HOME", str(team.alice.home))  # alice's host

    exec(compile(example(), str(SDK_DOC), "exec"), {"__name__": "sdk_example"})  # noqa: S102

    out = capsys.readouterr().out.splitlines()
    assert "sent deploy-v42 queued" in out
    consumed = [line.split(" ", 3)[3] for line in out if line.startswith("consumed ")]
    assert consumed == ["build 41 passed", "build 42 passed"]
    assert sum(line.endswith(" message") for line in out if line.startswith("event ")) == 2
    assert client(team.alice).inbox(consumer="audit-log")["items"] == [], "all acked"
    wait_until(lambda: [e["body"] for e in client(team.bob).inbox()["items"]][-1:] == [
        "v42 is live"])
