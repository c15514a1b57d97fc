"""The accept transaction of spec §4.7.2, written once for both databases.

``steps(items)`` is the sequence for a batch of sends with distinct keys, as a generator
that yields what it needs from the database (a ``Step`` naming an ``AcceptPort`` method) and
is sent the answer: claim every dedupe row (in key order, so that brokers sharing a database
cannot deadlock), read them back, branch each with ``broker/accept.branch`` (201 / 200
duplicate / 409), check B2 for the claimed ones (a failure deletes its claim in the same
transaction, which is the same as rolling it back), then insert message, history and a
gapless delivery row per recipient for the winners. Each dialect implements the port with
batch statements (PostgreSQL: one round trip per statement per batch, through arrays and
``unnest``) and drives the sequence: ``run`` for SQLite's writer thread, ``run_async`` for
asyncpg. Runs inside the caller's transaction; must not import a driver.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Sequence
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

    def claim(self, items: Sequence[AcceptInput]) -> None:
        """Insert each dedupe row unless its key has one (``ON CONFLICT DO NOTHING``)."""

    def read_back(self, items: Sequence[AcceptInput]) -> dict[Key, DedupeRow]:
        """The dedupe row of each key, ours or an earlier send's."""

    def destinations(self, items: Sequence[AcceptInput]) -> dict[Destination, list[str]]:
        """(kind, mesh, ref) → the live members it reaches (topic subscribers, the DM target,
        queue consumers); a destination is present iff it exists."""

    def unclaim(self, broker_message_ids: Sequence[str]) -> None:
        """Delete the dedupe rows of sends refused by B2."""

    def insert(self, accepted: Sequence[tuple[AcceptInput, list[str]]]
               ) -> dict[str, list[Delivery]]:
        """Message, history, cursor and delivery rows of each accepted send and its
        recipients, in batch order; returns the deliveries by broker_message_id."""


@dataclass(frozen=True, slots=True)
class Step:
    op: str                    # the AcceptPort method
    args: tuple[Any, ...]


Steps = Generator[Step, Any, list[AcceptResult]]

_MISSING = {"topic": "no topic {!r} in this mesh", "dm": "no such member in this mesh",
            "queue": "no queue {!r} (it has no consumer)"}


def steps(items: Sequence[AcceptInput]) -> Steps:
    """Spec §4.7.2 for ``items`` (distinct keys), in arrival order."""
    yield Step("claim", (sorted(items, key=lambda a: a.key),))
    rows: dict[Key, DedupeRow] = yield Step("read_back", (items,))
    results: dict[int, AcceptResult] = {}
    claimed: list[int] = []
    for i, a in enumerate(items):
        if branch(a, rows[a.key]) is Branch.CREATED:
            claimed.append(i)
        else:
            results[i] = answer_existing(a, rows[a.key])
    found: dict[Destination, list[str]] = (
        (yield Step("destinations", ([items[i] for i in claimed],))) if claimed else {})
    accepted: list[tuple[int, list[str]]] = []
    refused: list[str] = []
    for i in claimed:
        recipients = _recipients(items[i], found)
        if isinstance(recipients, TidemeshError):
            results[i] = failed(items[i], recipients)
            refused.append(items[i].broker_message_id)
        else:
            accepted.append((i, recipients))
    if refused:
        yield Step("unclaim", (refused,))
    if accepted:
        deliveries: dict[str, list[Delivery]] = yield Step(
            "insert", ([(items[i], r) for i, r in accepted],))
        for i, _ in accepted:
            results[i] = created(items[i], deliveries.get(items[i].broker_message_id, []))
    return [results[i] for i in range(len(items))]


def _recipients(a: AcceptInput, found: dict[Destination, list[str]]
                ) -> list[str] | TidemeshError:
    """B2: who gets a delivery row, or why the destination does not exist."""
    members = found.get((a.kind, a.mesh_id, a.ref))
    if members is None or (not members and a.kind == "queue"):  # a queue needs a consumer
        return UnknownDestination(_MISSING[a.kind].format(a.ref), field="to.ref")
    return recipients_for(a.kind, a.ref, a.sender_pubkey, members, members,
                          a.broker_message_id)


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
