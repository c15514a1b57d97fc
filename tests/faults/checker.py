"""The effective-once checker: reads every store after a fault run and counts what went wrong.

It compares what the sending programs were told (the ledger of final answers) with what each
layer holds: the daemons' outbox.db and inbox.db, the broker's PostgreSQL tables, what each
consuming program processed, what each SSE program saw, and what the Spark orphan audit says.
A send answered 202 or 200 must have one outbox row (done), one dedupe row, one message row and
one history row at the broker, one inbox entry at each recipient, one processed outcome per
consuming program and one SSE ``message`` event; a 409 must have created nothing. Anything
missing is *lost*, anything twice is *duplicated*, anything nobody was promised is *orphaned*.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from tests.faults.workload import LABELS, FaultKind, Reuse, SendOp

ACCEPTED = (200, 202)


@dataclass(frozen=True, slots=True)
class SendResult:
    op: SendOp
    status: int
    body: dict[str, Any]
    attempts: int


@dataclass
class Ledger:
    seed: int
    results: list[SendResult]
    faults: dict[str, int]
    consumer_restarts: int
    crashes: dict[str, int]
    pubkeys: dict[str, str]


@dataclass
class Stores:
    outbox: dict[str, Path]
    inbox: dict[str, Path]
    outcomes: dict[str, Path]
    sse: dict[str, list[tuple[int, str, dict[str, Any]]]]
    sse_repeats: dict[str, int]
    broker_dsn: str
    audit_out: Path


@dataclass
class Report:
    seed: int
    faults: dict[str, int]
    counts: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    audit: str = "not run"
    audit_ok: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    brokers: int = 1  # the run's set-up, filled in by the harness
    failovers: int = 0  # daemons' moves to their next broker (``broker_failed_over``)
    # per recipient: [(sender label, client_message_id, body)] in inbox order (DET-01)
    inbox_order: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)

    def problem(self, kind: str, detail: str) -> None:
        self.counts[kind] += 1
        if len(self.problems) < 50:
            self.problems.append(f"{kind}: {detail}")

    @property
    def ok(self) -> bool:
        bad = ("lost", "duplicated", "orphaned", "stuck", "wrong_answer", "out_of_order",
               "crashed", "dm_readable", "hang")
        return not any(self.counts[k] for k in bad) and self.audit_ok

    def table(self) -> str:
        c = self.counts
        rows: list[tuple[str, object]] = [("seed", self.seed), ("brokers", self.brokers)]
        rows += [(f"fault {k}", self.faults.get(k, 0)) for k in FaultKind]
        rows += [("faults total", sum(self.faults.values())),
                 ("daemon fail-overs to the next broker", self.failovers),
                 ("sends (logical)", c["sends"]),
                 ("  accepted 202/200", c["accepted"]),
                 ("  key reused, same body", c["reuse_same"]),
                 ("  key reused, other body (409)", c["reuse_409"]),
                 ("  send attempts (incl. retries)", c["attempts"]),
                 ("deliveries (inbox entries)", c["deliveries"]),
                 ("consumer outcomes", c["processed"]),
                 ("consumer handouts (redelivered)", f"{c['handouts']} ({c['redelivered']})"),
                 ("consumer crashes/kills", c["consumer_restarts"]),
                 ("sse message events", c["sse_messages"]),
                 ("lost", c["lost"]), ("duplicated", c["duplicated"]),
                 ("orphaned", c["orphaned"]), ("stuck outbox rows", c["stuck"]),
                 ("wrong answers", c["wrong_answer"]), ("out of order", c["out_of_order"]),
                 ("unplanned process exits", c["crashed"]),
                 ("hangs (stops past grace, daemons not answering)", c["hang"]),
                 ("DMs stored sealed / readable at broker", f"{c['dm_sealed']} / "
                                                            f"{c['dm_readable']}"),
                 ("spark orphan audit", self.audit),
                 *((f"{k}", f"{v:.1f}") for k, v in self.timings.items()),
                 ("RESULT", "OK" if self.ok else "FAILED")]
        width = max(len(str(k)) for k, _ in rows)
        lines = [f"{k!s:<{width}}  {v}" for k, v in rows]
        return "\n".join(lines + self.problems)


def _rows(db: Path, sql: str) -> list[sqlite3.Row]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return list(conn.execute(sql))
    finally:
        conn.close()


def _answers(ledger: Ledger, report: Report) -> dict[tuple[str, str], SendOp]:
    """Check each final answer against the plan; returns the accepted sends by (sender, key)."""
    accepted: dict[tuple[str, str], SendOp] = {}
    for res in ledger.results:
        op = res.op
        report.counts["sends"] += 1
        report.counts["attempts"] += res.attempts
        want = (409,) if op.reuse is Reuse.DIFFERENT else ACCEPTED
        if res.status not in want:
            report.problem("wrong_answer", f"{op.key} ({op.reuse}) got {res.status} {res.body}")
        if op.reuse is Reuse.NONE and res.status in ACCEPTED:
            accepted[(op.sender, op.key)] = op
            report.counts["accepted"] += 1
        elif op.reuse is Reuse.SAME:
            report.counts["reuse_same"] += 1
        elif op.reuse is Reuse.DIFFERENT and res.status == 409:
            report.counts["reuse_409"] += 1
    return accepted


def _check_outboxes(stores: Stores, accepted: dict[tuple[str, str], SendOp],
                    report: Report) -> dict[tuple[str, str], str]:
    bmids: dict[tuple[str, str], str] = {}
    for label, db in stores.outbox.items():
        for row in _rows(db, "SELECT client_message_id, status, broker_message_id FROM outbox"):
            key = (label, row["client_message_id"])
            if key not in accepted:
                report.problem("orphaned", f"outbox row {key} answers no accepted send")
            if row["status"] != "done":
                report.problem("stuck", f"outbox row {key} is {row['status']}")
            bmids[key] = row["broker_message_id"]
    for key in accepted:
        if key not in bmids:
            report.problem("lost", f"no outbox row for accepted send {key}")
    return bmids


async def _broker_rows(dsn: str) -> dict[str, list[asyncpg.Record]]:
    conn = await asyncpg.connect(dsn)
    try:
        return {
            "dedupe": await conn.fetch("SELECT sender_pubkey, client_message_id, "
                                       "broker_message_id FROM mesh.client_message_dedupe"),
            "message": await conn.fetch(
                "SELECT id, sender_pubkey, client_message_id, body, 'topic' AS kind "
                "FROM mesh.topic_message UNION ALL SELECT id, sender_pubkey, "
                "client_message_id, body, destination_kind FROM mesh.message_queue"),
            "history": await conn.fetch("SELECT broker_message_id FROM mesh.message_history"),
        }
    finally:
        await conn.close()


def _tally(report: Report, what: str, counts: Counter[Any], expected: set[Any]) -> None:
    for key in expected:
        n = counts.get(key, 0)
        if n == 0:
            report.problem("lost", f"no {what} for {key}")
        elif n > 1:
            report.problem("duplicated", f"{n} {what}s for {key}")
    for key in set(counts) - expected:
        report.problem("orphaned", f"{what} {key} answers no accepted send")


async def _check_broker(stores: Stores, ledger: Ledger, accepted: dict[tuple[str, str], SendOp],
                        bmids: dict[tuple[str, str], str], report: Report) -> None:
    label_of = {v: k for k, v in ledger.pubkeys.items()}
    rows = await _broker_rows(stores.broker_dsn)
    dedupe = Counter((label_of.get(r["sender_pubkey"], "?"), r["client_message_id"])
                     for r in rows["dedupe"])
    messages = Counter((label_of.get(r["sender_pubkey"], "?"), r["client_message_id"])
                       for r in rows["message"])
    _tally(report, "dedupe row", dedupe, set(accepted))
    _tally(report, "broker message", messages, set(accepted))
    by_id = {r["id"]: r for r in rows["message"]}
    history = Counter(r["broker_message_id"] for r in rows["history"])
    expected_ids = {bmids[k] for k in accepted if bmids.get(k)}
    _tally(report, "history row", history, expected_ids)
    for key, op in accepted.items():
        msg = by_id.get(bmids.get(key) or "")
        if msg is None:
            continue
        if op.dest_kind == "topic" and bytes(msg["body"]) != op.body.encode():
            report.problem("orphaned", f"broker body of {key} is not the accepted body")
        if op.dest_kind == "dm":
            report.counts["dm_sealed"] += 1
            if op.body.encode() in bytes(msg["body"]):  # DESIGN §5.2: never readable there
                report.problem("dm_readable", f"the broker can read the DM {key}")


def _check_inboxes(stores: Stores, ledger: Ledger, accepted: dict[tuple[str, str], SendOp],
                   report: Report) -> dict[str, Counter[tuple[str, str]]]:
    label_of = {v: k for k, v in ledger.pubkeys.items()}
    held: dict[str, Counter[tuple[str, str]]] = {}
    for label, db in stores.inbox.items():
        rows = _rows(db, "SELECT sender_pubkey, client_message_id, body, broker_epoch, "
                         "broker_seq FROM inbox ORDER BY seq")
        order = [(label_of.get(r["sender_pubkey"], "?"), r["client_message_id"],
                  bytes(r["body"]).decode(errors="replace")) for r in rows]
        report.inbox_order[label] = order
        report.counts["deliveries"] += len(rows)
        marks = [(r["broker_epoch"], r["broker_seq"]) for r in rows]
        if marks != sorted(marks):
            report.problem("out_of_order", f"{label}'s inbox is not in broker order")
        counts = Counter((s, cmid) for s, cmid, _ in order)
        want = {k for k, op in accepted.items() if label in recipients(op, tuple(stores.inbox))}
        _tally(report, f"inbox entry at {label}", counts, want)
        for s, cmid, body in order:
            op = accepted.get((s, cmid))
            if op is not None and body != op.body:
                report.problem("orphaned", f"{label} holds another body for {(s, cmid)}")
        held[label] = counts
    return held


def _check_programs(stores: Stores, ledger: Ledger, held: dict[str, Counter[tuple[str, str]]],
                    report: Report) -> None:
    label_of = {v: k for k, v in ledger.pubkeys.items()}
    for label, db in stores.outcomes.items():
        expected = set(held.get(label, Counter()))
        processed: Counter[tuple[str, str]] = Counter()
        if db.exists():
            for r in _rows(db, "SELECT sender, client_message_id FROM processed"):
                processed[(label_of.get(r["sender"], "?"), r["client_message_id"])] += 1
            (handouts,) = _rows(db, "SELECT COUNT(*) AS n FROM handouts")
            report.counts["handouts"] += handouts["n"]
            report.counts["redelivered"] += handouts["n"] - sum(processed.values())
        report.counts["processed"] += sum(processed.values())
        _tally(report, f"outcome of {label}'s consumer", processed, expected)
        sse: Counter[tuple[str, str]] = Counter(
            (label_of.get(d.get("from", ""), "?"), d.get("client_message_id", ""))
            for _, t, d in stores.sse.get(label, []) if t == "message")
        report.counts["sse_messages"] += sum(sse.values())
        _tally(report, f"sse message event at {label}", sse, expected)
        if stores.sse_repeats.get(label):
            report.problem("duplicated", f"{label}'s SSE resent {stores.sse_repeats[label]} ids")


async def _audit(stores: Stores, report: Report) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tidemesh", "audit", "orphans", "--store", stores.broker_dsn,
        "--out", str(stores.audit_out), "--master", "local[1]",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    report.audit_ok = proc.returncode == 0
    report.audit = "clean (exit 0)" if report.audit_ok else f"FAILED (exit {proc.returncode})"
    if not report.audit_ok:
        report.counts["orphaned"] += 1
        report.problems.append("spark audit: " + (err or out).decode()[-1500:])


async def check(ledger: Ledger, stores: Stores, audit: bool = True) -> Report:
    """Read every store and return the report (``report.ok`` is the verdict)."""
    report = Report(ledger.seed, ledger.faults)
    report.counts["consumer_restarts"] = ledger.consumer_restarts
    for who, n in ledger.crashes.items():
        report.counts["crashed"] += n
        report.problems.append(f"crashed: {who} exited {n} time(s) without being killed")
    accepted = _answers(ledger, report)
    bmids = _check_outboxes(stores, accepted, report)
    await _check_broker(stores, ledger, accepted, bmids, report)
    held = _check_inboxes(stores, ledger, accepted, report)
    _check_programs(stores, ledger, held, report)
    if audit:
        await _audit(stores, report)
    else:
        report.audit, report.audit_ok = "skipped", True
    return report


def recipients(op: SendOp, labels: tuple[str, ...] = LABELS) -> list[str]:
    """The labels whose inbox must hold ``op``: a DM's one recipient, or every other member."""
    if op.dest_kind == "dm":
        return [op.dest_ref]
    return [label for label in labels if label != op.sender]
