-- Reserved for the topic log (another change owns migration 0008); empty so that 0009 can
-- be numbered 1..n until that change lands. Replaced by it on merge.
SELECT 1;
