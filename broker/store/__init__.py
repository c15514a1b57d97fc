"""Broker stores: ``open_store(url)`` picks the adapter from the URL.

``sqlite:///PATH`` (the embedded default) or ``postgresql://…`` / ``postgres://…``.
"""

from __future__ import annotations

from pathlib import Path

from tidemesh.broker.store.base import Store
from tidemesh.broker.store.cluster import Cluster, SingleBroker
from tidemesh.core.errors import InvalidRequest


def sqlite_file(url: str) -> Path | None:
    """The database file of an embedded store's URL; None for PostgreSQL."""
    return Path(url.removeprefix("sqlite://")) if url.startswith("sqlite:///") else None


async def open_store(url: str, *, batch_max: int = 512, pool_size: int = 4, writers: int = 2,
                     migrate_now: bool = True, command_timeout_s: float | None = None) -> Store:
    """``command_timeout_s``: PostgreSQL statements unanswered that long fail as an outage
    (None: no limit; operator commands, whose statements may run long, keep none)."""
    if (path := sqlite_file(url)) is not None:
        from tidemesh.broker.store.sqlite import SqliteStore

        return await SqliteStore.open(path, batch_max=batch_max, migrate_now=migrate_now)
    if url.startswith(("postgresql://", "postgres://")):
        from tidemesh.broker.store.postgres import PostgresStore

        return await PostgresStore.open(url, pool_size=pool_size, batch_max=batch_max,
                                        writers=writers, migrate_now=migrate_now,
                                        command_timeout_s=command_timeout_s)
    raise InvalidRequest(f"store must be sqlite:///PATH or postgresql://…, not {url!r}",
                         field="store")


def open_cluster(store: Store, broker_id: str) -> Cluster | SingleBroker:
    """How this broker hears the others on its database: LISTEN/NOTIFY on PostgreSQL; the
    embedded SQLite store serves one broker alone."""
    from tidemesh.broker.store.postgres import PostgresStore

    if isinstance(store, PostgresStore):
        from tidemesh.broker.store.postgres.cluster import PostgresCluster

        return PostgresCluster(store.dsn, store.pool, broker_id)
    return SingleBroker()
