"""The write engines shared by the daemon and the broker (installed as ``tidemesh.storage``).

``sqlite`` is the one SQLite engine, on aiosqlite: one writer connection that group-commits
queued writes in ``BEGIN IMMEDIATE`` with a savepoint per item (the whole batch one call on its
thread), and one read-only connection. ``postgres`` is the asyncpg engine: a pool for single
statements and writer loops that group-commit batch operations. Both answer a caller only after
COMMIT, map database failures to the one error tree (507 on a full disk, 503 otherwise, naming
the database), count their batches (``stats.BatchStats``) and hand their writer tasks to the
composition root to supervise.

Imports only ``tidemesh.core`` and itself: no SQL of any table lives here.
"""
