-- W3C trace context (docs/broker.md, "Trace context"): the traceparent a send carried, kept
-- with the message and delivered with it. NULL for messages from daemons that send none.
ALTER TABLE mesh.topic_message ADD COLUMN traceparent TEXT;
ALTER TABLE mesh.message_queue ADD COLUMN traceparent TEXT;
