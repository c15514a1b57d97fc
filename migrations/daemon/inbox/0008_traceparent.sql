-- W3C trace context (docs/ipc.md, "Trace context"): the traceparent the message was sent
-- with, returned in /v1/inbox items and message events and given to hooks as TRACEPARENT.
-- NULL for messages from senders whose daemon carried none.
ALTER TABLE inbox ADD COLUMN traceparent TEXT;
