-- sluice's own periodic jobs keep quiet: each run of one deletes the
-- earlier completed runs of its kind and args, so that a monitor every 5
-- seconds (task_cancellation.monitor) or a safety net every minute
-- (concurrency_limit.resume) leaves one completed job, not one per tick,
-- among the user's jobs. A run that failed stays, as River keeps it.

-- name: DeleteEarlierRuns :execrows
-- Deletes the completed jobs of kind with args, older than job before_id
-- (river_job_kind index).
DELETE FROM river_job
WHERE kind = sqlc.arg(kind)::text AND state = 'completed' AND id < sqlc.arg(before_id)::bigint
  AND args = sqlc.arg(args)::jsonb;
