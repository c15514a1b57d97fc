-- Several brokers on one database (DESIGN §10): which broker holds each member's live session
-- (one per member; the newest connection takes it over), with what the others must show of it
-- (display name, profile as JSON), and when each broker last said it was alive. A broker that
-- stops saying so has its sessions removed by the others (docs/broker.md, "Several brokers").
-- The SQLite store serves one broker and leaves these tables empty.
CREATE TABLE broker_alive (
    broker_id     TEXT PRIMARY KEY,
    heartbeat_at  BIGINT NOT NULL
);

CREATE TABLE member_session (
    mesh_id       TEXT NOT NULL,
    pubkey        TEXT NOT NULL,
    broker_id     TEXT NOT NULL,
    session_id    TEXT NOT NULL,
    display_name  TEXT,
    profile       TEXT,
    connected_at  BIGINT NOT NULL,
    PRIMARY KEY (mesh_id, pubkey)
);

CREATE INDEX member_session_broker ON member_session (broker_id);
