-- Outbox retention (docs/daemon.md, "What the daemon keeps"): when a row died, an index the
-- sweep walks for settled rows, and the max age negotiated with the broker, kept so that a
-- sweep (or `outbox prune` with the daemon down) knows it before the next connection.
ALTER TABLE outbox ADD COLUMN dead_at INTEGER;

UPDATE outbox SET dead_at = COALESCE(dead_notified_at, next_attempt_at, enqueued_at)
WHERE status = 'dead';

CREATE INDEX outbox_settled ON outbox (status, enqueued_at, id)
WHERE status IN ('done', 'aborted');

-- Deleting a row makes SQLite look for rows whose requeue links point at it (the foreign
-- keys); without these it scans the whole table once per deleted row.
CREATE INDEX outbox_supersedes ON outbox (supersedes) WHERE supersedes IS NOT NULL;

CREATE INDEX outbox_superseded_by ON outbox (superseded_by) WHERE superseded_by IS NOT NULL;

CREATE TABLE outbox_meta (
    key         TEXT PRIMARY KEY,
    value       INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL
);
