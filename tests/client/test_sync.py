"""``Client`` against real daemons: typed results, the error tree, TCP with the token, the
named consumer's acks, and an event stream that survives a daemon restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.client.conftest import MESH, Team, client, publish, wait_inbox
from tests.daemon.harness import RunningDaemon
from tidemesh.client import Client, DaemonNotRunning, Event, Notice
from tidemesh.core import errors


def test_send_answers_a_typed_result_and_a_retry_binds_the_same_row(
        daemon: RunningDaemon) -> None:
    c = Client(daemon.paths.socket)
    first = c.send({"to": "topic:ops", "body": "x"}, idempotency_key="job-1")
    again = c.send({"to": "topic:ops", "body": "x"}, idempotency_key="job-1")
    assert first["status"] == "queued" and first["client_message_id"] == "job-1"
    assert again["outbox_id"] == first["outbox_id"]
    assert [r["id"] for r in c.outbox_list()["items"]] == [first["outbox_id"]]
    assert c.outbox_inspect(first["outbox_id"])["client_message_id"] == "job-1"
    assert c.version()["ipc_api"] == "v1" and "cm_daemon" in c.metrics()


def test_the_daemons_error_bodies_arrive_as_their_core_error_class(
        daemon: RunningDaemon) -> None:
    c = Client(daemon.paths.socket)
    with pytest.raises(errors.InvalidRequest) as bad:
        c.send({"to": "nowhere:x", "body": "x"})
    assert bad.value.details.get("field") == "to"
    with pytest.raises(errors.NotFound):
        c.outbox_inspect("no-such-row")
    c.send({"to": "topic:ops", "body": "one"}, "job-2")
    with pytest.raises(errors.IdempotencyConflict) as conflict:
        c.send({"to": "topic:ops", "body": "another"}, "job-2")
    assert conflict.value.details["conflict"] == "outbox_pending_fingerprint_mismatch"


def test_loopback_tcp_needs_the_token(daemon: RunningDaemon, tmp_path: Path) -> None:
    tcp = Client(port=daemon.port, token_file=daemon.paths.token_file)
    assert tcp.version()["mesh"] == daemon.mesh
    wrong = tmp_path / "token"
    wrong.write_text("not-the-token\n")
    wrong.chmod(0o600)   # a token file others may read is refused before it is sent
    with pytest.raises(errors.Unauthorized):
        Client(port=daemon.port, token_file=wrong).outbox_list()


def test_no_daemon_is_daemon_not_running_with_how_to_start_one(short_tmp: Path) -> None:
    c = Client.for_mesh("team", environ={"TIDEMESH_HOME": str(short_tmp)})
    with pytest.raises(DaemonNotRunning) as caught:
        c.health()
    assert caught.value.hint == "tidemesh daemon up --mesh team"
    with pytest.raises(DaemonNotRunning):
        next(iter(c.events(since=0)))
    with pytest.raises(DaemonNotRunning):
        next(iter(c.consume("w")))


def test_a_stopped_daemon_is_daemon_not_running(daemon: RunningDaemon) -> None:
    c = Client(daemon.paths.socket)
    assert daemon.stop() == 0
    with pytest.raises(DaemonNotRunning):
        c.version()


@pytest.mark.slow
def test_consume_acks_each_entry_once_the_loop_moves_past_it(team: Team) -> None:
    publish(team.bob, "a", "b", "c")
    wait_inbox(team.alice, 3)
    alice = client(team.alice)
    held = []
    for entry in alice.consume("worker"):
        held.append(entry["body"])
        if entry["body"] == "b":
            break  # the program stops while holding "b": it was never moved past
    assert held == ["a", "b"]
    assert alice.inbox(consumer="worker")["cursor"] == 1
    rest = [e["body"] for e in alice.consume("worker", idle_timeout=0.5)]
    assert rest == ["b", "c"], "the held entry comes again; the acked one never does"
    assert alice.inbox(consumer="worker")["items"] == []


@pytest.mark.slow
@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "kill-9"])
def test_events_resume_across_a_daemon_restart_with_no_gap_and_no_repeat(
        team: Team, kill: bool) -> None:
    publish(team.bob, "one", "two")
    wait_inbox(team.alice, 2)
    stream = client(team.alice).events(since=0, idle_timeout=30)
    seen: list[Event | Notice] = []

    def until_messages(n: int) -> None:
        while sum(isinstance(i, Event) and i.type == "message" for i in seen) < n:
            seen.append(next(stream))

    until_messages(2)
    # The stream's connection dies with the daemon; "three" waits at the broker meanwhile.
    team.restart(team.alice, while_down=lambda: publish(team.bob, "three"), kill=kill)
    publish(team.bob, "four")
    until_messages(4)
    events = [i for i in seen if isinstance(i, Event)]
    assert [e.id for e in events] == list(range(1, len(events) + 1))
    assert [e.data["body"] for e in events if e.type == "message"] == [
        "one", "two", "three", "four"]
    assert not any(isinstance(i, Notice) for i in seen)
    assert client(team.alice).version()["mesh"] == MESH


def test_send_many_answers_each_message_as_send_would(daemon: RunningDaemon) -> None:
    c = Client(daemon.paths.socket)
    c.send({"to": "topic:ops", "body": "earlier"}, "many-0")
    results = c.send_many([
        {"to": "topic:ops", "body": "a", "client_message_id": "many-1"},
        {"to": "topic:ops", "body": "a", "client_message_id": "many-1"},
        {"to": "nowhere:x", "body": "b"},
        {"to": "topic:ops", "body": "changed", "client_message_id": "many-0"},
    ])
    assert [r["status"] for r in results] == [202, 202, 400, 409]
    assert results[0]["body"] == results[1]["body"]
    assert results[0]["body"]["client_message_id"] == "many-1"
    refused = errors.from_body(results[3]["status"], results[3]["body"])
    assert isinstance(refused, errors.IdempotencyConflict)
    assert isinstance(errors.from_body(results[2]["status"], results[2]["body"]),
                      errors.InvalidRequest)
    assert {r["client_message_id"] for r in c.outbox_list()["items"]} == {"many-0", "many-1"}
    with pytest.raises(errors.InvalidRequest):
        c.send_many([])


def test_send_many_delivers_the_messages_in_order(team: Team) -> None:
    bodies = [f"step {i}" for i in range(50)]
    results = client(team.alice).send_many(
        [{"to": "topic:deploys", "body": b, "client_message_id": f"o-{b}"} for b in bodies])
    assert {r["status"] for r in results} == {202}
    wait_inbox(team.bob, 50)
    assert [e["body"] for e in client(team.bob).inbox(limit=1000)["items"]] == bodies
