"""The nightly dedupe-orphan audit: read the broker store, run the four checks, publish.

Entry point for ``tidemesh audit orphans`` (which runs this module in its own process) and for
``spark-submit spark/jobs/orphan_audit.py --store URL --out DIR``. Owns the run: the clock
(watermark and expiry floor), the reads, the writes and the exit code. The checks themselves
are the pure transforms of ``tidemesh.spark.transforms.orphans``.

Exit codes (``tidemesh.core.exitcodes.Exit``): 0 clean, 11 orphans found, 2 bad configuration
(a missing JDBC driver jar or PySpark too), 1 the audit could not run; after a failure the
previous good report stays in place.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

try:
    from pyspark.sql import DataFrame, SparkSession
except ModuleNotFoundError as exc:  # run directly (python -m, a timer) without the extra
    if __name__ != "__main__" or exc.name != "pyspark":
        raise
    print("orphan_audit: the audit needs PySpark: pip install 'tidemesh[spark]' (exit 2)",
          file=sys.stderr)
    raise SystemExit(2) from None

from tidemesh.core.audit_report import render
from tidemesh.core.exitcodes import Exit
from tidemesh.core.ids import new_ulid
from tidemesh.core.settings import ConfigError
from tidemesh.spark.config import AuditConfig, load
from tidemesh.spark.log import configure_logging
from tidemesh.spark.outputs import (
    FINDING_ORDER,
    FINDINGS_JSONL,
    SAMPLE_ROWS,
    OutputPaths,
    bump_check_total,
    discard_staging,
    publish_run,
    render_textfile,
    write_atomic,
    write_findings_jsonl,
)
from tidemesh.spark.readers import read_table, table_stats
from tidemesh.spark.schemas import (
    AUDITED_TABLES,
    DEDUPE,
    DELIVERY,
    HISTORY,
    MEMBER,
    MESH,
    MESSAGE_QUEUE,
    TOPIC_MESSAGE,
    Table,
)
from tidemesh.spark.session import build_session, under_spark_submit
from tidemesh.spark.store import Dialect, JdbcTarget, driver_named, missing_driver, parse_store
from tidemesh.spark.transforms.orphans import (
    AuditWindow,
    OrphanKind,
    StoreFrames,
    count_findings,
    find_orphans,
)

log = structlog.get_logger("tidemesh.spark.orphan_audit")

KINDS = tuple(k.value for k in OrphanKind)
Clock = Callable[[], int]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class AuditOutcome:
    exit_code: Exit
    report: Mapping[str, Any] | None = None
    error: str | None = None
    counts: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


def window_for(cfg: AuditConfig, started_ms: int) -> AuditWindow:
    """The judged period and the expiry floor for a run that started at ``started_ms``.

    The expiry floor sits a grace period *after* the start: the broker's sweep deletes dedupe
    rows whose ``expires_at`` has passed on the broker's clock, possibly while this run reads,
    so only a row still valid well after the read can be relied on to exist.
    """
    grace = cfg.grace_seconds * 1000
    watermark = cfg.watermark_ms if cfg.watermark_ms is not None else started_ms - grace
    return AuditWindow(watermark, started_ms + grace, cfg.dedupe_ttl_ms)


def read_store(
    spark: SparkSession, target: JdbcTarget, cfg: AuditConfig, watermark_ms: int
) -> tuple[StoreFrames, dict[str, int], dict[str, int]]:
    """The five audited tables, partitioned, their row counts at the start, and how many
    of those rows are too young for the watermark; and the members, whole, for their
    rotations."""
    stats = table_stats(spark, target, AUDITED_TABLES, cfg.fetch_size, watermark_ms)

    def read(table: Table) -> DataFrame:
        return read_table(spark, target, table, partitions=cfg.partitions,
                          fetch_size=cfg.fetch_size, stats=stats[table.name])

    # No caching: find_orphans reads each table exactly once (one shuffle of everything).
    frames = StoreFrames(read(DEDUPE), read(TOPIC_MESSAGE), read(MESSAGE_QUEUE), read(HISTORY),
                         read(DELIVERY),
                         read_table(spark, target, MEMBER, partitions=1,
                                    fetch_size=cfg.fetch_size))
    return (frames, {name: s.rows for name, s in stats.items()},
            {name: s.young for name, s in stats.items()})


def _mesh_ids(spark: SparkSession, target: JdbcTarget, cfg: AuditConfig) -> list[str]:
    df = read_table(spark, target, MESH, partitions=1, fetch_size=cfg.fetch_size)
    return sorted(r["id"] for r in df.collect())


def _counts(findings: DataFrame, meshes: Sequence[str]) -> dict[str, dict[str, int]]:
    """mesh -> kind -> found, with every audited mesh and every kind present (zeros too)."""
    out: dict[str, dict[str, int]] = {m: dict.fromkeys(KINDS, 0) for m in meshes}
    for row in count_findings(findings).collect():
        out.setdefault(row["mesh_id"], dict.fromkeys(KINDS, 0))[row["kind"]] = int(row["found"])
    return out


def audit(spark: SparkSession, cfg: AuditConfig, paths: OutputPaths, run_id: str,
          started_ms: int, clock: Clock) -> dict[str, Any]:
    """Read, check and stage one run; returns its report (published by the caller)."""
    target = parse_store(cfg.store)
    window = window_for(cfg, started_ms)
    log.info("audit_started", store=target.display, watermark_ms=window.watermark_ms,
             expiry_floor_ms=window.expiry_floor_ms, dedupe_ttl_ms=window.dedupe_ttl_ms)
    frames, table_rows, young = read_store(spark, target, cfg, window.watermark_ms)
    staged = paths.staging(run_id) / "orphans.parquet"
    find_orphans(frames, window).repartition(1).write.mode("overwrite").parquet(str(staged))
    # Counted from the written files, so the report and the Parquet rows can never disagree.
    written = spark.read.parquet(str(staged))
    counts = _counts(written, _mesh_ids(spark, target, cfg))
    sample = write_findings_jsonl(written.orderBy(*FINDING_ORDER).toLocalIterator(),
                                  paths.staging(run_id) / FINDINGS_JSONL, SAMPLE_ROWS)
    totals = {k: sum(by_kind[k] for by_kind in counts.values()) for k in KINDS}
    found = sum(totals.values())
    return {
        "job": "orphan_audit", "run_id": run_id, "store": target.display,
        "status": "orphans_found" if found else "clean",
        "watermark_ms": window.watermark_ms, "expiry_floor_ms": window.expiry_floor_ms,
        "dedupe_mode": cfg.dedupe_mode, "dedupe_ttl_ms": window.dedupe_ttl_ms,
        "started_at_ms": started_ms, "finished_at_ms": clock(),
        "table_rows": table_rows, "found": found, "totals": totals, "meshes": counts,
        "rows_checked": sum(table_rows.values()) - sum(young.values()),
        "rows_too_young": sum(young.values()),
        "orphans": f"runs/{run_id}/orphans.parquet",
        "orphans_jsonl": f"runs/{run_id}/{FINDINGS_JSONL}",
        "sample": sample,
    }


def _previous_counts(paths: OutputPaths) -> tuple[dict[str, dict[str, int]] | None, int | None]:
    try:
        prev = json.loads(paths.report.read_text(encoding="utf-8"))
        return prev["meshes"], int(prev["watermark_ms"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None, None


def _java_causes(exc: BaseException) -> list[str]:
    """The Java cause chain that Spark 4 hides behind FAILED_JDBC.UNCLASSIFIED (gotcha 9)."""
    causes: list[str] = []
    throwable = getattr(exc, "_origin", None)
    while throwable is not None and len(causes) < 8:
        try:
            causes.append(str(throwable.toString()))
            throwable = throwable.getCause()
        except Exception:   # a py4j proxy whose JVM is gone: keep what was collected
            break
    return causes


def failure_reason(cfg: AuditConfig, exc: BaseException, causes: list[str]) -> str:
    """One line for why a run failed: the missing JDBC driver and how to get it (Spark
    otherwise buries it in a JSON stack trace), else the error's first line."""
    dialect = driver_named([str(exc), *causes])
    if dialect is not None:
        return missing_driver(dialect, cfg.sqlite_jar if dialect is Dialect.SQLITE
                              else cfg.pg_jar)
    text = str(exc).strip()
    return text.splitlines()[0] if text else repr(exc)


def driver_problem(cfg: AuditConfig, target: JdbcTarget) -> str | None:
    """The store's JDBC jar is missing: said before Spark starts (and its warnings with it).
    Under spark-submit, or with audit.jar_packages, the jars are not ours to check."""
    if cfg.jar_packages or under_spark_submit():
        return None
    jar = cfg.sqlite_jar if target.dialect is Dialect.SQLITE else cfg.pg_jar
    return None if Path(jar).is_file() else missing_driver(target.dialect, jar)


def run_audit(spark: SparkSession, cfg: AuditConfig, clock: Clock = _now_ms) -> AuditOutcome:
    """One run from read to published outputs, with the exit code it should end with."""
    paths = OutputPaths.under(cfg.out, cfg.textfile)
    run_id, started = new_ulid(), clock()
    structlog.contextvars.bind_contextvars(run_id=run_id)
    try:
        report = audit(spark, cfg, paths, run_id, started, clock)
        publish_run(paths, run_id, report)
    except Exception as exc:
        discard_staging(paths, run_id)
        counts, watermark = _previous_counts(paths)
        totals = bump_check_total(paths, "failed")
        write_atomic(paths.textfile, render_textfile(totals, counts, KINDS, clock(), watermark))
        causes = _java_causes(exc)
        reason = failure_reason(cfg, exc, causes)
        log.error("audit_failed", error=reason, java_causes=causes, exc_info=True)
        return AuditOutcome(Exit.FAILURE, error=reason)
    finally:
        structlog.contextvars.unbind_contextvars("run_id")
    totals = bump_check_total(paths, report["status"])
    write_atomic(paths.textfile,
                 render_textfile(totals, report["meshes"], KINDS, report["finished_at_ms"],
                                 report["watermark_ms"]))
    code = Exit.ORPHANS_FOUND if report["found"] else Exit.OK
    log.info("audit_finished", run_id=run_id, status=report["status"], found=report["found"],
             totals=report["totals"], seconds=(report["finished_at_ms"] - started) / 1000,
             report=str(paths.report))
    return AuditOutcome(code, report, counts=report["meshes"])


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="orphan_audit", description=__doc__.splitlines()[0])
    p.add_argument("--store", help="sqlite:///path/broker.db or postgresql://user@host/db")
    p.add_argument("--out", help="output folder (report.json, runs/, textfile)")
    p.add_argument("--master", help="Spark master URL; default local[*]")
    p.add_argument("--config", type=Path, help="TOML file with an [audit] table")
    p.add_argument("--textfile", help="Prometheus textfile path")
    p.add_argument("--watermark-ms", type=int, help="pin the input watermark")
    p.add_argument("--grace-seconds", type=int)
    p.add_argument("--dedupe-mode", choices=("retention_scoped", "permanent"))
    p.add_argument("--dedupe-retention-days", type=int)
    p.add_argument("--partitions", type=int)
    p.add_argument("--log-format", choices=("auto", "json", "console"))
    p.add_argument("--json", action="store_true", dest="as_json",
                   help="print the report with every offending row as JSON on stdout")
    return p


def print_outcome(outcome: AuditOutcome, paths: OutputPaths, as_json: bool) -> None:
    """What the operator reads on stdout when a run ends (logs go to stderr); a run that
    failed says why there too."""
    if outcome.report is None:
        if as_json:
            print(json.dumps({"status": "failed", "error": outcome.error}, sort_keys=True))
        else:
            print(f"audit failed: {outcome.error}; the previous report stays in place")
        return
    if not as_json:
        print(render(outcome.report, outcome.report["sample"], shown_limit=SAMPLE_ROWS))
        return
    rows = paths.root / str(outcome.report["orphans_jsonl"])
    with rows.open(encoding="utf-8") as fh:
        orphans = [json.loads(line) for line in fh]
    print(json.dumps({**outcome.report, "orphans": orphans}, sort_keys=True))


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    args = _parser().parse_args(argv)
    flags = {f"audit.{k}": v for k, v in vars(args).items() if k not in ("config", "as_json")}
    try:
        file_data = tomllib.loads(args.config.read_text(encoding="utf-8")) if args.config else {}
        cfg = load(file_data, os.environ if environ is None else environ, flags)
        problem = driver_problem(cfg, parse_store(cfg.store))
    except (ConfigError, OSError, tomllib.TOMLDecodeError) as exc:
        configure_logging("auto")
        log.error("audit_config_rejected", error=str(exc))
        return int(Exit.USAGE)
    configure_logging(cfg.log_format)
    if problem is not None:
        log.error("audit_driver_missing", error=problem)
        print(f"audit could not run: {problem}")
        return int(Exit.USAGE)
    spark = build_session(cfg)
    spark.sparkContext.setLogLevel("WARN")
    try:
        outcome = run_audit(spark, cfg)
    finally:
        spark.stop()
    print_outcome(outcome, OutputPaths.under(cfg.out, cfg.textfile), args.as_json)
    return int(outcome.exit_code)


if __name__ == "__main__":
    raise SystemExit(main())
