"""The accept sequence (``broker/store/accept.steps``) without a database: an in-memory port
that records each statement the sequence asks for."""

from __future__ import annotations

from collections.abc import Sequence

from tests.broker.conftest import accept_input, new_pubkey
from tidemesh.broker.accept import AcceptInput, DedupeRow, Delivery
from tidemesh.broker.store import accept

MESH = "01J0000000000000000000MESH"


class MemoryPort:
    """``accept.AcceptPort`` over dicts: one topic ``ops`` (as the stores answer B2 for a
    topic: it exists, its subscribers are not read) and one member ``dm`` can reach."""

    def __init__(self, member: str) -> None:
        self.dedupe: dict[accept.Key, DedupeRow] = {}
        self.messages: list[str] = []
        self.member = member
        self.calls: list[str] = []

    def claim(self, items: Sequence[AcceptInput]) -> int:
        self.calls.append("claim")
        before = len(self.dedupe)
        for a in items:
            self.dedupe.setdefault(a.key, DedupeRow(a.broker_message_id, a.history_id,
                                                    a.fingerprint, True, a.now_ms))
        return len(self.dedupe) - before

    def read_back(self, items: Sequence[AcceptInput]) -> dict[accept.Key, DedupeRow]:
        self.calls.append("read_back")
        return {a.key: self.dedupe[a.key] for a in items}

    def destinations(self, items: Sequence[AcceptInput]
                     ) -> dict[accept.Destination, list[str]]:
        self.calls.append("destinations")
        found: dict[accept.Destination, list[str]] = {}
        for a in items:
            if a.kind == "topic" and a.ref == "ops":
                found[(a.kind, MESH, a.ref)] = []
            elif a.kind == "dm" and a.ref == self.member:
                found[(a.kind, MESH, a.ref)] = [self.member]
        return found

    def unclaim(self, broker_message_ids: Sequence[str]) -> None:
        self.calls.append("unclaim")
        gone = set(broker_message_ids)
        self.dedupe = {k: r for k, r in self.dedupe.items() if r.broker_message_id not in gone}

    def insert(self, accepted: Sequence[tuple[AcceptInput, list[str]]]
               ) -> dict[str, list[Delivery]]:
        self.calls.append("insert")
        self.messages += [a.client_message_id for a, _ in accepted]
        return {a.broker_message_id: [Delivery(p, 1, len(self.messages)) for p in r]
                for a, r in accepted}


def _sends(sender: str, n: int) -> list[AcceptInput]:
    """Fresh keys, every fifth a repeat of the one before it, and a key first refused by
    B2 then sent to a topic that exists."""
    out = []
    for i in range(n):
        cmid = f"c{i - 1}" if i % 5 == 4 else f"c{i}"
        body = f"b{i - 1}" if i % 5 == 4 else f"b{i}"
        out.append(accept_input(MESH, sender, cmid, body=body))
    out += [accept_input(MESH, sender, "x", ref="nowhere"),
            accept_input(MESH, sender, "x", body="then"),
            accept_input(MESH, sender, "x", body="then")]
    return out


def test_steps_take_the_same_statements_for_5_sends_as_for_500() -> None:
    calls = []
    for n in (5, 500):
        port = MemoryPort(new_pubkey())
        accept.run(port, _sends(new_pubkey(), n))
        calls.append(port.calls)
    # Every key is new to the store, so the claim took them all: nothing to read back.
    assert calls[0] == calls[1] == ["claim", "destinations", "unclaim", "claim", "insert"]


def test_steps_decide_a_repeated_key_against_the_send_before_it() -> None:
    port = MemoryPort(new_pubkey())
    items = _sends(new_pubkey(), 10)
    results = accept.run(port, items)
    assert [r.status for r in results] == [201, 201, 201, 201, 200] * 2 + [404, 201, 200]
    assert results[4].broker_message_id == results[3].broker_message_id
    assert results[-1].broker_message_id == results[-2].broker_message_id
    assert port.dedupe[items[-2].key].broker_message_id == items[-2].broker_message_id
    assert port.messages == ["c0", "c1", "c2", "c3", "c5", "c6", "c7", "c8", "x"]


def test_steps_answer_keys_held_before_the_batch_without_claiming_again() -> None:
    port, sender = MemoryPort(new_pubkey()), new_pubkey()
    first = accept.run(port, [accept_input(MESH, sender, "k")])
    again = accept.run(port, [accept_input(MESH, sender, "k"),
                              accept_input(MESH, sender, "k", body="other")])
    assert [r.status for r in first + again] == [201, 200, 409]
    assert port.calls[-2:] == ["claim", "read_back"]


def test_steps_read_back_when_one_key_of_the_batch_was_held() -> None:
    port, sender = MemoryPort(new_pubkey()), new_pubkey()
    accept.run(port, [accept_input(MESH, sender, "old")])
    results = accept.run(port, [accept_input(MESH, sender, f"new{i}") for i in range(3)]
                         + [accept_input(MESH, sender, "old", body="changed")])
    assert [r.status for r in results] == [201, 201, 201, 409]
    assert port.calls[-4:] == ["claim", "read_back", "destinations", "insert"]


def test_steps_give_a_dm_its_delivery_row_and_a_topic_send_none_in_a_mixed_batch() -> None:
    member, sender = new_pubkey(), new_pubkey()
    port = MemoryPort(member)
    items = [accept_input(MESH, sender, "t0"), accept_input(MESH, sender, "d0", kind="dm",
                                                             ref=member),
             accept_input(MESH, sender, "t1")]
    results = accept.run(port, items)
    assert [r.status for r in results] == [201] * 3
    # The topic's sends are read from its log by each subscriber, not given rows here.
    assert [[d.recipient_pubkey for d in r.deliveries] for r in results] == [[], [member], []]
