"""The columns the audit reads from each broker table, and the shape of what it writes.

Owns the Spark types of every column the audit touches. The readers pass them to JDBC as
``customSchema`` because SQLite's default mapping silently truncates epoch milliseconds to
32 bits and crashes on NULL BIGINTs (spark-notes §3.1); the transforms ``select()`` exactly
these columns at entry, so a missing or renamed column fails loudly at plan time.

Table and column names are the ones agreed with the broker (DESIGN §5.3): timestamps are
BIGINT milliseconds since the epoch named ``*_at``, ids are ULID text.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.types import (
    BooleanType,
    DataType,
    LongType,
    StringType,
    StructField,
    StructType,
)


def _schema(*fields: tuple[str, DataType, bool]) -> StructType:
    return StructType([StructField(name, kind, nullable) for name, kind, nullable in fields])


@dataclass(frozen=True, slots=True)
class Table:
    """One broker table as the audit reads it."""

    name: str
    schema: StructType
    time_column: str   # BIGINT ms; the watermark and the partition bounds use it

    @property
    def columns(self) -> list[str]:
        return [f.name for f in self.schema.fields]

    def custom_schema(self) -> str:
        """The JDBC ``customSchema`` DDL that names every column read, with its type."""
        return ", ".join(f"{f.name} {f.dataType.simpleString().upper()}" for f in self.schema)


DEDUPE = Table(
    "client_message_dedupe",
    _schema(
        ("mesh_id", StringType(), False),
        ("sender_pubkey", StringType(), False),
        ("client_message_id", StringType(), False),
        ("broker_message_id", StringType(), True),
        ("first_seen_at", LongType(), False),
        ("expires_at", LongType(), True),          # NULL = permanent mode
        ("history_available", BooleanType(), False),
    ),
    "first_seen_at",
)

_MESSAGE_FIELDS = (
    ("id", StringType(), False),
    ("mesh_id", StringType(), False),
    ("sender_pubkey", StringType(), True),
    ("client_message_id", StringType(), True),    # NULL for legacy traffic (spec §17.6)
    ("created_at", LongType(), False),
)
TOPIC_MESSAGE = Table("topic_message", _schema(*_MESSAGE_FIELDS), "created_at")
MESSAGE_QUEUE = Table("message_queue", _schema(*_MESSAGE_FIELDS), "created_at")

HISTORY = Table(
    "message_history",
    _schema(
        ("history_id", StringType(), False),
        ("broker_message_id", StringType(), False),
        ("mesh_id", StringType(), False),
        ("created_at", LongType(), False),
    ),
    "created_at",
)

DELIVERY = Table(
    "delivery_queue",
    _schema(
        ("mesh_id", StringType(), False),
        ("recipient_pubkey", StringType(), False),
        ("epoch", LongType(), False),
        ("seq", LongType(), False),
        ("broker_message_id", StringType(), False),
        ("created_at", LongType(), False),
        ("acked_at", LongType(), True),
    ),
    "created_at",
)

MESH = Table("mesh", _schema(("id", StringType(), False)), "")

# Not judged: read whole (one partition) so that check 2 can follow a member's key rotations.
# The broker repoints older keys at each rotation, so ``rotated_to`` names the newest key.
MEMBER = Table(
    "member",
    _schema(
        ("mesh_id", StringType(), False),
        ("pubkey", StringType(), False),
        ("rotated_to", StringType(), True),
    ),
    "",
)

AUDITED_TABLES = (DEDUPE, TOPIC_MESSAGE, MESSAGE_QUEUE, HISTORY, DELIVERY)

# One row per offending store row. ``row_key`` names the row in its own table (a message or
# history id, "sender_pubkey/client_message_id" for dedupe, "recipient/epoch/seq" for delivery).
FINDINGS = _schema(
    ("kind", StringType(), False),
    ("mesh_id", StringType(), False),
    ("source_table", StringType(), False),
    ("row_key", StringType(), False),
    ("broker_message_id", StringType(), True),
    ("sender_pubkey", StringType(), True),
    ("client_message_id", StringType(), True),
)

COUNTS = _schema(
    ("mesh_id", StringType(), False),
    ("kind", StringType(), False),
    ("found", LongType(), False),
)
