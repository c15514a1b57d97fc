-- Kept alike with the PostgreSQL set (the SQLite store serves one broker and leaves this
-- table empty): the host mark of the hello behind each live session.
ALTER TABLE member_session ADD COLUMN host TEXT;
