-- The outbox (spec §4.5.2) plus what the sender and operators need.
-- Times are milliseconds since the Unix epoch.
CREATE TABLE outbox (
    id                  TEXT PRIMARY KEY,
    client_message_id   TEXT NOT NULL UNIQUE,
    request_fingerprint BLOB NOT NULL CHECK (length(request_fingerprint) = 32),
    payload             BLOB NOT NULL,
    dest_kind           TEXT NOT NULL CHECK (dest_kind IN ('topic', 'dm', 'queue')),
    dest_ref            TEXT NOT NULL,
    enqueued_at         INTEGER NOT NULL,
    attempts            INTEGER NOT NULL DEFAULT 0,
    next_attempt_at     INTEGER NOT NULL,
    status              TEXT NOT NULL
                        CHECK (status IN ('pending', 'inflight', 'done', 'dead', 'aborted')),
    last_error          TEXT,
    delivered_at        INTEGER,
    broker_message_id   TEXT,
    history_id          TEXT,
    aborted_at          INTEGER,
    aborted_by          TEXT,
    superseded_by       TEXT REFERENCES outbox (id),
    supersedes          TEXT REFERENCES outbox (id),
    -- set once the outbox_dead event for this row is in the event log (re-raised after a
    -- crash between the two databases; the event log dedupes it)
    dead_notified_at    INTEGER
);

CREATE INDEX outbox_pending ON outbox (status, next_attempt_at);

CREATE INDEX outbox_aborted ON outbox (status, aborted_at) WHERE status = 'aborted';
