-- name: StartMaintenanceRun :one
-- Records the start of a maintenance run that holds its kind's lock.
INSERT INTO maintenance_runs (kind, job_id, worker_id)
VALUES (sqlc.arg(kind), sqlc.narg(job_id), sqlc.narg(worker_id))
RETURNING *;

-- name: FinishMaintenanceRun :one
-- Records the outcome of a run started by StartMaintenanceRun.
UPDATE maintenance_runs
SET finished_at = now(),
    status = sqlc.arg(status),
    affected = sqlc.arg(affected),
    details = sqlc.arg(details)
WHERE id = sqlc.arg(id)
RETURNING *;

-- name: RecordSkippedMaintenanceRun :one
-- Records a run that did not start because another session held the lock.
INSERT INTO maintenance_runs (kind, job_id, worker_id, finished_at, status, details)
VALUES (sqlc.arg(kind), sqlc.narg(job_id), sqlc.narg(worker_id), now(), 'skipped_locked', sqlc.arg(details))
RETURNING *;

-- name: AbandonMaintenanceRuns :many
-- Marks runs of kind still recorded as running as failed. Only called by a
-- session that holds the kind's lock, so no such run can still be alive: its
-- process died (a crash releases the session lock with the connection).
UPDATE maintenance_runs
SET finished_at = now(),
    status = 'failed',
    details = details || jsonb_build_object('error', 'abandoned: the run''s process ended without recording an outcome')
WHERE kind = sqlc.arg(kind) AND status = 'running'
RETURNING id;

-- name: ListMaintenanceRuns :many
-- Most recent runs of kind, newest first.
SELECT * FROM maintenance_runs
WHERE kind = sqlc.arg(kind)
ORDER BY started_at DESC, id DESC
LIMIT sqlc.arg(max_rows);

-- name: GetMaintenanceRunByJob :one
-- The run recorded by River job job_id (the latest, if it was retried).
SELECT * FROM maintenance_runs
WHERE job_id = sqlc.arg(job_id)
ORDER BY id DESC
LIMIT 1;
