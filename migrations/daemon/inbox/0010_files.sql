-- Shared files (docs/ipc.md, "Files"): the files this member shared and those announced to
-- it, which `GET /v1/file/list` shows and `GET /v1/file/get` fetches by id. file_key is a
-- DM file's key (hex), as private as the opened DMs beside it. A file shared to a topic
-- this member reads comes back as received too: (id, direction) is the key.
CREATE TABLE files (
    id              TEXT NOT NULL,
    direction       TEXT NOT NULL CHECK (direction IN ('shared', 'received')),
    name            TEXT NOT NULL,
    size            INTEGER NOT NULL,
    sha256          TEXT NOT NULL,
    chunk_size      INTEGER NOT NULL,
    file_key        TEXT,
    persistent      INTEGER NOT NULL,
    sender_pubkey   TEXT NOT NULL,
    dest_kind       TEXT NOT NULL,
    dest_ref        TEXT NOT NULL,
    message         TEXT,
    inbox_seq       INTEGER,
    created_at      INTEGER NOT NULL,
    PRIMARY KEY (id, direction)
);

CREATE INDEX files_created ON files (created_at);

-- The event log gains `file_shared`, and keeps `peer_key_rotated` (the key rotation's 0009).
-- SQLite cannot change a CHECK in place, so the table is rebuilt as in 0007; ids, the
-- AUTOINCREMENT high-water mark and the partial index are kept.
CREATE TABLE events_new (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    type        TEXT NOT NULL
                CHECK (type IN ('message', 'peer_join', 'peer_leave', 'broker_status',
                                'outbox_dead', 'hook_failed', 'clone_suspected',
                                'peer_key_rotated', 'file_shared')),
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
