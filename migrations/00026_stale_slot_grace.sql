-- The safety net (concurrency_limit.resume) frees a slot held by a worker
-- whose job no longer runs only when it has found it so twice, the first
-- time at least a grace before (stale_since, for the job that held the
-- slot then: stale_job). A worker hands a finished job's slot to the next
-- job of its line in memory and writes the move a moment later, while
-- River's completer may already have written the job's end: freed on
-- sight, that slot was gone from the books while the next job ran on it,
-- and a decision meanwhile admitted one job too many (seed 652387540). A
-- move gives the row another job_id, which no longer matches stale_job:
-- the mark counts for nothing from then on.

-- +goose Up
ALTER TABLE concurrency_executions
    ADD COLUMN stale_since timestamptz,
    ADD COLUMN stale_job bigint;

COMMENT ON COLUMN concurrency_executions.stale_since IS
    'When the safety net first found the slot held for stale_job, a job no longer running (it frees the slot a grace later, if it is still so)';
COMMENT ON COLUMN concurrency_executions.stale_job IS
    'The job the slot was held for when stale_since was set (a move to another job leaves them unmatched)';

-- +goose Down
ALTER TABLE concurrency_executions
    DROP COLUMN stale_since,
    DROP COLUMN stale_job;
