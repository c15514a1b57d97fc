"""The four checks on a few hand-made rows: one offender per rule, and its near misses.

Every scenario lives in its own mesh and all of them go through ``find_orphans`` in one
Spark job (the JVM, not the data, is what costs time); each test then reads its own mesh.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark

DAY = 86_400_000
NOW = 1_800_000_000_000          # > 2^31: every time here would be truncated as a 32-bit int
WATERMARK = NOW - 15 * 60_000
OLD = NOW - 2 * DAY
TTL_DAYS = 7

Rows = dict[str, list[tuple[Any, ...]]]
Found = set[tuple[str, str]]      # (kind, row_key) within one mesh


def _healthy(mesh: str, n: int, at: int = OLD) -> Rows:
    """A consistent accept: dedupe, topic message, history and one delivery row."""
    mid, sender, cmid = f"M{n}", f"S{n}", f"c{n}"
    return {
        "dedupe": [(mesh, sender, cmid, mid, at, at + TTL_DAYS * DAY, True)],
        "topic": [(mid, mesh, sender, cmid, at)],
        "history": [(f"H{n}", mid, mesh, at)],
        "delivery": [(mesh, "R", 1, n, mid, at, None)],
    }


def _merge(*parts: Rows) -> Rows:
    out: Rows = {}
    for part in parts:
        for key, rows in part.items():
            out.setdefault(key, []).extend(rows)
    return out


def _without(rows: Rows, *keys: str) -> Rows:
    return {k: v for k, v in rows.items() if k not in keys}


def _pruned_flag(rows: Rows) -> Rows:
    return {**rows, "dedupe": [(*r[:6], False) for r in rows["dedupe"]]}


def consistent() -> Rows:
    return _merge(_healthy("consistent", 1), _healthy("consistent", 2))


def dedupe_lost_message() -> Rows:
    gone = _without(_healthy("dedupe_lost_message", 1), "topic", "history", "delivery")
    pruned = _pruned_flag(_without(_healthy("dedupe_lost_message", 2), "topic", "history",
                                   "delivery"))
    return _merge(gone, pruned)


def message_in_other_mesh() -> Rows:
    rows = _healthy("message_in_other_mesh", 1)
    return {**rows, "topic": [("M1", "elsewhere", "S1", "c1", OLD)]}


def expiry() -> Rows:
    young = _without(_healthy("expiry", 1, at=NOW - DAY), "dedupe")          # 6 days left
    expired = _without(_healthy("expiry", 2, at=NOW - 8 * DAY), "dedupe")    # gone a day ago
    legacy = _without(_healthy("expiry", 3), "dedupe")
    return _merge(young, expired, {**legacy, "topic": [("M3", "expiry", "S3", None, OLD)]})


def dedupe_for_other_message() -> Rows:
    rows = _healthy("dedupe_for_other_message", 1)
    mesh = "dedupe_for_other_message"
    return {**rows, "dedupe": [(mesh, "S1", "c1", "M9", OLD, OLD + TTL_DAYS * DAY, False)]}


def history_both_ways() -> Rows:
    mesh = "history_both_ways"
    no_history = _without(_healthy(mesh, 1), "history")
    stray = _without(_healthy(mesh, 2), "topic", "delivery", "dedupe")     # dedupe expired
    pruned = _pruned_flag(_without(_healthy(mesh, 3), "topic", "delivery"))
    return _merge(no_history, stray, pruned)


def queue_messages() -> Rows:
    rows = _healthy("queue_messages", 1)
    queue = [*rows.pop("topic"), ("Q2", "queue_messages", "S2", "c2", OLD)]
    return {**rows, "queue": queue}


def in_flight() -> Rows:
    fresh = _healthy("in_flight", 1, at=WATERMARK + 1)
    return {"dedupe": fresh["dedupe"], "delivery": fresh["delivery"]}


def rotated() -> Rows:
    """A member rotated twice, S1 -> S1b -> S1c: the broker moved its dedupe rows to S1c and
    repointed S1 at S1c, while each message keeps the key that sent it. M4 is a genuine orphan
    (its dedupe row is gone); M5's dedupe row carries another member's key."""
    mesh = "rotated"
    rows = _merge(*(_healthy(mesh, n) for n in (1, 2, 3, 4, 5)))
    senders = {"M1": "S1", "M2": "S1b", "M3": "S1c", "M4": "S1", "M5": "S1"}
    rows["topic"] = [(mid, m, senders[mid], cmid, at) for mid, m, _, cmid, at in rows["topic"]]
    rows["dedupe"] = [(m, "S9" if mid == "M5" else "S1c", cmid, mid, *rest)
                      for m, _, cmid, mid, *rest in rows["dedupe"] if mid != "M4"]
    rows["member"] = [(mesh, "S1", "S1c"), (mesh, "S1b", "S1c"), (mesh, "S1c", None),
                      # The same key rotated in another mesh says nothing about this one.
                      ("rotated_elsewhere", "S1", "S1x")]
    return rows


def counted() -> Rows:
    rows = _merge(_without(_healthy("counted", 1), "history"),
                  _without(_healthy("counted", 2), "history"))
    rows["delivery"].append(("counted", "R", 1, 99, "nope", OLD, None))
    return rows


SCENARIOS: list[Callable[[], Rows]] = [
    consistent, dedupe_lost_message, message_in_other_mesh, expiry, dedupe_for_other_message,
    history_both_ways, queue_messages, in_flight, rotated, counted,
]


def _frames(spark: SparkSession, rows: Rows) -> Any:
    from tidemesh.spark.schemas import (
        DEDUPE,
        DELIVERY,
        HISTORY,
        MEMBER,
        MESSAGE_QUEUE,
        TOPIC_MESSAGE,
    )
    from tidemesh.spark.transforms.orphans import StoreFrames

    def df(table: Any, key: str) -> DataFrame:
        return spark.createDataFrame(rows.get(key, []), table.schema)

    return StoreFrames(df(DEDUPE, "dedupe"), df(TOPIC_MESSAGE, "topic"),
                       df(MESSAGE_QUEUE, "queue"), df(HISTORY, "history"),
                       df(DELIVERY, "delivery"), df(MEMBER, "member"))


def _run(spark: SparkSession, rows: Rows, ttl_days: int | None) -> DataFrame:
    from tidemesh.spark.transforms.orphans import AuditWindow, find_orphans

    window = AuditWindow(WATERMARK, NOW + 15 * 60_000,
                         None if ttl_days is None else ttl_days * DAY)
    return find_orphans(_frames(spark, rows), window)


@pytest.fixture(scope="module")
def found(spark: SparkSession) -> dict[str, Found]:
    """mesh -> its findings, for every scenario at once."""
    out: dict[str, Found] = {s.__name__: set() for s in SCENARIOS}
    for r in _run(spark, _merge(*(s() for s in SCENARIOS)), TTL_DAYS).collect():
        out.setdefault(r["mesh_id"], set()).add((r["kind"], r["row_key"]))
    return out


def test_find_orphans_consistent_accepts_reports_nothing(found: dict[str, Found]) -> None:
    assert found["consistent"] == set()


def test_find_orphans_dedupe_without_message_unless_pruned(found: dict[str, Found]) -> None:
    assert found["dedupe_lost_message"] == {("dedupe_without_message", "S1/c1")}


def test_find_orphans_message_in_other_mesh_does_not_count(found: dict[str, Found]) -> None:
    assert found["message_in_other_mesh"] == {("dedupe_without_message", "S1/c1"),
                                              ("history_without_message", "H1"),
                                              ("delivery_without_message", "R/1/1")}
    assert found["elsewhere"] == {("message_without_dedupe", "M1"),
                                  ("message_without_history", "M1")}


def test_find_orphans_message_without_dedupe_respects_expiry(found: dict[str, Found]) -> None:
    assert found["expiry"] == {("message_without_dedupe", "M1")}


def test_find_orphans_dedupe_for_another_message_does_not_cover(
    found: dict[str, Found],
) -> None:
    assert found["dedupe_for_other_message"] == {("message_without_dedupe", "M1")}


def test_find_orphans_history_both_ways(found: dict[str, Found]) -> None:
    assert found["history_both_ways"] == {("message_without_history", "M1"),
                                          ("history_without_message", "H2")}


def test_find_orphans_queue_messages_are_messages(found: dict[str, Found]) -> None:
    assert found["queue_messages"] == {("message_without_dedupe", "Q2"),
                                       ("message_without_history", "Q2")}


def test_find_orphans_follows_a_members_rotations_and_still_finds_its_orphans(
    found: dict[str, Found],
) -> None:
    assert found["rotated"] == {("message_without_dedupe", "M4"),
                                ("message_without_dedupe", "M5")}


def test_find_orphans_rows_after_watermark_not_judged(found: dict[str, Found]) -> None:
    assert found["in_flight"] == set()


def test_find_orphans_permanent_mode_needs_every_dedupe_row(spark: SparkSession) -> None:
    expired = _without(_healthy("permanent", 2, at=NOW - 400 * DAY), "dedupe")
    rows = _run(spark, expired, ttl_days=None).collect()
    assert {(r["kind"], r["row_key"]) for r in rows} == {("message_without_dedupe", "M2")}


def test_count_findings_groups_by_mesh_and_kind(spark: SparkSession) -> None:
    from tidemesh.spark.transforms.orphans import count_findings

    counts = count_findings(_run(spark, counted(), TTL_DAYS)).collect()
    assert {(r["mesh_id"], r["kind"], r["found"]) for r in counts} == {
        ("counted", "message_without_history", 2), ("counted", "delivery_without_message", 1)}
