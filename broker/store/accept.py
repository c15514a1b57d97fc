"""The accept transaction of spec §4.7.2, written once for both databases.

``steps(items)`` is the sequence for a batch of sends (one frame's, or several frames'
that the write engine grouped), as a generator that yields what it needs from the database
(a ``Step`` naming an ``AcceptPort`` method) and is sent the answer: claim the dedupe row of
every key (in key order, so that brokers sharing a database cannot deadlock), read them
back unless the claim inserted every one, branch each with ``broker/accept.branch`` (201 /
200 duplicate / 409), check B2 for the claimed ones (a failure deletes its claim in the
same transaction, which is the same as rolling it back), then insert message and history
for the winners, in arrival order: a topic message once, in its topic's log; a DM or queue
message with a gapless delivery row for its recipient. A key sent twice
in one batch is decided in memory against what its earlier send left. Each dialect
implements the port with batch statements (PostgreSQL: one round trip per statement per
batch, through arrays and ``unnest``; never one per send) and drives the sequence: ``run``
for SQLite's writer thread, ``run_async`` for asyncpg. Runs inside the caller's
transaction; must not import a driver.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tidemesh.broker.accept import (
    AcceptInput,
    AcceptResult,
    Branch,
    DedupeRow,
    Delivery,
    answer_existing,
    branch,
    created,
    failed,
    recipients_for,
)
from tidemesh.core.errors import TidemeshError, UnknownDestination

Key = tuple[str, str, str]
Destination = tuple[str, str, str]   # (kind, mesh_id, ref)


class AcceptPort(Protocol):
    """The batch statements of the accept, in the caller's transaction. The async dialect
    has the same methods, each returning an awaitable of the same value."""

    def claim(self, items: Sequence[AcceptInput]) -> int:
        """Insert each dedupe row unless its key has one (``ON CONFLICT DO NOTHING``);
        returns how many rows it inserted."""

    def read_back(self, items: Sequence[AcceptInput]) -> dict[Key, DedupeRow]:
        """The dedupe row of each key, ours or an earlier send's."""

    def destinations(self, items: Sequence[AcceptInput]) -> dict[Destination, list[str]]:
        """(kind, mesh, ref) → the live members it reaches (the DM target, queue consumers;
        a topic with none: its subscribers are not read in the transaction, see
        ``Store.topic_subscribers``); a destination is present iff it exists (a revoked DM
        target: with no members, so that the refusal can say revoked)."""

    def unclaim(self, broker_message_ids: Sequence[str]) -> None:
        """Delete the dedupe rows of sends refused by B2."""

    def insert(self, accepted: Sequence[tuple[AcceptInput, list[str]]]
               ) -> dict[str, list[Delivery]]:
        """Message and history rows of each accepted send, a topic message at its topic's
        next log position, a DM or queue message with its recipient's delivery row (a gapless
        seq, after what the recipient's topics logged before it); returns the recipients by
        broker_message_id (a topic message's without a seq yet)."""


@dataclass(frozen=True, slots=True)
class Step:
    op: str                    # the AcceptPort method
    args: tuple[Any, ...]


Steps = Generator[Step, Any, list[AcceptResult]]

_MISSING = {"topic": "no topic {!r} in this mesh", "dm": "no such member in this mesh",
            "queue": "no queue {!r} (it has no consumer)"}


def steps(items: Sequence[AcceptInput]) -> Steps:
    """Spec §4.7.2 for ``items`` in arrival order. A key may come more than once (a frame
    that sends it twice, or two frames of one batch): each later send of a key is decided
    against what the ones before it left, exactly as if they had run one after another,
    without a statement per send."""
    keys = [a.key for a in items]
    first_at: dict[Key, int] = {}
    for i, k in enumerate(keys):
        first_at.setdefault(k, i)
    firsts = {k: items[i] for k, i in first_at.items()}
    claimed: int = yield Step("claim", ([firsts[k] for k in sorted(firsts)],))
    # Keys whose row is the claim just made: their sends are decided here, in order. When
    # every key was claimed (the usual batch: retries are few, and under a budget B0
    # answers them before the accept), each row is the one just inserted: nothing to read.
    held: dict[Key, DedupeRow | None]
    if claimed == len(firsts):
        held = dict.fromkeys(firsts)
    else:
        rows: dict[Key, DedupeRow] = yield Step("read_back", (list(firsts.values()),))
        held = {k: None if branch(a, rows[k]) is Branch.CREATED else rows[k]
                for k, a in firsts.items()}
    ours = {k for k, row in held.items() if row is None}
    found: dict[Destination, list[str]] = (
        (yield Step("destinations", ([a for a, k in zip(items, keys, strict=True) if k in ours],)))
        if ours else {})
    results, winners = _decide(items, keys, held, found)
    # The claim holds each key's first send; where another won (or none did), move it.
    moved = [k for k in ours if winners.get(k, (-1,))[0] != first_at[k]]
    if moved:
        yield Step("unclaim", ([firsts[k].broker_message_id for k in moved],))
        again = sorted((items[winners[k][0]] for k in moved if k in winners),
                       key=lambda a: a.key)
        if again:
            yield Step("claim", (again,))
    if winners:
        accepted = sorted(winners.values())
        deliveries: dict[str, list[Delivery]] = yield Step(
            "insert", ([(items[i], r) for i, r in accepted],))
        for i, _ in accepted:
            results[i] = created(items[i], deliveries.get(items[i].broker_message_id, []))
    return [results[i] for i in range(len(items))]


def _decide(items: Sequence[AcceptInput], keys: Sequence[Key],
            held: dict[Key, DedupeRow | None], found: dict[Destination, list[str]]
            ) -> tuple[dict[int, AcceptResult], dict[Key, tuple[int, list[str]]]]:
    """Each send in order against the row its key holds (None: free to claim) or the send
    that won it earlier in the batch: the answers so far, and each key's winner (its
    position and recipients), still to be inserted."""
    results: dict[int, AcceptResult] = {}
    winners: dict[Key, tuple[int, list[str]]] = {}
    # A topic's recipients depend on the sender only: worked out once per batch, not per
    # send (the lists are only read from here on).
    topic_recipients: dict[tuple[Destination, str], list[str] | TidemeshError] = {}
    for i, a in enumerate(items):
        k = keys[i]
        won = winners.get(k)
        row = _claimed(items[won[0]]) if won is not None else held[k]
        if row is not None:
            results[i] = answer_existing(a, row)
            continue
        if a.kind == "topic":
            at = ((a.kind, a.mesh_id, a.ref), a.sender_pubkey)
            recipients = topic_recipients.get(at)
            if recipients is None:
                recipients = topic_recipients[at] = _recipients(a, found)
        else:
            recipients = _recipients(a, found)
        if isinstance(recipients, TidemeshError):   # B2: the key stays free for a later send
            results[i] = failed(a, recipients)
            continue
        winners[k] = (i, recipients)
    return results, winners


def _claimed(a: AcceptInput) -> DedupeRow:
    """The dedupe row a claim of ``a`` inserts."""
    return DedupeRow(a.broker_message_id, a.history_id, a.fingerprint, True, a.now_ms)


def _recipients(a: AcceptInput, found: dict[Destination, list[str]]
                ) -> list[str] | TidemeshError:
    """B2: who gets a delivery row, or why the destination does not exist."""
    members = found.get((a.kind, a.mesh_id, a.ref))
    if members is None or (not members and a.kind == "queue"):  # a queue needs a consumer
        return UnknownDestination(_MISSING[a.kind].format(a.ref), field="to.ref")
    if not members and a.kind == "dm":   # the member is known, and was revoked
        return UnknownDestination(f"member {a.ref[:16]}… was revoked from this mesh; it "
                                  "receives nothing any more", field="to.ref")
    if a.kind == "dm":   # its key, or the one it was rotated out for (docs/broker.md)
        return members[:1]
    return recipients_for(a.kind, a.ref, members, a.broker_message_id)


def run(port: AcceptPort, items: Sequence[AcceptInput]) -> list[AcceptResult]:
    """Drive the sequence on a synchronous port (SQLite's writer thread)."""
    seq = steps(items)
    step = next(seq)
    while True:
        try:
            step = seq.send(getattr(port, step.op)(*step.args))
        except StopIteration as done:
            return list(done.value)


async def run_async(port: Any, items: Sequence[AcceptInput]) -> list[AcceptResult]:
    """Drive the sequence on an asynchronous port (asyncpg): the same steps, awaited."""
    seq = steps(items)
    step = next(seq)
    while True:
        method: Callable[..., Awaitable[Any]] = getattr(port, step.op)
        try:
            step = seq.send(await method(*step.args))
        except StopIteration as done:
            return list(done.value)


def flatten(frames: Sequence[Sequence[AcceptInput]]) -> list[AcceptInput]:
    """The sends of several callers' frames, in queue order: one batch for ``steps``."""
    return [a for f in frames for a in f]


def regroup(frames: Sequence[Sequence[AcceptInput]], results: Sequence[AcceptResult]
            ) -> list[list[AcceptResult]]:
    """``results`` of ``flatten(frames)`` handed back to each frame."""
    out, at = [], 0
    for f in frames:
        out.append(list(results[at:at + len(f)]))
        at += len(f)
    return out


class AcceptRows:
    """Sends decided per accept transaction, for the broker's metrics. The accept op counts
    what it decided (``ran``) and the engine's after-commit callback takes the count
    (``committed``); ``writer()`` tells the two calls of one writer apart from another's
    (PostgreSQL runs several writers at once; SQLite has one)."""

    def __init__(self, writer: Callable[[], Hashable]) -> None:
        self.writer = writer
        self._running: dict[Hashable, int] = {}
        self.transactions = 0    # accept transactions since the store opened
        self.rows = 0            # sends decided in them

    def ran(self, sends: int) -> None:
        key = self.writer()
        self._running[key] = self._running.get(key, 0) + sends

    def committed(self) -> int:
        """The sends of the transaction this writer just ended (0: it held no accept)."""
        sends = self._running.pop(self.writer(), 0)
        if sends:
            self.transactions += 1
            self.rows += sends
        return sends
