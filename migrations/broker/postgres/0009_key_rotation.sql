-- Key rotation (docs/broker.md, "Key rotation"): a member that moved to a new key keeps its
-- old row, revoked (so nothing that checks revoked_at serves the old key any more) and
-- pointing at its successor. A hello with the old key is refused as rotated out (close 4014),
-- and a DM addressed to the old key goes to the key it points at (always the newest: a
-- second rotation repoints the first one's row).
ALTER TABLE mesh.member ADD COLUMN rotated_to TEXT;
ALTER TABLE mesh.member ADD COLUMN rotated_at BIGINT;
CREATE INDEX member_rotated_to ON mesh.member (mesh_id, rotated_to) WHERE rotated_to IS NOT NULL;
