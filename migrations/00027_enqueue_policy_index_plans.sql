-- The enqueue policy's trigger plans its lookups (the key's counts row,
-- the key's waiting jobs by unique_key) once per session, from the
-- tables' statistics at the time. With river_job or enqueue_policy_counts
-- analyzed while empty or nearly so (a new install that autovacuum has
-- seen, a quiet system whose finished jobs River's cleaner removed), the
-- plan was a sequential scan of the table for every row inserted, and an
-- InsertMany of 10,000 jobs under a policy read the rows the same
-- statement had just inserted, once per row: 36–53 s where 2 s is usual.
-- The trigger's statements all have an index that answers them, so the
-- function forbids sequential scans while it runs (the setting is the
-- function's own: the caller's is back on return).

-- +goose Up
ALTER FUNCTION sluice_enqueue_policy() SET enable_seqscan = off;

-- +goose Down
ALTER FUNCTION sluice_enqueue_policy() RESET enable_seqscan;
