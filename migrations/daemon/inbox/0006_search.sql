-- Inbox search (docs/daemon.md, "Searching the inbox"): an FTS5 index over the text bodies
-- (body_encoding 'utf8'; a DM's body is stored opened, so its text is indexed here, on the
-- host, as the inbox itself holds it). The index keeps no copy of the text: its content is
-- the inbox, through the inbox_text view, and it numbers documents by the inbox seq. The
-- sender and topic columns let a search with `from` or `topic` intersect them in the index
-- (a query's own words are kept to the text column: core/search_query.py).
CREATE VIEW inbox_text AS
    SELECT seq, CAST(body AS TEXT) AS text, sender_pubkey AS sender,
           CASE WHEN dest_kind = 'topic' THEN dest_ref END AS topic
    FROM inbox WHERE body_encoding = 'utf8';

-- columnsize=0: no per-row size table (only bm25 ranking reads it; results come in seq order).
CREATE VIRTUAL TABLE inbox_fts USING fts5 (
    text, sender, topic, content = 'inbox_text', content_rowid = 'seq', columnsize = 0
);

-- Whether the index is kept: the [inbox] fts_enabled setting, applied at each start
-- (daemon/store/search.py). It lives in the database so that every writer of inbox.db (the
-- daemon, an offline prune) keeps the index in step through the triggers below. Off until
-- the first start with the setting on fills the index.
INSERT INTO inbox_meta (key, value, updated_at) VALUES ('fts_enabled', 0, 0)
    ON CONFLICT (key) DO NOTHING;

-- Inbox rows are inserted (store_frame) and deleted (retention, prune), never updated by
-- tidemesh today: these triggers keep the index in step on every path, in the writer's
-- transaction. The update trigger is there for a repair or a later migration: an
-- external-content index told a delete with other words than it indexed is damaged, and
-- every later delete of that row fails ("database disk image is malformed").
CREATE TRIGGER inbox_fts_insert AFTER INSERT ON inbox
    WHEN new.body_encoding = 'utf8'
     AND (SELECT value FROM inbox_meta WHERE key = 'fts_enabled') = 1
BEGIN
    INSERT INTO inbox_fts (rowid, text, sender, topic)
        VALUES (new.seq, CAST(new.body AS TEXT), new.sender_pubkey,
                CASE WHEN new.dest_kind = 'topic' THEN new.dest_ref END);
END;

-- An external-content index forgets a row only when told its old text.
CREATE TRIGGER inbox_fts_delete AFTER DELETE ON inbox
    WHEN old.body_encoding = 'utf8'
     AND (SELECT value FROM inbox_meta WHERE key = 'fts_enabled') = 1
BEGIN
    INSERT INTO inbox_fts (inbox_fts, rowid, text, sender, topic)
        VALUES ('delete', old.seq, CAST(old.body AS TEXT), old.sender_pubkey,
                CASE WHEN old.dest_kind = 'topic' THEN old.dest_ref END);
END;

CREATE TRIGGER inbox_fts_update AFTER UPDATE OF body, body_encoding, sender_pubkey, dest_kind,
    dest_ref ON inbox
    WHEN (SELECT value FROM inbox_meta WHERE key = 'fts_enabled') = 1
BEGIN
    INSERT INTO inbox_fts (inbox_fts, rowid, text, sender, topic)
        SELECT 'delete', old.seq, CAST(old.body AS TEXT), old.sender_pubkey,
               CASE WHEN old.dest_kind = 'topic' THEN old.dest_ref END
        WHERE old.body_encoding = 'utf8';
    INSERT INTO inbox_fts (rowid, text, sender, topic)
        SELECT new.seq, CAST(new.body AS TEXT), new.sender_pubkey,
               CASE WHEN new.dest_kind = 'topic' THEN new.dest_ref END
        WHERE new.body_encoding = 'utf8';
END;
