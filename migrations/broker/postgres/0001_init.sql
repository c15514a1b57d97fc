-- Broker store, PostgreSQL flavour (schema mesh). Table and column names match the SQLite set
-- (migrations/broker/sqlite) one for one; a test compares them.
-- Times are BIGINT milliseconds since the Unix epoch (*_at); ids are ULID text made in code.
-- Foreign keys are declared only where no retention sweep deletes the parent before the
-- child (messages may be pruned while dedupe rows live on, spec §4.3).

CREATE SCHEMA IF NOT EXISTS mesh;

CREATE TABLE mesh.mesh (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    created_at  BIGINT NOT NULL
);

CREATE TABLE mesh.member (
    mesh_id       TEXT NOT NULL REFERENCES mesh.mesh (id) ON DELETE CASCADE,
    pubkey        TEXT NOT NULL CHECK (length(pubkey) = 64),
    display_name  TEXT,
    invite_id     TEXT,
    joined_at     BIGINT NOT NULL,
    revoked_at    BIGINT,
    PRIMARY KEY (mesh_id, pubkey)
);

-- Only the sha256 of an invite's secret is stored: a leaked database cannot mint members.
CREATE TABLE mesh.invite (
    id            TEXT PRIMARY KEY,
    mesh_id       TEXT NOT NULL REFERENCES mesh.mesh (id) ON DELETE CASCADE,
    token_sha256  BYTEA NOT NULL UNIQUE,
    max_uses      INTEGER NOT NULL CHECK (max_uses >= 1),
    uses          INTEGER NOT NULL DEFAULT 0,
    created_at    BIGINT NOT NULL,
    expires_at    BIGINT,
    revoked_at    BIGINT
);

CREATE TABLE mesh.topic (
    mesh_id     TEXT NOT NULL REFERENCES mesh.mesh (id) ON DELETE CASCADE,
    name        TEXT NOT NULL,
    created_by  TEXT,
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (mesh_id, name)
);

CREATE TABLE mesh.topic_subscription (
    mesh_id        TEXT NOT NULL,
    topic          TEXT NOT NULL,
    member_pubkey  TEXT NOT NULL,
    subscribed_at  BIGINT NOT NULL,
    PRIMARY KEY (mesh_id, topic, member_pubkey),
    FOREIGN KEY (mesh_id, topic) REFERENCES mesh.topic (mesh_id, name) ON DELETE CASCADE
);

-- A queue exists while it has at least one consumer (DESIGN §5.4: competing consumers).
CREATE TABLE mesh.queue_consumer (
    mesh_id        TEXT NOT NULL REFERENCES mesh.mesh (id) ON DELETE CASCADE,
    queue          TEXT NOT NULL,
    member_pubkey  TEXT NOT NULL,
    registered_at  BIGINT NOT NULL,
    PRIMARY KEY (mesh_id, queue, member_pubkey)
);

-- Spec §4.3 with DESIGN §5.2: keys belong to the sending member.
CREATE TABLE mesh.client_message_dedupe (
    mesh_id              TEXT NOT NULL,
    sender_pubkey        TEXT NOT NULL,
    client_message_id    TEXT NOT NULL,
    broker_message_id    TEXT NOT NULL,
    history_id           TEXT NOT NULL,
    request_fingerprint  BYTEA NOT NULL CHECK (octet_length(request_fingerprint) = 32),
    destination_kind     TEXT NOT NULL CHECK (destination_kind IN ('topic', 'dm', 'queue')),
    destination_ref      TEXT NOT NULL,
    first_seen_at        BIGINT NOT NULL,
    expires_at           BIGINT,
    history_available    BOOLEAN NOT NULL DEFAULT TRUE,
    PRIMARY KEY (mesh_id, sender_pubkey, client_message_id)
);

CREATE INDEX client_message_dedupe_expires_idx
    ON mesh.client_message_dedupe (expires_at) WHERE expires_at IS NOT NULL;

CREATE INDEX client_message_dedupe_message_idx ON mesh.client_message_dedupe (broker_message_id);

CREATE TABLE mesh.topic_message (
    id                 TEXT PRIMARY KEY,
    mesh_id            TEXT NOT NULL,
    sender_pubkey      TEXT NOT NULL,
    client_message_id  TEXT,
    topic              TEXT NOT NULL,
    body               BYTEA NOT NULL,
    body_encoding      TEXT NOT NULL CHECK (body_encoding IN ('utf8', 'base64')),
    priority           TEXT NOT NULL CHECK (priority IN ('now', 'next', 'low')),
    meta               TEXT,
    reply_to           TEXT,
    created_at         BIGINT NOT NULL
);

CREATE INDEX topic_message_client_idx
    ON mesh.topic_message (mesh_id, sender_pubkey, client_message_id);
CREATE INDEX topic_message_created_idx ON mesh.topic_message (created_at);

-- DMs (sealed bytes the broker cannot read) and queue messages.
CREATE TABLE mesh.message_queue (
    id                 TEXT PRIMARY KEY,
    mesh_id            TEXT NOT NULL,
    sender_pubkey      TEXT NOT NULL,
    client_message_id  TEXT,
    destination_kind   TEXT NOT NULL CHECK (destination_kind IN ('dm', 'queue')),
    destination_ref    TEXT NOT NULL,
    body               BYTEA NOT NULL,
    body_encoding      TEXT NOT NULL CHECK (body_encoding IN ('utf8', 'base64')),
    priority           TEXT NOT NULL CHECK (priority IN ('now', 'next', 'low')),
    meta               TEXT,
    reply_to           TEXT,
    created_at         BIGINT NOT NULL
);

CREATE INDEX message_queue_client_idx
    ON mesh.message_queue (mesh_id, sender_pubkey, client_message_id);
CREATE INDEX message_queue_created_idx ON mesh.message_queue (created_at);

CREATE TABLE mesh.message_history (
    history_id         TEXT PRIMARY KEY,
    broker_message_id  TEXT NOT NULL UNIQUE,
    mesh_id            TEXT NOT NULL,
    sender_pubkey      TEXT NOT NULL,
    destination_kind   TEXT NOT NULL CHECK (destination_kind IN ('topic', 'dm', 'queue')),
    destination_ref    TEXT NOT NULL,
    created_at         BIGINT NOT NULL
);

CREATE INDEX message_history_mesh_idx ON mesh.message_history (mesh_id, created_at);

-- Per-recipient gapless sequence (DESIGN §6): last_seq is the highest seq handed out in this
-- epoch, acked_seq the recipient's cumulative ack, compacted_seq the highest seq purged.
CREATE TABLE mesh.recipient_cursor (
    mesh_id           TEXT NOT NULL,
    recipient_pubkey  TEXT NOT NULL,
    epoch             BIGINT NOT NULL DEFAULT 1,
    last_seq          BIGINT NOT NULL DEFAULT 0,
    acked_seq         BIGINT NOT NULL DEFAULT 0,
    compacted_seq     BIGINT NOT NULL DEFAULT 0,
    updated_at        BIGINT NOT NULL,
    PRIMARY KEY (mesh_id, recipient_pubkey)
);

CREATE TABLE mesh.delivery_queue (
    mesh_id            TEXT NOT NULL,
    recipient_pubkey   TEXT NOT NULL,
    epoch              BIGINT NOT NULL,
    seq                BIGINT NOT NULL,
    broker_message_id  TEXT NOT NULL,
    created_at         BIGINT NOT NULL,
    acked_at           BIGINT,
    PRIMARY KEY (mesh_id, recipient_pubkey, epoch, seq)
);

CREATE INDEX delivery_queue_message_idx ON mesh.delivery_queue (broker_message_id);
