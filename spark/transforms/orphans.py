"""The four orphan checks of the nightly audit (DESIGN §7, spec §4.7.3 and §17.5-7), per mesh.

Pure DataFrame -> DataFrame: the inputs are conformed to the columns of
``tidemesh.spark.schemas`` at entry (the schema contract) and the output is ``FINDINGS``.
Nothing here reads, writes, or looks at the clock; the job passes the clock in as an
``AuditWindow``.

Every check asks "does the row this row refers to exist?", and every reference is by broker
message id within one mesh. So all rows of all five tables are brought together once, by
(mesh_id, broker message id), and each row is judged against what its group holds: one
shuffle of the store instead of one per check, which is what makes 10M rows fit a night.
The member table, small, is broadcast to every row to follow key rotations (check 2).

Only the row being judged is cut at the watermark: a row written after the cut is still in
flight and is not judged, while every row counts as evidence, so a message written a
millisecond after its dedupe row can never make that dedupe row look orphaned.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from tidemesh.spark.schemas import (
    COUNTS,
    DEDUPE,
    DELIVERY,
    FINDINGS,
    HISTORY,
    MEMBER,
    MESSAGE_QUEUE,
    TOPIC_MESSAGE,
    Table,
)


class OrphanKind(StrEnum):
    """What is wrong with an offending row; one Prometheus series and report key each."""

    DEDUPE_WITHOUT_MESSAGE = "dedupe_without_message"        # check 1
    MESSAGE_WITHOUT_DEDUPE = "message_without_dedupe"        # check 2
    MESSAGE_WITHOUT_HISTORY = "message_without_history"      # check 3, first half
    HISTORY_WITHOUT_MESSAGE = "history_without_message"      # check 3, second half
    DELIVERY_WITHOUT_MESSAGE = "delivery_without_message"    # check 4


@dataclass(frozen=True, slots=True)
class AuditWindow:
    """The clock, as the job saw it, and the broker's dedupe retention.

    ``watermark_ms``: subject rows stamped at or after it are still in flight and not judged.
    ``expiry_floor_ms``: a dedupe row that would expire before this instant may have been
    deleted by the retention sweep already, so its absence proves nothing (check 2). The job
    sets it to its own start time plus a clock-skew margin, never to the watermark: the sweep
    may have run between the watermark and the read.
    ``dedupe_ttl_ms``: the broker's dedupe retention; None means permanent mode, where a
    dedupe row is never deleted.
    """

    watermark_ms: int
    expiry_floor_ms: int
    dedupe_ttl_ms: int | None


@dataclass(frozen=True, slots=True)
class StoreFrames:
    """The broker tables as read, one DataFrame each, at least the columns of their Table."""

    dedupe: DataFrame
    topic_message: DataFrame
    message_queue: DataFrame
    history: DataFrame
    delivery: DataFrame
    member: DataFrame    # evidence only: which key each rotated-out key now belongs to


def conform(df: DataFrame, table: Table) -> DataFrame:
    """Select exactly ``table``'s columns with their types: the entry contract of every check."""
    return df.select(*(F.col(f.name).cast(f.dataType).alias(f.name) for f in table.schema))


def messages(topic_message: DataFrame, message_queue: DataFrame) -> DataFrame:
    """Both message tables as one, tagged with the table each row came from."""
    return conform(topic_message, TOPIC_MESSAGE).withColumn(
        "source_table", F.lit(TOPIC_MESSAGE.name)
    ).unionByName(
        conform(message_queue, MESSAGE_QUEUE).withColumn("source_table", F.lit(MESSAGE_QUEUE.name))
    )


def _as_evidence(
    df: DataFrame, source: Column, *, message_id: str, row_key: Column, at: str,
    keyed: bool = False, history_flag: bool = False,
) -> DataFrame:
    """One table's rows in the common evidence shape; absent facts are typed NULLs."""
    no_text = F.lit(None).cast("string")
    return df.select(
        "mesh_id", F.col(message_id).alias("broker_message_id"), source.alias("source_table"),
        row_key.alias("row_key"),
        (F.col("sender_pubkey") if keyed else no_text).alias("sender_pubkey"),
        (F.col("client_message_id") if keyed else no_text).alias("client_message_id"),
        F.col(at).alias("at"),
        (F.col("history_available") if history_flag else F.lit(None).cast("boolean"))
        .alias("history_available"),
    )


def _evidence(frames: StoreFrames) -> DataFrame:
    """Every row of the five tables as (mesh_id, broker_message_id, what it is, its key, …)."""
    msgs = _as_evidence(messages(frames.topic_message, frames.message_queue),
                        F.col("source_table"), message_id="id", row_key=F.col("id"),
                        at="created_at", keyed=True)
    dedupe = _as_evidence(conform(frames.dedupe, DEDUPE), F.lit(DEDUPE.name),
                          message_id="broker_message_id",
                          row_key=F.concat_ws("/", "sender_pubkey", "client_message_id"),
                          at="first_seen_at", keyed=True, history_flag=True)
    history = _as_evidence(conform(frames.history, HISTORY), F.lit(HISTORY.name),
                           message_id="broker_message_id", row_key=F.col("history_id"),
                           at="created_at")
    delivery = _as_evidence(conform(frames.delivery, DELIVERY), F.lit(DELIVERY.name),
                            message_id="broker_message_id",
                            row_key=F.concat_ws("/", "recipient_pubkey", "epoch", "seq"),
                            at="created_at")
    evidence = msgs.unionByName(dedupe).unionByName(history).unionByName(delivery)
    return _with_member_key(evidence, frames.member)


def _with_member_key(evidence: DataFrame, member: DataFrame) -> DataFrame:
    """Add ``member_pubkey``: the sender's key now, across its member's rotations.

    A rotation moves the member's dedupe rows to the new key while its messages keep the key
    that signed them, so check 2 compares keys as ``coalesce(rotated_to, sender_pubkey)`` on
    both sides. The broker repoints every older key at each rotation, so one lookup reaches
    the newest key however often the member rotated. Members are few: a broadcast join, no
    shuffle of the store.
    """
    moved = F.broadcast(conform(member, MEMBER).where(F.col("rotated_to").isNotNull()).select(
        F.col("mesh_id").alias("rotated_mesh_id"), F.col("pubkey").alias("rotated_pubkey"),
        "rotated_to"))
    joined = evidence.join(moved, (F.col("mesh_id") == F.col("rotated_mesh_id"))
                           & (F.col("sender_pubkey") == F.col("rotated_pubkey")), "left")
    return joined.select(*evidence.columns, F.coalesce("rotated_to", "sender_pubkey")
                         .alias("member_pubkey"))


def _is(*tables: Table) -> Column:
    return F.col("source_table").isin(*(t.name for t in tables))


def _key() -> Column:
    """The dedupe key of a row, by its member's newest key; NUL cannot occur in a pubkey or a
    client_message_id."""
    return F.concat_ws("\u0000", "member_pubkey", "client_message_id")


def _with_group_facts(evidence: DataFrame) -> DataFrame:
    """Add, to every row, what its (mesh_id, broker_message_id) group holds."""
    group = Window.partitionBy("mesh_id", "broker_message_id")
    pruned = _is(DEDUPE) & ~F.col("history_available")
    return evidence.select(
        "*",
        F.max(_is(TOPIC_MESSAGE, MESSAGE_QUEUE)).over(group).alias("has_message"),
        F.max(_is(HISTORY)).over(group).alias("has_history"),
        # "Pruned by retention": the broker flips its dedupe row when it deletes a message.
        F.coalesce(F.max(pruned).over(group), F.lit(False)).alias("was_pruned"),
        F.collect_set(F.when(_is(DEDUPE), _key())).over(group).alias("dedupe_keys"),
    )


def _dedupe_must_exist(window: AuditWindow) -> Column:
    """True for a message whose dedupe row cannot have been deleted by retention yet."""
    if window.dedupe_ttl_ms is None:
        return F.lit(True)
    return (F.col("at") + F.lit(window.dedupe_ttl_ms)) > F.lit(window.expiry_floor_ms)


def _verdicts(window: AuditWindow) -> dict[OrphanKind, Column]:
    """Each check as a predicate on one row that carries its group's facts."""
    message = _is(TOPIC_MESSAGE, MESSAGE_QUEUE)
    return {
        # 1. Retention that prunes a message flips history_available, so only rows still
        #    claiming history are judged.
        OrphanKind.DEDUPE_WITHOUT_MESSAGE:
            _is(DEDUPE) & F.col("history_available") & ~F.col("has_message"),
        # 2. The dedupe row must carry the message's own key (after its member's rotations)
        #    and point at it: a row for that key naming another message means this one was
        #    accepted without the claim.
        OrphanKind.MESSAGE_WITHOUT_DEDUPE:
            message & F.col("client_message_id").isNotNull() & _dedupe_must_exist(window)
            & ~F.array_contains("dedupe_keys", _key()),
        # 3. Message and history rows are written in one accept and pruned together.
        OrphanKind.MESSAGE_WITHOUT_HISTORY: message & ~F.col("has_history"),
        OrphanKind.HISTORY_WITHOUT_MESSAGE:
            _is(HISTORY) & ~F.col("has_message") & ~F.col("was_pruned"),
        # 4.
        OrphanKind.DELIVERY_WITHOUT_MESSAGE: _is(DELIVERY) & ~F.col("has_message"),
    }


def find_orphans(frames: StoreFrames, window: AuditWindow) -> DataFrame:
    """All four checks over one store: one ``FINDINGS`` row per offending row and kind."""
    judged = F.col("at") < F.lit(window.watermark_ms)
    kinds = F.array_compact(F.array(*(
        F.when(judged & verdict, F.lit(kind.value))
        for kind, verdict in _verdicts(window).items()
    )))
    return (
        _with_group_facts(_evidence(frames))
        .select(F.explode(kinds).alias("kind"), *(c for c in FINDINGS.fieldNames() if c != "kind"))
        .select(*FINDINGS.fieldNames())
    )


def count_findings(findings: DataFrame) -> DataFrame:
    """``COUNTS``: offending rows per mesh and kind (kinds with none are absent)."""
    return (
        findings.select("mesh_id", "kind")
        .groupBy("mesh_id", "kind")
        .agg(F.count(F.lit(1)).alias("found"))
        .select(*COUNTS.fieldNames())
    )
