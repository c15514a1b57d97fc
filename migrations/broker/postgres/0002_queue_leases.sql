-- Queue leases (DESIGN §5.4): a queue delivery not acked within the lease is given to another
-- consumer; the lapsed row stays in its recipient's gapless stream, marked, and is sent to
-- that recipient as a void delivery (acked, never stored).
ALTER TABLE mesh.delivery_queue ADD COLUMN reassigned_at BIGINT;

CREATE INDEX delivery_queue_unacked_idx ON mesh.delivery_queue (created_at)
    WHERE acked_at IS NULL AND reassigned_at IS NULL;
