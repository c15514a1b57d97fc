-- Shared files (docs/broker.md, "Files"): one row per file, its chunks as rows of their own.
-- A file is complete once every chunk is stored; only then may members fetch it. expires_at
-- is NULL for a persistent file, which retention keeps. stored_bytes counts against its
-- owner's quota (files.member_quota_bytes).
CREATE TABLE file_object (
    mesh_id         TEXT NOT NULL,
    id              TEXT NOT NULL,
    owner_pubkey    TEXT NOT NULL,
    size            INTEGER NOT NULL,
    chunk_size      INTEGER NOT NULL,
    chunks          INTEGER NOT NULL,
    sealed          INTEGER NOT NULL,
    persistent      INTEGER NOT NULL,
    stored_chunks   INTEGER NOT NULL DEFAULT 0,
    stored_bytes    INTEGER NOT NULL DEFAULT 0,
    created_at      INTEGER NOT NULL,
    complete_at     INTEGER,
    expires_at      INTEGER,
    PRIMARY KEY (mesh_id, id)
);

CREATE INDEX file_object_owner ON file_object (mesh_id, owner_pubkey);

CREATE INDEX file_object_expires ON file_object (expires_at) WHERE expires_at IS NOT NULL;

CREATE TABLE file_chunk (
    mesh_id     TEXT NOT NULL,
    file_id     TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    data        BLOB NOT NULL,
    PRIMARY KEY (mesh_id, file_id, seq)
);
