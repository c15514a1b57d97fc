-- migrate: outside-transaction
-- Give the space of pruned rows back to the file system: sweeps run `incremental_vacuum`
-- after deleting. auto_vacuum only changes with a VACUUM, which cannot run in a transaction;
-- both statements are harmless to repeat if a crash comes before this is recorded.
PRAGMA auto_vacuum = INCREMENTAL;

VACUUM;
