-- Clone detection across brokers (docs/broker.md, "Clone detection"): the host mark of the
-- hello behind each live session, so a broker can tell a member's other host from a reconnect.
-- NULL for daemons that send none.
ALTER TABLE mesh.member_session ADD COLUMN host TEXT;
