"""The audit on a real Spark standalone cluster: a master and a worker in their own JVMs.

Started from the pyspark package's own ``bin/spark-class``, as an operator without a Spark
distribution would. The job runs as ``tidemesh audit orphans --master spark://…`` against
PostgreSQL, so the JDBC driver must reach the executors (``spark.jars`` shipped by the
driver) and the findings must be the ones a ``local[*]`` run finds.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.conftest import unavailable
from tests.spark.broker_stores import DAY, TTL_DAYS, WATERMARK, Damage, fill
from tests.spark.conftest import audit_config

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.postgres]

TIDEMESH = [sys.executable, "-m", "tidemesh"]
# Real clock in the child process: no send older than the dedupe retention (see test_audit_cli).
PLAN = {"a1": ("alpha", "topic", 2 * DAY), "a2": ("alpha", "dm", DAY),
        "b1": ("beta", "dm", 3 * DAY), "b2": ("beta", "topic", DAY)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True, slots=True)
class Cluster:
    master_url: str
    work_dir: Path

    def executor_logs(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.work_dir.glob("*/*/stderr"))


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _start(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def _wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            pytest.fail(f"the Spark {what} exited {proc.returncode}: "
                        f"{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.25)
    pytest.fail(f"the Spark {what} did not start: {log.read_text(errors='replace')[-3000:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture
def cluster(tmp_path: Path, spark: SparkSession) -> Iterator[Cluster]:
    """One master and one worker (2 cores) on loopback; stopped after the test."""
    home = _spark_home()
    spark_class = home / "bin" / "spark-class"
    if not spark_class.exists():
        unavailable(f"the pyspark package has no bin/spark-class ({home})")
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": sys.executable, "SPARK_LOG_DIR": str(tmp_path / "logs"),
           "SPARK_WORKER_DIR": str(tmp_path / "work")}
    port = _free_port()
    url = f"spark://127.0.0.1:{port}"
    master_log, worker_log = tmp_path / "master.log", tmp_path / "worker.log"
    master = _start([str(spark_class), "org.apache.spark.deploy.master.Master",
                     "--host", "127.0.0.1", "--port", str(port),
                     "--webui-port", str(_free_port())], master_log, env)
    try:
        _wait_for(master_log, "I have been elected leader", master, "master")
        worker = _start([str(spark_class), "org.apache.spark.deploy.worker.Worker",
                         "--host", "127.0.0.1", "--cores", "2", "--memory", "2g",
                         "--webui-port", str(_free_port()), url], worker_log, env)
        try:
            _wait_for(worker_log, "Successfully registered with master", worker, "worker")
            yield Cluster(url, tmp_path / "work")
        finally:
            _stop(worker)
    finally:
        _stop(master)


# Starting a master, a worker and a spark-submit takes minutes on a busy 2-core host; the
# default 120 s would interrupt a py4j call and break the session every later test shares.
@pytest.mark.timeout(600)
def test_audit_on_a_standalone_cluster_finds_what_local_finds(
    cluster: Cluster, spark: SparkSession, pg_database: str, tmp_path: Path
) -> None:
    from tidemesh.spark.jobs.orphan_audit import run_audit

    filled = fill(pg_database, PLAN)
    d = Damage(filled)
    expected = d.drop_history("a1") | d.drop_dedupe("b1") | d.repoint_delivery("a2")

    proc = subprocess.run(
        [*TIDEMESH, "audit", "orphans", "--store", pg_database, "--out",
         str(tmp_path / "cluster"), "--master", cluster.master_url,
         "--watermark-ms", str(WATERMARK), "--dedupe-retention-days", str(TTL_DAYS), "--json"],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
             "TIDEMESH_AUDIT_PARTITIONS": "4"},
    )
    assert proc.returncode == 11, proc.stderr[-4000:]
    on_cluster = {(r["kind"], r["mesh_id"], r["row_key"])
                  for r in json.loads(proc.stdout)["orphans"]}

    local = run_audit(spark, audit_config(pg_database, tmp_path / "local",
                                          dedupe_retention_days=TTL_DAYS,
                                          watermark_ms=WATERMARK))
    assert local.report is not None, local.error
    on_local = {(r["kind"], r["mesh_id"], r["row_key"]) for r in local.report["sample"]}

    assert on_cluster == on_local == expected
    # The cluster's executor did the work, with the PostgreSQL driver shipped to it.
    executor = cluster.executor_logs()
    assert "Finished task" in executor
    assert "/jars/postgresql.jar" in executor
