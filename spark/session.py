"""The SparkSession for the audit, with the JDBC drivers on its classpath.

Owns the Spark settings every audit run needs. ``spark.jars`` only takes effect when the JVM
starts, i.e. on the first session of a Python process (spark-notes gotcha 7), so everything
that needs a session — the job, the tests' one session-scoped fixture — builds it here.
"""

from __future__ import annotations

import os

from pyspark.sql import SparkSession

from tidemesh.spark.config import AuditConfig


def jar_settings(cfg: AuditConfig) -> dict[str, str]:
    """Maven coordinates when configured (machines without the Debian packages), else jars."""
    if cfg.jar_packages:
        return {"spark.jars.packages": cfg.jar_packages}
    return {"spark.jars": f"{cfg.sqlite_jar},{cfg.pg_jar}"}


def under_spark_submit() -> bool:
    """True when spark-submit started this Python process (its JVM is already running)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def build_session(cfg: AuditConfig, app_name: str = "tidemesh-orphan-audit") -> SparkSession:
    """Start (or join) the process's SparkSession with the audit's settings.

    Under spark-submit the master and the jars are spark-submit's (``--master``, ``--jars`` or
    ``--packages``): its JVM started before this code ran, so they are left alone unless
    ``audit.master`` says otherwise.
    """
    master = cfg.master or ("" if under_spark_submit() else "local[*]")
    local = master.startswith("local")
    if local:
        # Without it Spark logs "hostname resolves to a loopback address" on every start.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    settings = {
        **jar_settings(cfg),
        "spark.driver.memory": cfg.driver_memory,
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        # 200 shuffle partitions is Spark's default for big clusters; adaptive execution
        # coalesces them to what the data needs on a small machine.
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.adaptive.coalescePartitions.enabled": "true",
    }
    if local:
        settings["spark.ui.enabled"] = "false"
        settings["spark.sql.shuffle.partitions"] = "8"
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
