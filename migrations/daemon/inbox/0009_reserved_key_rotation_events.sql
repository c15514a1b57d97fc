-- Reserved for the key rotation's events (another change owns inbox migration 0009); empty so
-- that 0010 can be numbered 1..n until that change lands. Replaced by it on merge.
SELECT 1;
