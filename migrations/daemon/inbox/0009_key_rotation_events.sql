-- The event log gains the `peer_key_rotated` type (docs/operations.md, "A key leaked: rotate
-- it"): a peer moved to a new key. Rebuilt as 0007 did; ids, the AUTOINCREMENT high-water
-- mark and 0005's partial index are kept.
CREATE TABLE events_new (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    type        TEXT NOT NULL
                CHECK (type IN ('message', 'peer_join', 'peer_leave', 'broker_status',
                                'outbox_dead', 'hook_failed', 'clone_suspected',
                                'peer_key_rotated')),
    inbox_seq   INTEGER REFERENCES inbox (seq),
    data        TEXT NOT NULL,
    dedupe_key  TEXT UNIQUE,
    created_at  INTEGER NOT NULL
);

INSERT INTO events_new (id, type, inbox_seq, data, dedupe_key, created_at)
    SELECT id, type, inbox_seq, data, dedupe_key, created_at FROM events;

DELETE FROM sqlite_sequence WHERE name = 'events_new';

INSERT INTO sqlite_sequence (name, seq)
    SELECT 'events_new', MAX(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'events'), 0),
                             COALESCE((SELECT MAX(id) FROM events_new), 0));

DROP TABLE events;

ALTER TABLE events_new RENAME TO events;

CREATE INDEX events_inbox_seq ON events (inbox_seq) WHERE inbox_seq IS NOT NULL;
