"""The daemon's gauges of its own disk and databases, registered by the composition root."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import Histogram

from tidemesh.core.metrics import BATCH_BUCKETS, CallbackGauge, CollectorRegistry
from tidemesh.daemon.service.disk import DiskMonitor
from tidemesh.daemon.store.db import Database


def disk_gauges(registry: CollectorRegistry, disk: DiskMonitor, mesh: str) -> None:
    CallbackGauge(
        "cm_daemon_disk_pct", "Used percent of the file system holding each database",
        ["mesh", "kind"], lambda: [({"mesh": mesh, "kind": db}, disk.state().used_pct)
                                 for db in disk.databases], registry)
    CallbackGauge(
        "cm_daemon_db_bytes", "Size of each database on disk, its WAL included",
        ["mesh", "kind"],
        lambda: [({"mesh": mesh, "kind": k}, float(v)) for k, v in disk.sizes().items()],
        registry)
    CallbackGauge(
        "cm_daemon_disk_free_bytes", "Free bytes of the file system holding the databases",
        ["mesh"], lambda: [({"mesh": mesh}, float(disk.state().free_bytes))], registry)


def db_batches(registry: CollectorRegistry, dbs: dict[str, Database]) -> None:
    """Rows in each SQLite group commit, per database (the store only calls back)."""
    rows = Histogram("cm_daemon_db_batch_rows", "Writes committed together in one SQLite "
                     "transaction, per database", ["db"], registry=registry,
                     buckets=BATCH_BUCKETS)
    for name, db in dbs.items():
        db.on_batch = _observe_rows(rows.labels(db=name))


def _observe_rows(histogram: Histogram) -> Callable[[int, float], None]:
    return lambda rows, _seconds: histogram.observe(rows)
