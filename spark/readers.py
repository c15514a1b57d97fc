"""Partitioned JDBC reads of the broker's tables, SQLite or PostgreSQL.

Owns how a table becomes a DataFrame: the ``driver`` option (without it a jar loaded through
``spark.jars`` is "No suitable driver"), ``customSchema`` for every column (SQLite's default
mapping truncates epoch milliseconds), ``fetchsize`` (pgjdbc buffers a whole partition without
it), and a partition column with bounds from a real min/max query, because the bounds only set
the stride: guessed bounds put most rows in one partition (spark-notes §6, gotchas 1-16).

SQLite partitions on ``rowid`` (an index lookup per range, exposed through a subquery because
Spark rejects ``rowid`` as a column name); PostgreSQL on the table's BIGINT time column. The
bounds and row counts of all tables come from one query: one round trip, not a job per table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame, DataFrameReader, SparkSession

from tidemesh.spark.schemas import Table
from tidemesh.spark.store import Dialect, JdbcTarget

_RID = "tm_rid"


def _reader(spark: SparkSession, target: JdbcTarget, fetch_size: int) -> DataFrameReader:
    reader = (spark.read.format("jdbc").option("url", target.url)
              .option("driver", target.driver).option("fetchsize", str(fetch_size)))
    for key, value in target.options.items():
        reader = reader.option(key, value)
    return reader


@dataclass(frozen=True, slots=True)
class TableStats:
    """Row count and partition-column range of one table when the run started."""

    rows: int
    lo: int | None
    hi: int | None
    young: int = 0      # rows stamped at or after the watermark: not judged by this run


def partition_column(target: JdbcTarget, table: Table) -> str:
    return "rowid" if target.dialect is Dialect.SQLITE else table.time_column


def table_stats(
    spark: SparkSession, target: JdbcTarget, tables: Sequence[Table], fetch_size: int,
    watermark_ms: int | None = None,
) -> dict[str, TableStats]:
    """Count and min/max of the partition column for every table, and how many rows are
    too young for ``watermark_ms``, in one round trip."""
    parts: list[str] = []
    names: list[str] = []
    cut = int(watermark_ms) if watermark_ms is not None else None
    for i, table in enumerate(tables):
        name, col = target.table(table.name), partition_column(target, table)
        # Names come from schemas.Table constants, never from input; the cut is an int.
        parts += [f"(SELECT count(*) FROM {name}) AS n{i}",  # noqa: S608
                  f"(SELECT min({col}) FROM {name}) AS lo{i}",  # noqa: S608
                  f"(SELECT max({col}) FROM {name}) AS hi{i}"]  # noqa: S608
        names += [f"n{i}", f"lo{i}", f"hi{i}"]
        if cut is not None:
            parts.append(f"(SELECT count(*) FROM {name} "  # noqa: S608
                         f"WHERE {table.time_column} >= {cut}) AS y{i}")
            names.append(f"y{i}")
    row = (_reader(spark, target, fetch_size)
           .option("query", "SELECT " + ", ".join(parts))
           # Computed columns come back as decimal(38,18) without it (gotcha 3).
           .option("customSchema", ", ".join(f"{n} BIGINT" for n in names))
           .load().first())
    if row is None:
        raise RuntimeError("the table statistics query returned no row")
    return {t.name: TableStats(int(row[f"n{i}"]), row[f"lo{i}"], row[f"hi{i}"],
                               int(row[f"y{i}"] or 0) if cut is not None else 0)
            for i, t in enumerate(tables)}


def read_table(
    spark: SparkSession, target: JdbcTarget, table: Table, *, partitions: int, fetch_size: int,
    stats: TableStats | None = None,
) -> DataFrame:
    """``table``'s audited columns, read in up to ``partitions`` parallel ranges of ``stats``."""
    name = target.table(table.name)
    if target.dialect is Dialect.SQLITE:
        source = f"(SELECT rowid AS {_RID}, {', '.join(table.columns)} FROM {name}) AS src"  # noqa: S608
        column, schema = _RID, f"{_RID} BIGINT, {table.custom_schema()}"
    else:
        source, column, schema = name, table.time_column, table.custom_schema()
    reader = (_reader(spark, target, fetch_size)
              .option("dbtable", source).option("customSchema", schema))
    if (stats is not None and stats.lo is not None and stats.hi is not None
            and partitions > 1 and stats.hi > stats.lo):
        reader = (reader.option("partitionColumn", column)
                  .option("lowerBound", str(stats.lo))
                  # The bounds only set the stride; max + 1 keeps the last range from
                  # holding the largest value alone.
                  .option("upperBound", str(stats.hi + 1))
                  .option("numPartitions", str(partitions)))
    df = reader.load()
    if target.dialect is Dialect.SQLITE:
        df = df.drop(_RID)
    return df.select(*table.columns)
