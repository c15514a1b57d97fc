-- Hooks (docs/daemon.md, "Hooks"): the (event, hook) ledger that makes each hook run
-- effectively once. A row is inserted in the same transaction as the event it runs for, so a
-- durable message always has its pending runs; `running` left by a crash runs again.
CREATE TABLE hook_runs (
    event_id     INTEGER NOT NULL,
    hook         TEXT NOT NULL,
    event_key    TEXT NOT NULL,
    state        TEXT NOT NULL CHECK (state IN ('pending', 'running', 'done', 'failed')),
    failures     INTEGER NOT NULL DEFAULT 0,
    due_at       INTEGER NOT NULL,
    started_at   INTEGER,
    finished_at  INTEGER,
    exit_code    INTEGER,
    last_error   TEXT,
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (event_id, hook)
);

CREATE INDEX hook_runs_due ON hook_runs (state, due_at);

-- The event log gains the `hook_failed` type. SQLite cannot change a CHECK in place, so the
-- table is rebuilt; ids and the AUTOINCREMENT high-water mark (last_event_id) are kept.
CREATE TABLE events_new (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    type        TEXT NOT NULL
                CHECK (type IN ('message', 'peer_join', 'peer_leave', 'broker_status',
                                'outbox_dead', 'hook_failed')),
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
