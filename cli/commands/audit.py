"""``tidemesh audit orphans``: run the nightly orphan audit (docs/audit.md).

The audit is a Spark job (``tidemesh.spark.jobs.orphan_audit``); this command runs it as a
child Python process and ends with its exit code. The CLI never imports ``spark`` or
``pyspark`` itself: the apps stay independent, a plain ``tidemesh`` install without the
``spark`` extra still starts fast, and the JVM lives and dies with the child.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import click

from tidemesh.cli.terminal import printable
from tidemesh.core.audit_report import render
from tidemesh.core.exitcodes import Exit

SHOWN_ROWS = 20

JOB_MODULE = "tidemesh.spark.jobs.orphan_audit"


@click.group("audit")
def audit_group() -> None:
    """Batch audits of the broker store, run on Spark."""


@audit_group.command("orphans")
@click.option("--store", envvar="TIDEMESH_AUDIT_STORE",
              help="Broker store: sqlite:///PATH or postgresql://USER@HOST:PORT/DB.")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Folder for report.json, runs/ and the textfile [default: ./orphan-audit].")
@click.option("--master", default=None,
              help="Spark master URL (spark://…, yarn, k8s://…) [default: local[*]].")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="TOML file with an [audit] table (see docs/audit.md).")
@click.option("--textfile", default=None, help="Prometheus textfile to write.")
@click.option("--watermark-ms", type=int, default=None,
              help="Pin the input watermark (ms since the epoch).")
@click.option("--dedupe-mode", type=click.Choice(["retention_scoped", "permanent"]),
              default=None, help="The broker's dedupe mode.")
@click.option("--dedupe-retention-days", type=int, default=None,
              help="The broker's dedupe retention in days.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the report with every offending row as JSON.")
def orphans_cmd(store: str | None, out: str | None, master: str | None,
                config_file: str | None, textfile: str | None, watermark_ms: int | None,
                dedupe_mode: str | None, dedupe_retention_days: int | None,
                as_json: bool) -> None:
    """Find dedupe, message, history and delivery rows that lost their partner.

    Prints the totals and the first 20 offending rows (kind, mesh, ids); `audit show`
    prints them again later. Exit 0 when clean, 11 when orphans were found, 2 on bad
    options, 1 when the audit could not run (the previous report stays in place).
    """
    if importlib.util.find_spec("pyspark") is None:
        click.echo("tidemesh: the audit needs PySpark: pip install 'tidemesh[spark]'", err=True)
        raise SystemExit(int(Exit.USAGE))
    options = {"--store": store, "--out": out, "--master": master, "--config": config_file,
               "--textfile": textfile, "--watermark-ms": watermark_ms,
               "--dedupe-mode": dedupe_mode, "--dedupe-retention-days": dedupe_retention_days}
    argv = [sys.executable, "-m", JOB_MODULE]
    for flag, value in options.items():
        if value is not None:
            argv += [flag, str(value)]
    raise SystemExit(subprocess.run(argv + ["--json"] * as_json, check=False).returncode)


@audit_group.command("show")
@click.option("--out", type=click.Path(file_okay=False), envvar="TIDEMESH_AUDIT_OUT",
              default="orphan-audit", show_default=True,
              help="The audit's output folder.")
@click.option("--limit", type=click.IntRange(min=0), default=SHOWN_ROWS, show_default=True,
              help="Offending rows to print.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the report with every offending row as JSON.")
def show_cmd(out: str, limit: int, as_json: bool) -> None:
    """Print the last good run: totals and its offending rows, without Spark.

    Exit 0 when that run was clean, 11 when it found orphans, 1 when there is no report.
    """
    root = Path(out)
    try:
        report = json.loads((root / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        click.echo(f"tidemesh: no audit report in {root}: {exc}; "
                   "run tidemesh audit orphans first", err=True)
        raise SystemExit(int(Exit.FAILURE)) from None
    rows = _read_rows(root / str(report.get("orphans_jsonl", "")), None if as_json else limit)
    rows = rows or list(report.get("sample", []))[:limit]
    if as_json:
        click.echo(json.dumps({**report, "orphans": rows}, sort_keys=True))
    else:
        click.echo(printable(render(report, rows, shown_limit=limit), lines=True))
    raise SystemExit(int(Exit.ORPHANS_FOUND if report.get("found") else Exit.OK))


def _read_rows(path: Path, limit: int | None) -> list[dict[str, Any]]:
    """The run's offending rows (none when the file is missing: a report from before the
    JSON lines file existed, whose caller falls back to the report's sample)."""
    rows: list[dict[str, Any]] = []
    if not path.is_file():
        return rows
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if limit is not None and len(rows) >= limit:
                break
            rows.append(json.loads(line))
    return rows
