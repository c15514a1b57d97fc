-- Shared files (docs/broker.md, "Files"): one row per file, its chunks as bytea rows of their
-- own. A file is complete once every chunk is stored; only then may members fetch it.
-- expires_at is NULL for a persistent file, which retention keeps. stored_bytes counts
-- against its owner's quota (files.member_quota_bytes).
CREATE TABLE mesh.file_object (
    mesh_id         TEXT NOT NULL,
    id              TEXT NOT NULL,
    owner_pubkey    TEXT NOT NULL,
    size            BIGINT NOT NULL,
    chunk_size      INTEGER NOT NULL,
    chunks          INTEGER NOT NULL,
    sealed          BOOLEAN NOT NULL,
    persistent      BOOLEAN NOT NULL,
    stored_chunks   INTEGER NOT NULL DEFAULT 0,
    stored_bytes    BIGINT NOT NULL DEFAULT 0,
    created_at      BIGINT NOT NULL,
    complete_at     BIGINT,
    expires_at      BIGINT,
    PRIMARY KEY (mesh_id, id)
);

CREATE INDEX file_object_owner ON mesh.file_object (mesh_id, owner_pubkey);

CREATE INDEX file_object_expires ON mesh.file_object (expires_at) WHERE expires_at IS NOT NULL;

-- Chunks are written once and read whole: no TOAST compression of ciphertext.
CREATE TABLE mesh.file_chunk (
    mesh_id     TEXT NOT NULL,
    file_id     TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    data        BYTEA NOT NULL,
    PRIMARY KEY (mesh_id, file_id, seq)
);

ALTER TABLE mesh.file_chunk ALTER COLUMN data SET STORAGE EXTERNAL;
