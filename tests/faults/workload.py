"""The seeded plan of a fault run: which program sends what to whom, and which fault fires when.

Everything random in a run comes from here, from one ``random.Random(seed)``, so a seed names
a run: the same seed gives the same sends (keys, bodies, destinations, key reuses) and the same
faults in the same order at the same points of progress. Faults fire when a given number of
sends have been answered, not at wall-clock times, so a slower machine runs the same plan.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum

LABELS = ("a", "b", "c")
MORE_LABELS = "abcdefgh"  # hosts of runs with more daemons than the default three
TOPIC = "load"


class FaultKind(StrEnum):
    DAEMON_KILL9 = "daemon_kill9"
    BROKER_KILL9 = "broker_kill9"
    PG_RESTART = "pg_restart"
    WS_CUT = "ws_cut"
    WS_STALL = "ws_stall"
    CONSUMER_CRASH = "consumer_crash"
    # The restart soak's (bench/soak.py): stops whose length is checked against the grace.
    DAEMON_DOWN_UP = "daemon_down_up"     # `tidemesh daemon down`, then up again
    DAEMON_SIGTERM = "daemon_sigterm"     # SIGTERM, wait for the exit, start again
    BROKER_SIGSTOP = "broker_sigstop"     # the broker process frozen: sockets open, silent


# The faults of the classic runs (make_plan): a seed keeps naming the plan it always named.
CLASSIC_FAULTS = (FaultKind.DAEMON_KILL9, FaultKind.BROKER_KILL9, FaultKind.PG_RESTART,
                  FaultKind.WS_CUT, FaultKind.WS_STALL, FaultKind.CONSUMER_CRASH)
# The soak's cycle, in order: every way a daemon stops, and every way its broker fails.
SOAK_FAULTS = (FaultKind.DAEMON_DOWN_UP, FaultKind.DAEMON_SIGTERM, FaultKind.DAEMON_KILL9,
               FaultKind.BROKER_KILL9, FaultKind.PG_RESTART, FaultKind.BROKER_SIGSTOP,
               FaultKind.WS_STALL)
# The faults that hit one broker or its link; with one broker they need no target.
BROKER_FAULTS = (FaultKind.BROKER_KILL9, FaultKind.WS_CUT, FaultKind.WS_STALL,
                 FaultKind.BROKER_SIGSTOP)
# The faults aimed at one daemon (by label).
DAEMON_FAULTS = (FaultKind.DAEMON_KILL9, FaultKind.CONSUMER_CRASH, FaultKind.DAEMON_DOWN_UP,
                 FaultKind.DAEMON_SIGTERM)


class Reuse(StrEnum):
    NONE = "none"
    SAME = "same_body"
    DIFFERENT = "different_body"


@dataclass(frozen=True, slots=True)
class SendOp:
    """One logical send: the program retries it with the same key until it gets an answer."""

    index: int
    sender: str
    key: str
    body: str
    dest_kind: str  # "topic" or "dm"
    dest_ref: str  # the topic, or the label of the DM's recipient
    reuse: Reuse = Reuse.NONE
    original: int | None = None  # index of the op whose key this one reuses


@dataclass(frozen=True, slots=True)
class FaultOp:
    at_answered: int  # fires once this many sends have been answered
    kind: FaultKind
    # a daemon label; pg_ctl's stop mode for pg_restart; a broker index for BROKER_FAULTS
    # when there are several brokers; else ""
    target: str
    pause: float  # seconds the fault lasts (down time, stall length)


@dataclass(frozen=True, slots=True)
class Plan:
    seed: int
    sends: list[SendOp]
    faults: list[FaultOp]
    labels: tuple[str, ...] = LABELS  # the hosts, one daemon each


def _send_ops(rng: random.Random, n: int, reuse_pct: float,
              labels: tuple[str, ...]) -> list[SendOp]:
    ops: list[SendOp] = []
    fresh: dict[str, list[SendOp]] = {label: [] for label in labels}
    for i in range(n):
        sender = rng.choice(labels)
        mine = fresh[sender]
        if mine and rng.random() < reuse_pct:
            orig = rng.choice(mine[-50:])
            same = rng.random() < 0.5
            body = orig.body if same else orig.body + "~changed"
            ops.append(SendOp(i, sender, orig.key, body, orig.dest_kind, orig.dest_ref,
                              Reuse.SAME if same else Reuse.DIFFERENT, orig.index))
            continue
        if rng.random() < 0.25:
            kind, ref = "dm", rng.choice([x for x in labels if x != sender])
        else:
            kind, ref = "topic", TOPIC
        op = SendOp(i, sender, f"{sender}-{i:06d}-{rng.getrandbits(32):08x}",
                    f"body {i} from {sender} #{rng.getrandbits(24):06x}", kind, ref)
        mine.append(op)
        ops.append(op)
    return ops


def _fault_ops(rng: random.Random, n_sends: int, n_faults: int, max_stall: float,
               labels: tuple[str, ...], brokers: int) -> list[FaultOp]:
    kinds = list(CLASSIC_FAULTS)
    # Every kind at least once (when there is room), the rest drawn at random.
    chosen = kinds[:n_faults] + [rng.choice(kinds) for _ in range(n_faults - len(kinds))]
    rng.shuffle(chosen)
    points = sorted(rng.randrange(n_sends // 20, max(n_sends * 9 // 10, n_sends // 20 + 1))
                    for _ in chosen)
    return [_fault(rng, at, kind, max_stall, labels, brokers)
            for at, kind in zip(points, chosen, strict=True)]


def _fault(rng: random.Random, at: int, kind: FaultKind, max_stall: float,
           labels: tuple[str, ...], brokers: int) -> FaultOp:
    target = ""
    if kind in DAEMON_FAULTS:
        target = rng.choice(labels)
    elif kind is FaultKind.PG_RESTART:  # a clean restart, or a crash of the server
        target = rng.choice(("fast", "immediate"))
    elif brokers > 1 and kind in BROKER_FAULTS:  # which broker (or its proxy) it hits
        target = str(rng.randrange(brokers))
    pause = (rng.uniform(1.0, max_stall)
             if kind in (FaultKind.WS_STALL, FaultKind.BROKER_SIGSTOP)
             else rng.uniform(0.0, 0.5))
    return FaultOp(at, kind, target, pause)


def make_plan(seed: int, sends: int, faults: int, reuse_pct: float = 0.08,
              max_stall: float = 3.0, daemons: int = 3, brokers: int = 1) -> Plan:
    """The plan of a run. A ``max_stall`` over 40 s lets some stalls outlast the daemon's
    keepalive (20 s ping interval + 20 s timeout), and over 60 s the broker's
    ``server.idle_timeout_s``, so both ends must detect a dead link.
    With the default three daemons and one broker a seed gives the plan it always gave."""
    rng = random.Random(seed)
    labels = LABELS if daemons == len(LABELS) else tuple(MORE_LABELS[:daemons])
    return Plan(seed, _send_ops(rng, sends, reuse_pct, labels),
                _fault_ops(rng, sends, faults, max_stall, labels, brokers), labels)


def make_soak_plan(seed: int, cycles: int, sends_per_cycle: int = 40, max_stall: float = 3.0,
                   daemons: int = 3) -> Plan:
    """The restart soak's plan: ``cycles`` faults, one every ``sends_per_cycle`` answered
    sends, going round ``SOAK_FAULTS`` in order (targets and pauses drawn from the seed)."""
    rng = random.Random(seed)
    labels = LABELS if daemons == len(LABELS) else tuple(MORE_LABELS[:daemons])
    sends = _send_ops(rng, cycles * sends_per_cycle + sends_per_cycle, 0.08, labels)
    faults = [_fault(rng, (i + 1) * sends_per_cycle, SOAK_FAULTS[i % len(SOAK_FAULTS)],
                     max_stall, labels, 1) for i in range(cycles)]
    return Plan(seed, sends, faults, labels)
