-- Worker liveness: the reaper that rescues the running jobs and concurrency
-- slots of dead workers (see app/reaper.go for its rules).

-- name: DeadWorkers :many
-- Workers whose heartbeat is older than their own dead_after, that the
-- calling reaper may reap: never itself, only while its own row is alive,
-- and only workers whose dead_after is at most how long the reaper itself
-- has been heartbeating without a gap (streak): after a database outage,
-- during which every heartbeat went stale, no worker reaps another before
-- that one has had the time to heartbeat again.
SELECT w.id, w.incarnation, w.host, w.pid, w.backend_name, w.heartbeat_at, w.dead_after,
       extract(epoch FROM now() - w.heartbeat_at)::float8 AS heartbeat_age_seconds
FROM sluice_workers w
WHERE w.heartbeat_at < now() - w.dead_after
  AND w.dead_after <= sqlc.arg(streak)::interval
  AND w.id <> sqlc.arg(me)::text
  AND EXISTS (
      SELECT 1 FROM sluice_workers me
      WHERE me.id = sqlc.arg(me)::text
        AND me.incarnation = sqlc.arg(incarnation)::text
        AND me.heartbeat_at > now() - me.dead_after)
ORDER BY w.heartbeat_at, w.id;

-- name: LockDeadWorker :one
-- Locks a dead worker's row for its reap, if it is still there and still
-- dead (it may have come back, or another reaper may be reaping it).
SELECT id, incarnation, host, pid, backend_name, heartbeat_at, dead_after
FROM sluice_workers
WHERE id = sqlc.arg(id)
  AND incarnation = sqlc.arg(incarnation)
  AND heartbeat_at < now() - dead_after
FOR UPDATE SKIP LOCKED;

-- name: TryReaperLock :one
-- One reaper at a time: the transaction-level advisory lock sluice.reaper.
SELECT pg_try_advisory_xact_lock(hashtextextended('sluice.reaper', 0)) AS acquired;

-- name: TerminateBackends :one
-- Terminates the backends named app_name (a dead worker's connections;
-- never the caller's), waiting up to wait_ms for each, and returns how many
-- ended. Frees the locks a stopped worker still holds: session advisory
-- locks of maintenance runs, row locks of an open transaction.
SELECT sluice_terminate_backends(sqlc.arg(app_name)::text, sqlc.arg(wait_ms)::bigint)::integer AS terminated;

-- name: WorkerJobKinds :many
-- The kinds of a worker's running jobs and of its concurrency slots and
-- leases, to lock their limit rows before the jobs.
SELECT DISTINCT k.kind::text AS kind FROM (
    SELECT j.kind FROM river_job j
    WHERE j.state = 'running'
      AND j.attempted_by[array_upper(j.attempted_by, 1)] = sqlc.arg(worker_id)::text
    UNION
    SELECT e.kind FROM concurrency_executions e
    WHERE e.worker_id = sqlc.arg(worker_id)::text
    UNION
    SELECT cl.kind FROM concurrency_leases cl
    WHERE cl.worker_id = sqlc.arg(worker_id)::text
) AS k
ORDER BY 1;

-- name: LockWorkerRunningJobs :many
-- The running River jobs whose current attempt is the worker's, locked.
SELECT id, kind, args, attempt, max_attempts, metadata
FROM river_job
WHERE state = 'running'
  AND attempted_by[array_upper(attempted_by, 1)] = sqlc.arg(worker_id)::text
ORDER BY id
FOR UPDATE;

-- name: RescueWorkerJobs :many
-- What River's rescuer does to a stuck job (JobRescueMany), for the jobs of
-- a dead worker: append the attempt error, set the state decided for each
-- job (retryable now, discarded or cancelled: finalized now), bump
-- metadata.river:rescue_count. Only while the job is still running the
-- worker's attempt.
UPDATE river_job
SET errors = array_append(river_job.errors, u.error),
    finalized_at = CASE WHEN u.state = 'retryable' THEN NULL ELSE now() END,
    scheduled_at = CASE WHEN u.state = 'retryable' THEN now() ELSE river_job.scheduled_at END,
    metadata = river_job.metadata || jsonb_build_object(
        'river:rescue_count',
        COALESCE(
            CASE WHEN jsonb_typeof(river_job.metadata -> 'river:rescue_count') = 'number'
                 THEN (river_job.metadata ->> 'river:rescue_count')::int
            END,
            0) + 1),
    state = u.state::river_job_state
FROM (SELECT unnest(sqlc.arg(ids)::bigint[]) AS id,
             unnest(sqlc.arg(errors)::jsonb[]) AS error,
             unnest(sqlc.arg(states)::text[]) AS state) AS u
WHERE river_job.id = u.id
  AND river_job.state = 'running'
  AND river_job.attempted_by[array_upper(river_job.attempted_by, 1)] = sqlc.arg(worker_id)::text
RETURNING river_job.id, river_job.kind, river_job.state::text AS state;

-- name: FailWorkerMaintenanceRuns :many
-- Marks the dead worker's maintenance runs still recorded as running as
-- failed (their River jobs are rescued in the same transaction).
UPDATE maintenance_runs
SET finished_at = now(),
    status = 'failed',
    details = details || jsonb_build_object('error', sqlc.arg(reason)::text)
WHERE worker_id = sqlc.arg(worker_id)::text AND status = 'running'
RETURNING id, kind;

-- name: ResignWorkerLeadership :many
-- Ends the River leadership of a dead worker (River's leader_id is the
-- worker's id, its River client ID), as its client would on a clean stop:
-- the leader row goes and the resignation is announced on River's channel
-- <River's schema>.river_leadership (the connection's sluice.river_schema
-- setting, as NotifyRiverInsert), so that the electors of live workers bid
-- at once rather than wait for the dead leader's term to expire (River's
-- leader TTL, 15s). Until a live worker leads, nothing runs River's
-- leader-only maintenance, among which the scheduler that makes the jobs
-- the reap just made retryable available. Returns the resigned leader ids.
WITH resigned AS (
    DELETE FROM river_leader WHERE leader_id = sqlc.arg(worker_id)::text
    RETURNING leader_id
)
SELECT r.leader_id
FROM resigned r,
     LATERAL (SELECT pg_notify(
         COALESCE(NULLIF(current_setting('sluice.river_schema', true), ''), current_schema()) || '.river_leadership',
         json_build_object('leader_id', r.leader_id, 'action', 'resigned')::text)) AS n;

-- name: DeleteDeadWorker :execrows
-- The last step of a reap.
DELETE FROM sluice_workers WHERE id = sqlc.arg(id) AND incarnation = sqlc.arg(incarnation);

-- name: DeleteWorkerSlots :many
-- Frees the slots held by jobs job_ids (rescued from a dead worker) and any
-- other slot recorded for that worker, and the starts reserved for those
-- jobs (a grant they had not claimed goes whole).
WITH starts AS (
    DELETE FROM concurrency_starts s
    WHERE s.job_id = ANY(sqlc.arg(job_ids)::bigint[]) AND s.reserved
)
DELETE FROM concurrency_executions e
WHERE e.job_id = ANY(sqlc.arg(job_ids)::bigint[]) OR e.worker_id = sqlc.arg(worker_id)::text
RETURNING e.job_id, e.kind;

-- name: ClearWorkerSetting :exec
-- Clears sluice.worker_id for the rest of the transaction: a process taking
-- over the id of its dead predecessor reaps it before its own incarnation is
-- registered, and must not be fenced meanwhile.
SELECT set_config('sluice.worker_id', '', true);
