-- A mesh's own member send budget (`tidemesh broker mesh limits`): token bucket refill per
-- second and size. NULL uses the broker's limits.member_rate / limits.member_burst; a rate of
-- 0 means no limit for that mesh.
ALTER TABLE mesh ADD COLUMN member_rate REAL;
ALTER TABLE mesh ADD COLUMN member_burst INTEGER;
