-- Inbox and event retention (docs/daemon.md, "What the daemon keeps"): what a named consumer
-- lost to retention before it acked (reported on its next read until it acks past it), and
-- how far the event log has been pruned (answered to a stream that asks for older events).
ALTER TABLE consumers ADD COLUMN lost_count INTEGER NOT NULL DEFAULT 0;

ALTER TABLE consumers ADD COLUMN lost_through INTEGER;

CREATE TABLE inbox_meta (
    key         TEXT PRIMARY KEY,
    value       INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL
);
