"""The audit's settings: declared once, resolved flag > ``TIDEMESH_AUDIT_*`` env > TOML > default.

Owns the ``SETTINGS`` table of the orphan audit and the frozen ``AuditConfig`` built from it.
Pure given its inputs: the job reads the file and the environment and passes them in.

JDBC drivers come from jar paths (the Debian packages ``libpostgresql-jdbc-java`` and
``libxerial-sqlite-jdbc-java`` install them at the defaults below) or, where those packages do
not exist, from Maven coordinates in ``audit.jar_packages`` (Spark's ``spark.jars.packages``),
for example ``org.postgresql:postgresql:42.7.4,org.xerial:sqlite-jdbc:3.46.1.3``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tidemesh.core.settings import ConfigError, Setting, resolve

DAY_MS = 86_400_000

SETTINGS: tuple[Setting, ...] = (
    Setting("audit.store", str, None, "Broker store URL: sqlite:///path/broker.db or "
            "postgresql://user@host:5432/db.", optional=True),
    Setting("audit.out", str, "orphan-audit", "Folder for report.json, runs/ and the textfile."),
    Setting("audit.textfile", str, None, "Prometheus textfile to write (default: "
            "<out>/tidemesh_orphan_audit.prom).", optional=True),
    Setting("audit.master", str, None, "Spark master URL (spark://…, yarn, k8s://…); unset means "
            "local[*], or whatever spark-submit was given.", optional=True),
    Setting("audit.grace_seconds", int, 900, "Rows younger than this at start are in flight and "
            "not judged; also the clock-skew margin for dedupe expiry."),
    Setting("audit.watermark_ms", int, None, "Pin the input watermark (ms since epoch) instead "
            "of start minus grace; re-runs with the same value judge the same rows.",
            optional=True),
    Setting("audit.dedupe_mode", str, "retention_scoped", "The broker's dedupe mode: "
            "retention_scoped or permanent (rows never expire)."),
    Setting("audit.dedupe_retention_days", int, 14, "The broker's dedupe retention in days; "
            "must equal the broker's dedupe.retention_days (its default is 14)."),
    Setting("audit.partitions", int, 4, "JDBC read partitions per table."),
    Setting("audit.fetch_size", int, 10000, "JDBC fetch size (rows per round trip)."),
    Setting("audit.pg_jar", str, "/usr/share/java/postgresql.jar", "PostgreSQL JDBC driver jar."),
    Setting("audit.sqlite_jar", str, "/usr/share/java/sqlite-jdbc.jar", "SQLite JDBC driver jar."),
    Setting("audit.jar_packages", str, None, "Maven coordinates for spark.jars.packages, used "
            "instead of the jar paths when set.", optional=True),
    Setting("audit.driver_memory", str, "2g", "spark.driver.memory for a job that starts its "
            "own JVM."),
    Setting("audit.log_format", str, "auto", "auto, json or console."),
)

DEDUPE_MODES = ("retention_scoped", "permanent")


@dataclass(frozen=True, slots=True)
class AuditConfig:
    store: str = field(repr=False)     # may carry a password; log parse_store(...).display
    out: str
    textfile: str | None
    master: str | None
    grace_seconds: int
    watermark_ms: int | None
    dedupe_mode: str
    dedupe_retention_days: int
    partitions: int
    fetch_size: int
    pg_jar: str
    sqlite_jar: str
    jar_packages: str | None
    driver_memory: str
    log_format: str

    @property
    def dedupe_ttl_ms(self) -> int | None:
        """How long the broker keeps a dedupe row; None in permanent mode."""
        if self.dedupe_mode == "permanent":
            return None
        return self.dedupe_retention_days * DAY_MS


def load(
    file_data: Mapping[str, Any], environ: Mapping[str, str], flags: Mapping[str, Any]
) -> AuditConfig:
    """Resolve every setting and check the ones a run cannot start without."""
    values = {name.split(".", 1)[1]: r.value
              for name, r in resolve(SETTINGS, file_data, environ, flags).items()}
    cfg = AuditConfig(**values)
    if not cfg.store:
        raise ConfigError("no store given: pass --store or set TIDEMESH_AUDIT_STORE",
                          field="audit.store")
    if cfg.dedupe_mode not in DEDUPE_MODES:
        raise ConfigError(f"audit.dedupe_mode must be one of {', '.join(DEDUPE_MODES)}",
                          field="audit.dedupe_mode")
    for name in ("partitions", "fetch_size", "dedupe_retention_days"):
        if values[name] < 1:
            raise ConfigError(f"audit.{name} must be at least 1", field=f"audit.{name}")
    if cfg.grace_seconds < 0:
        raise ConfigError("audit.grace_seconds must not be negative", field="audit.grace_seconds")
    return cfg
