-- A topic is a log, a subscriber a cursor (docs/broker.md, "How a topic fans out"). The
-- accept of a topic message writes the message with the next position of its topic's log
-- (``topic.last_pos``, bumped in the accept's transaction: positions are dense per topic
-- and a later position never commits before an earlier one). Each subscription remembers
-- the last position handed to its member (``log_pos``); what lies after it is given the
-- member's next seqs, a run of consecutive positions at a time, as one ``topic_delivery``
-- row (seq_first..seq_last ↔ pos_first..). Rows of ``delivery_queue`` from before this
-- migration keep their seqs and are delivered as before.
ALTER TABLE mesh.topic ADD COLUMN last_pos BIGINT NOT NULL DEFAULT 0;
ALTER TABLE mesh.topic_subscription ADD COLUMN log_pos BIGINT NOT NULL DEFAULT 0;
ALTER TABLE mesh.topic_message ADD COLUMN log_pos BIGINT;
-- Where the message stands among all topics' messages: a member's topics are handed out
-- merged in this order, so that a sender's messages keep their order across topics.
ALTER TABLE mesh.topic_message ADD COLUMN log_order BIGINT;

CREATE UNIQUE INDEX topic_message_log_idx ON mesh.topic_message (mesh_id, topic, log_pos)
    WHERE log_pos IS NOT NULL;

CREATE TABLE mesh.topic_delivery (
    mesh_id           TEXT NOT NULL,
    recipient_pubkey  TEXT NOT NULL,
    epoch             BIGINT NOT NULL,
    seq_last          BIGINT NOT NULL,
    seq_first         BIGINT NOT NULL,
    topic             TEXT NOT NULL,
    pos_first         BIGINT NOT NULL,
    created_at        BIGINT NOT NULL,
    PRIMARY KEY (mesh_id, recipient_pubkey, epoch, seq_last)
);

CREATE INDEX topic_delivery_log_idx ON mesh.topic_delivery (mesh_id, topic, pos_first);

CREATE SEQUENCE mesh.topic_log_order;

-- A member's subscriptions, for handing out what their topics logged since.
CREATE INDEX topic_subscription_member_idx ON mesh.topic_subscription (mesh_id, member_pubkey);

-- A hand-out moves a subscription's log_pos and a cursor's last_seq, an ack its acked_seq:
-- no index covers them, and room left on each page keeps those updates HOT (the new version
-- on the same page, no index entry), instead of a moved row and new entries in every index.
ALTER TABLE mesh.topic_subscription SET (fillfactor = 50);
ALTER TABLE mesh.recipient_cursor SET (fillfactor = 50);
