-- Deleting an inbox row checks events.inbox_seq (its foreign key), and the retention sweep
-- clears that link first: without an index each of those walked the whole event log, once
-- per deleted row (a 500-row step took ~0.8 s at 50,000 kept events, on the writer that
-- stores received frames). Only linked events are indexed.
CREATE INDEX events_inbox_seq ON events (inbox_seq) WHERE inbox_seq IS NOT NULL;
