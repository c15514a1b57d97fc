"""``tidemesh audit orphans``: run the nightly orphan audit (docs/audit.md).

The audit is a Spark job (``tidemesh.spark.jobs.orphan_audit``); this command runs it as a
child Python process and ends with its exit code. The CLI never imports ``spark`` or
``pyspark`` itself: the apps stay independent, a plain ``tidemesh`` install without the
``spark`` extra still starts fast, and the JVM lives and dies with the child.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import click

from tidemesh.core.exitcodes import Exit

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
def orphans_cmd(store: str | None, out: str | None, master: str | None,
                config_file: str | None, textfile: str | None, watermark_ms: int | None,
                dedupe_mode: str | None, dedupe_retention_days: int | None) -> None:
    """Find dedupe, message, history and delivery rows that lost their partner.

    Exit 0 when clean, 11 when orphans were found, 2 on bad options, 1 when the audit
    could not run (the previous report stays in place).
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
    raise SystemExit(subprocess.run(argv, check=False).returncode)
