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

-- name: RecentMaintenanceRuns :many
-- The latest runs of every kind, newest first (by id: the primary key's
-- index, in the order the runs started).
SELECT id, kind, job_id, worker_id, started_at, finished_at, status, affected, details
FROM maintenance_runs
ORDER BY id DESC
LIMIT sqlc.arg(max_rows);

-- name: MaintenanceKindSummary :many
-- Per kind that ever ran: its latest run and how long ago it last succeeded
-- (-1: never). The kinds are found by skipping through
-- maintenance_runs_kind_started_at_idx (one index probe per kind), never by
-- scanning the journal.
WITH RECURSIVE kinds AS (
    (SELECT m.kind FROM maintenance_runs m ORDER BY m.kind LIMIT 1)
    UNION ALL
    SELECT (SELECT m.kind FROM maintenance_runs m WHERE m.kind > k.kind ORDER BY m.kind LIMIT 1)
    FROM kinds k
    WHERE k.kind IS NOT NULL
)
SELECT k.kind::text AS kind, last.id AS last_id, last.job_id AS last_job_id, last.status AS last_status,
       last.started_at AS last_started_at, last.finished_at AS last_finished_at,
       last.affected AS last_affected,
       COALESCE(extract(epoch FROM now() - (
           SELECT s.started_at FROM maintenance_runs s
           WHERE s.kind = k.kind AND s.status = 'succeeded'
           ORDER BY s.started_at DESC
           LIMIT 1)), -1)::float8 AS last_succeeded_seconds_ago
FROM kinds k
CROSS JOIN LATERAL (
    SELECT r.id, r.job_id, r.status, r.started_at, r.finished_at, r.affected
    FROM maintenance_runs r
    WHERE r.kind = k.kind
    ORDER BY r.started_at DESC
    LIMIT 1
) AS last
WHERE k.kind IS NOT NULL
ORDER BY k.kind;
