"""PostgreSQL adapter (asyncpg): tables in schema ``mesh``, on the shared PostgreSQL engine
(``tidemesh.storage.postgres``: a pool, and writer loops that group-commit accepts).

One module per group of tables: ``membership`` (meshes, invites, members, topics, queues),
``accept`` (the accept transaction, through ``broker/store/accept.py``), ``delivery`` (the
receive path), ``retention`` and ``files`` (shared files' chunks).
"""

from __future__ import annotations

from typing import Any

from tidemesh.broker.store.base import POSTGRES_MIGRATIONS, TABLES, OnEngine
from tidemesh.broker.store.postgres.accept import Accept
from tidemesh.broker.store.postgres.delivery import Delivery
from tidemesh.broker.store.postgres.files import Files
from tidemesh.broker.store.postgres.membership import Membership
from tidemesh.broker.store.postgres.retention import Retention
from tidemesh.storage.postgres import Database

# Every statement of the pools and the writers finds its rows by key: each plan must reach
# the tables by their indexes, whatever PostgreSQL knew of them when it made it. A generic
# plan made while a table was empty (a new broker's first runs; planned once per connection
# and kept until an ANALYZE) scanned it whole at every run as it grew: the hand-out's write
# went from 5 to 50 ms in 30 s of ``bench/e2e.py`` (tests/broker/test_store_plans.py). Off,
# a scan is left for what no index serves. That scan's plan then costs more than JIT's
# thresholds, and JIT compiled a one-row read for 95 ms: no statement of these connections
# runs long enough to gain from JIT, so it is off too. And where a scan remains, the generic
# plan costs more than a custom one, so PostgreSQL's default (``auto``) planned the statement
# again at every run (1.2 ms of PostgreSQL's CPU a message under ``bench/latency.py``): every
# statement takes its generic plan, made once per connection, as the pumps' pool's always
# did. Retention sweeps run on connections of their own (``Database.unbounded``), planned as
# usual.
KEYED_SETTINGS = {"enable_seqscan": "off", "jit": "off",
                  "plan_cache_mode": "force_generic_plan"}


class PostgresStore(OnEngine[Database], Membership, Accept, Delivery, Retention,
                    Files):
    """The ``Store`` on PostgreSQL; construct with ``PostgresStore.open``."""

    outage_errors: tuple[type[Exception], ...] = Database.outage_errors

    def __init__(self, dsn: str, db: Database) -> None:
        self.dsn = dsn
        self.db = db
        self.pool = db.pool
        self.generic_pool = db.generic_pool
        self._init_accept()
        self._init_delivery()

    @classmethod
    async def open(cls, dsn: str, *, pool_size: int = 4, batch_max: int = 512,
                   writers: int = 2, migrate_now: bool = True,
                   command_timeout_s: float | None = None) -> PostgresStore:
        async def setup(conn: Any) -> None:
            if migrate_now:
                await POSTGRES_MIGRATIONS.apply_postgres(conn)
            else:
                await POSTGRES_MIGRATIONS.require_current_postgres(conn)

        # Several writers overlap one batch's statements with others' COMMITs; PostgreSQL
        # flushes concurrent commits together, so the fsync is shared too.
        # The pumps' hand-outs and pages on a pool of their own, on generic plans: a batch
        # of them at a time each (``delivery.py``).
        db = await Database.open(dsn, setup, name="broker", pool_size=pool_size,
                                 batch_max=batch_max, writers=writers, generic_pool_size=2,
                                 command_timeout_s=command_timeout_s,
                                 server_settings=KEYED_SETTINGS)
        return cls(dsn, db)

    async def set_info(self, key: str, value: str, now_ms: int) -> None:
        await self.pool.execute(
            "INSERT INTO mesh.broker_info (key, value, updated_at) VALUES ($1, $2, $3)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value,"
            " updated_at = excluded.updated_at", key, value, now_ms)

    async def get_info(self, key: str) -> str | None:
        value = await self.pool.fetchval("SELECT value FROM mesh.broker_info WHERE key = $1", key)
        return None if value is None else str(value)

    async def counts(self) -> dict[str, int]:
        out = {}
        for t in TABLES:
            out[t] = int(await self.pool.fetchval(f"SELECT count(*) FROM mesh.{t}"))  # noqa: S608
        return out
