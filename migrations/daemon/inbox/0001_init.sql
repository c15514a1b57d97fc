-- The inbox (spec §4.10 / v3 §4.5): every delivered message once, deduped on
-- (sender, client_message_id), numbered by a local gapless seq that named consumers count in.
-- Times are milliseconds since the Unix epoch.
CREATE TABLE inbox (
    seq                 INTEGER PRIMARY KEY AUTOINCREMENT,
    id                  TEXT NOT NULL UNIQUE,
    mesh                TEXT NOT NULL,
    sender_pubkey       TEXT NOT NULL,
    sender_name         TEXT,
    client_message_id   TEXT NOT NULL,
    broker_message_id   TEXT NOT NULL,
    dest_kind           TEXT NOT NULL CHECK (dest_kind IN ('topic', 'dm', 'queue')),
    dest_ref            TEXT NOT NULL,
    body                BLOB NOT NULL,
    body_encoding       TEXT NOT NULL CHECK (body_encoding IN ('utf8', 'base64')),
    priority            TEXT NOT NULL,
    meta                TEXT,
    reply_to            TEXT,
    broker_epoch        INTEGER NOT NULL,
    broker_seq          INTEGER NOT NULL,
    sent_at             INTEGER NOT NULL,
    received_at         INTEGER NOT NULL,
    UNIQUE (sender_pubkey, client_message_id)
);

CREATE INDEX inbox_received ON inbox (received_at);

CREATE INDEX inbox_dest ON inbox (dest_kind, dest_ref, seq);

CREATE INDEX inbox_sender ON inbox (sender_pubkey, seq);

-- The local event log behind GET /v1/events: every event has a gapless id that survives
-- restarts, so Last-Event-ID and ?since= give a reconnecting program exactly what it missed.
-- dedupe_key makes re-raising an event after a crash harmless (e.g. outbox_dead:<row id>).
CREATE TABLE events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    type        TEXT NOT NULL
                CHECK (type IN ('message', 'peer_join', 'peer_leave', 'broker_status',
                                'outbox_dead')),
    inbox_seq   INTEGER REFERENCES inbox (seq),
    data        TEXT NOT NULL,
    dedupe_key  TEXT UNIQUE,
    created_at  INTEGER NOT NULL
);

-- Durable named consumers: a program reads after its cursor, persists its outcome, then acks.
CREATE TABLE consumers (
    name        TEXT PRIMARY KEY,
    cursor      INTEGER NOT NULL DEFAULT 0,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL
);

-- The last broker delivery stored, per epoch; what `resume` sends after a reconnect.
CREATE TABLE receive_cursor (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    epoch       INTEGER NOT NULL,
    seq         INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL
);

-- What this member subscribed to (topics) or consumes (queues), as the broker confirmed it.
CREATE TABLE memberships (
    kind        TEXT NOT NULL CHECK (kind IN ('topic', 'queue')),
    name        TEXT NOT NULL,
    since       INTEGER NOT NULL,
    PRIMARY KEY (kind, name)
);

-- This member's profile (summary, status, visible, ...): kept here, sent to the broker on
-- every connect and on every change.
CREATE TABLE profile (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    data        TEXT NOT NULL,
    updated_at  INTEGER NOT NULL
);
