"""The write engines shared by the daemon and the broker (installed as ``tidemesh.storage``).

``engine`` is what both engines are: the one ``BatchOp``, the ``Engine`` protocol, and the
rules of a batch (a savepoint per op run, redone arg by arg when it fails; a full disk or a
lost connection fails the whole batch). ``migrate`` is the one migration runner of every
database the daemon and the broker keep.

``sqlite`` is the one SQLite engine, on aiosqlite: one writer connection that group-commits
queued writes in ``BEGIN IMMEDIATE`` with a savepoint per item (the whole batch one call on its
thread), and one read-only connection. ``postgres`` is the asyncpg engine: a pool for single
statements and writer loops that group-commit batch operations. Both answer a caller only after
COMMIT, map database failures to the one error tree (507 on a full disk, 503 otherwise, naming
the database), count their batches (``stats.BatchStats``) and hand their writer tasks to the
composition root to supervise.

Imports only ``tidemesh.core`` and itself: no SQL of any table lives here but that of the
record of applied migrations.
"""
