"""``tidemesh audit orphans`` as an operator runs it: its own process, its own JVM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import unavailable
from tests.spark.broker_stores import DAY, TTL_DAYS, WATERMARK, Damage, fill

TIDEMESH = [sys.executable, "-m", "tidemesh"]
# One Spark run in its own JVM took 55-65 s with the suite's three workers on two cores
# (15-20 s alone); a test here makes up to two.
SPARK_RUN_S = 200

pytestmark = [pytest.mark.spark, pytest.mark.timeout(2 * SPARK_RUN_S + 60)]

# No sends older than the dedupe retention: these runs use the real clock, which is earlier
# than the fixed one of the fill, so an expired dedupe row would look young to them.
PLAN = {"a3": ("alpha", "topic", 2 * DAY), "b1": ("beta", "dm", 3 * DAY)}


def test_audit_orphans_cli_exits_11_and_writes_report(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'broker.db'}"
    expected = Damage(fill(url, PLAN)).drop_history("a3")
    out = tmp_path / "out"
    proc = subprocess.run(
        [*TIDEMESH, "audit", "orphans", "--store", url, "--out", str(out),
         "--master", "local[2]", "--watermark-ms", str(WATERMARK),
         "--dedupe-retention-days", str(TTL_DAYS)],
        capture_output=True, text=True, timeout=SPARK_RUN_S, check=False,
        env={**os.environ, "TIDEMESH_AUDIT_PARTITIONS": "2"},
    )
    assert proc.returncode == 11, proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["watermark_ms"] == WATERMARK
    (kind, mesh, row_key), = expected
    assert report["meshes"][mesh][kind] == report["found"] == 1
    assert "audit_finished" in proc.stderr
    # The operator sees which row, not only how many, and can see it again later.
    assert f"{kind}  {mesh}" in proc.stdout and row_key in proc.stdout
    show = subprocess.run([*TIDEMESH, "audit", "show", "--out", str(out)],
                          capture_output=True, text=True, timeout=30, check=False)
    assert show.returncode == 11, show.stderr
    assert show.stdout == proc.stdout
    as_json = subprocess.run([*TIDEMESH, "audit", "show", "--out", str(out), "--json"],
                             capture_output=True, text=True, timeout=30, check=False)
    rows = json.loads(as_json.stdout)["orphans"]
    assert [(r["kind"], r["mesh_id"], r["row_key"]) for r in rows] == [(kind, mesh, row_key)]


def test_audit_show_without_a_report_says_so(tmp_path: Path) -> None:
    proc = subprocess.run([*TIDEMESH, "audit", "show", "--out", str(tmp_path / "none")],
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 1
    assert "no audit report" in proc.stderr and "audit orphans" in proc.stderr


def test_orphan_audit_job_runs_under_spark_submit(tmp_path: Path) -> None:
    """The job file is a spark-submit application; master and jars come from spark-submit."""
    submit = Path(sys.executable).parent / "spark-submit"
    if not submit.exists():
        unavailable("spark-submit is not next to the interpreter (pip install -e '.[spark]')")
    url = f"sqlite://{tmp_path / 'broker.db'}"
    Damage(fill(url, PLAN)).drop_history("a3")
    from tidemesh.spark.config import load

    jar = load({}, {}, {"audit.store": url}).sqlite_jar
    job = Path(__file__).resolve().parents[2] / "spark" / "jobs" / "orphan_audit.py"
    proc = subprocess.run(
        [str(submit), "--master", "local[2]", "--jars", jar, str(job), "--store", url,
         "--out", str(tmp_path / "out"), "--watermark-ms", str(WATERMARK),
         "--dedupe-retention-days", str(TTL_DAYS)],
        capture_output=True, text=True, timeout=SPARK_RUN_S, check=False,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"},
    )
    assert proc.returncode == 11, proc.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["totals"]["message_without_history"] == report["found"] == 1


def test_audit_orphans_cli_rejects_unknown_store_with_usage_code(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*TIDEMESH, "audit", "orphans", "--store", "mysql://db/x", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "unsupported store URL scheme" in proc.stderr
    assert not (tmp_path / "report.json").exists()


def test_audit_orphans_cli_failure_exits_1_without_leaking_password(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*TIDEMESH, "audit", "orphans", "--store",
         "postgresql://audit:s3cret-pw@127.0.0.1:9/nowhere", "--out", str(tmp_path),
         "--master", "local[1]"],
        capture_output=True, text=True, timeout=SPARK_RUN_S, check=False,
        env={**os.environ, "TIDEMESH_AUDIT_LOG_FORMAT": "json"},
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "audit_failed" in proc.stderr
    assert "s3cret-pw" not in proc.stderr + proc.stdout
    assert not (tmp_path / "report.json").exists()
    assert 'cm_broker_dedupe_orphan_check_total{result="failed"} 1.0' in (
        tmp_path / "tidemesh_orphan_audit.prom").read_text()


def _audit(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TIDEMESH, "audit", "orphans", *args], capture_output=True,
                          text=True, timeout=SPARK_RUN_S, check=False,
                          env={**os.environ, **(env or {})})


def test_a_missing_jdbc_driver_is_one_line_naming_the_package(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'broker.db'}"
    fill(url, PLAN)
    proc = _audit("--store", url, "--out", str(tmp_path / "out"), "--master", "local[1]",
                  env={"TIDEMESH_AUDIT_SQLITE_JAR": str(tmp_path / "no-such.jar")})
    assert proc.returncode == 2, proc.stdout + proc.stderr[-3000:]
    said = proc.stdout.strip().splitlines()
    assert len(said) == 1 and "apt-get install libxerial-sqlite-jdbc-java" in said[0], said
    assert "ClassNotFoundException" not in proc.stderr and "WARN" not in proc.stderr, (
        "Spark was never started")
    assert not (tmp_path / "out" / "report.json").exists()


def test_a_missing_pyspark_gives_the_install_command_and_exit_2(tmp_path: Path) -> None:
    # A pyspark that cannot be imported, first on the path: what a plain install looks like.
    fake = tmp_path / "site" / "pyspark"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'pyspark'\", name='pyspark')\n")
    env = {"PYTHONPATH": str(tmp_path / "site")}
    store = ("--store", f"sqlite://{tmp_path / 'broker.db'}", "--out", str(tmp_path / "out"))
    for argv in ([*TIDEMESH, "audit", "orphans", *store],
                 [sys.executable, "-m", "tidemesh.spark.jobs.orphan_audit", *store]):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False,
                              env={**os.environ, **env})
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "pip install 'tidemesh[spark]'" in proc.stderr
        assert "Traceback" not in proc.stderr, proc.stderr


def test_a_clean_run_says_what_it_checked_and_a_failed_one_why(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'broker.db'}"
    fill(url, PLAN)
    between = WATERMARK - int(2.5 * DAY)    # b1 (3 days old) is judged, a3 (2 days) too young
    clean = _audit("--store", url, "--out", str(tmp_path / "out"), "--master", "local[1]",
                   "--watermark-ms", str(between), "--dedupe-retention-days", str(TTL_DAYS))
    assert clean.returncode == 0, clean.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["rows_too_young"] > 0 and report["rows_checked"] > 0
    assert (report["rows_checked"] + report["rows_too_young"]
            == sum(report["table_rows"].values()))
    assert (f"checked {report['rows_checked']} rows; {report['rows_too_young']} newer than "
            "the watermark") in clean.stdout
    failed = _audit("--store", f"sqlite://{tmp_path / 'missing.db'}", "--out",
                    str(tmp_path / "out"), "--master", "local[1]")
    assert failed.returncode == 1, failed.stderr[-3000:]
    line = failed.stdout.strip().splitlines()
    assert len(line) == 1 and line[0].startswith("audit failed: "), failed.stdout
    assert line[0].endswith("the previous report stays in place")
