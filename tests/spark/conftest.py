"""One SparkSession for the whole pytest process, and builders for real broker stores.

The JDBC jars reach the JVM only when it starts, so no test may make its own session first
(spark-notes gotcha 7): every Spark test takes ``spark`` from here.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.conftest import unavailable

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tidemesh.spark.config import AuditConfig


def audit_config(store: str, out: Path, **overrides: object) -> AuditConfig:
    from tidemesh.spark.config import load

    flags: dict[str, object] = {"audit.store": store, "audit.out": str(out),
                                "audit.master": "local[2]", "audit.partitions": 3}
    flags.update({f"audit.{k}": v for k, v in overrides.items()})
    return load({}, {}, flags)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    if importlib.util.find_spec("pyspark") is None:
        unavailable("pyspark is not installed (pip install -e '.[spark]')")
    if shutil.which("java") is None:
        unavailable("java is not on PATH (scripts/system-deps installs it)")
    from tidemesh.spark.session import build_session

    cfg = audit_config("sqlite:///unused.db", tmp_path_factory.mktemp("spark"))
    for jar in (cfg.pg_jar, cfg.sqlite_jar):
        if not Path(jar).exists():
            unavailable(f"JDBC driver {jar} is missing (scripts/system-deps installs it)")
    session = build_session(cfg, app_name="tidemesh-tests")
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
