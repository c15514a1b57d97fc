-- What a running broker says about itself, one value per key. `public_url` is the address the
-- broker serves, recorded at start, so invites made from the CLI point at it even when the
-- broker listens on another port than the default and no broker.public_url is configured.
CREATE TABLE broker_info (
    key         TEXT PRIMARY KEY,
    value       TEXT NOT NULL,
    updated_at  BIGINT NOT NULL
);
