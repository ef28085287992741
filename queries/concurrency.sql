-- Concurrency limits: admission, parking, release and resume. Every
-- statement that decides about slots runs after LockConcurrencyLimits has
-- locked the kinds' limit rows (in kind order), which serializes admission
-- per kind across all worker processes.

-- name: ListConcurrencyLimits :many
-- Every limit row (the workers' cache of which kinds are limited).
SELECT kind, max_concurrency FROM concurrency_limits ORDER BY kind;

-- name: GetConcurrencyLimit :one
SELECT kind, max_concurrency FROM concurrency_limits WHERE kind = sqlc.arg(kind);

-- name: SetConcurrencyLimit :one
INSERT INTO concurrency_limits (kind, max_concurrency)
VALUES (sqlc.arg(kind), sqlc.arg(max_concurrency))
ON CONFLICT (kind) DO UPDATE SET max_concurrency = EXCLUDED.max_concurrency, updated_at = now()
RETURNING kind, max_concurrency;

-- name: ClearConcurrencyLimit :execrows
DELETE FROM concurrency_limits WHERE kind = sqlc.arg(kind);

-- name: LockConcurrencyLimits :many
-- Locks the limit rows of kinds, in kind order (no deadlocks), and returns
-- them with their counts of slots taken (admitted + reserved) and parked
-- jobs. Kinds without a row are not limited and not returned.
SELECT kind, max_concurrency, admitted, parked FROM concurrency_limits
WHERE kind = ANY(sqlc.arg(kinds)::text[])
ORDER BY kind
FOR UPDATE;

-- name: AddConcurrencyCounts :exec
-- Adjusts the counts of limit rows locked by LockConcurrencyLimits, in the
-- transaction that changed the rows they count.
UPDATE concurrency_limits l
SET admitted = l.admitted + d.admitted,
    parked = l.parked + d.parked
FROM (SELECT unnest(sqlc.arg(kinds)::text[]) AS kind,
             unnest(sqlc.arg(admitted)::integer[]) AS admitted,
             unnest(sqlc.arg(parked)::bigint[]) AS parked) AS d
WHERE l.kind = d.kind;

-- name: RecountConcurrency :exec
-- Sets the counts of kind's limit row from the tables they count.
UPDATE concurrency_limits
SET admitted = (SELECT count(*) FROM concurrency_executions e WHERE e.kind = sqlc.arg(kind)),
    parked = (SELECT count(*) FROM concurrency_parked_jobs p WHERE p.kind = sqlc.arg(kind))
WHERE kind = sqlc.arg(kind);

-- name: InsertConcurrencyExecutions :exec
-- Admits jobs: one slot each. A job admitted again (a retry while a stale row
-- of its earlier attempt remains) keeps its one row.
INSERT INTO concurrency_executions (job_id, kind, worker_id, reserved)
SELECT unnest(sqlc.arg(job_ids)::bigint[]), unnest(sqlc.arg(kinds)::text[]), sqlc.narg(worker_id), sqlc.arg(reserved)::boolean
ON CONFLICT (job_id) DO UPDATE
SET worker_id = EXCLUDED.worker_id, reserved = EXCLUDED.reserved, admitted_at = now();

-- name: DeleteConcurrencyExecutions :many
-- Releases the slots of jobs that ended.
DELETE FROM concurrency_executions
WHERE job_id = ANY(sqlc.arg(job_ids)::bigint[])
RETURNING job_id, kind;

-- name: CompleteParkedRiverJobs :many
-- Finishes parked jobs as River completes a job (River's JobCompleteTx sets
-- state completed and finalized_at, merges metadata, only while running) in
-- one statement for the batch, recording sluice_parked in their metadata.
-- Returns the jobs completed; a job no longer running is left alone.
UPDATE river_job j
SET state = 'completed',
    finalized_at = now(),
    metadata = j.metadata || p.patch
FROM (SELECT unnest(sqlc.arg(ids)::bigint[]) AS id, unnest(sqlc.arg(patches)::jsonb[]) AS patch) AS p
WHERE j.id = p.id AND j.state = 'running'
RETURNING j.id;

-- name: InsertParkedJobs :many
-- Parks jobs behind the others of their kind, in the order given (FIFO).
-- Tags come as JSON arrays. A River job already parked is not parked again
-- and returns no row.
INSERT INTO concurrency_parked_jobs (kind, args, queue, priority, max_attempts, tags, metadata, original_job_id)
SELECT r.kind, r.args, r.queue, r.priority, r.max_attempts,
       ARRAY(SELECT jsonb_array_elements_text(r.tags)), r.metadata, r.original_job_id
FROM (SELECT unnest(sqlc.arg(kinds)::text[]) AS kind,
             unnest(sqlc.arg(args)::jsonb[]) AS args,
             unnest(sqlc.arg(queues)::text[]) AS queue,
             unnest(sqlc.arg(priorities)::smallint[]) AS priority,
             unnest(sqlc.arg(max_attempts)::smallint[]) AS max_attempts,
             unnest(sqlc.arg(tags)::jsonb[]) AS tags,
             unnest(sqlc.arg(metadata)::jsonb[]) AS metadata,
             unnest(sqlc.arg(original_job_ids)::bigint[]) AS original_job_id,
             generate_subscripts(sqlc.arg(original_job_ids)::bigint[], 1) AS ord) AS r
ORDER BY r.ord
ON CONFLICT (original_job_id) DO NOTHING
RETURNING original_job_id, id;

-- name: TakeParkedJobs :many
-- Removes and returns the oldest max_rows parked jobs of kind (FIFO),
-- skipping rows another transaction is taking.
DELETE FROM concurrency_parked_jobs
WHERE id IN (
    SELECT p.id FROM concurrency_parked_jobs p
    WHERE p.kind = sqlc.arg(kind)
    ORDER BY p.id
    LIMIT sqlc.arg(max_rows)
    FOR UPDATE SKIP LOCKED
)
RETURNING *;

-- name: ParkedKinds :many
-- The kinds that have parked jobs (a loose index scan of (kind, id)).
WITH RECURSIVE kinds AS (
    (SELECT p.kind FROM concurrency_parked_jobs p ORDER BY p.kind LIMIT 1)
    UNION ALL
    SELECT (SELECT p.kind FROM concurrency_parked_jobs p WHERE p.kind > kinds.kind ORDER BY p.kind LIMIT 1)
    FROM kinds
    WHERE kinds.kind IS NOT NULL
)
SELECT kinds.kind::text AS kind FROM kinds WHERE kinds.kind IS NOT NULL;

-- name: CountParkedJobs :one
SELECT count(*) FROM concurrency_parked_jobs WHERE kind = sqlc.arg(kind);

-- name: DeleteStaleConcurrencyExecutions :many
-- Frees the slots of kind whose River job no longer holds them: the job is
-- gone or finalized, or it is not running (a reserved slot of a resumed job
-- also stays while the job waits to start).
DELETE FROM concurrency_executions e
WHERE e.kind = sqlc.arg(kind)
  AND NOT EXISTS (
      SELECT 1 FROM river_job j
      WHERE j.id = e.job_id
        AND (j.state = 'running'
             OR (e.reserved AND j.state IN ('available', 'scheduled', 'pending')))
  )
RETURNING e.job_id;

-- name: ListParkedJobs :many
-- Parked jobs, oldest first; kind '' lists every kind.
SELECT * FROM concurrency_parked_jobs
WHERE sqlc.arg(kind)::text = '' OR kind = sqlc.arg(kind)::text
ORDER BY kind, id
LIMIT sqlc.arg(max_rows);

-- name: ConcurrencyOverview :many
-- sluice_concurrency_overview, with the age in seconds (0 when none parked).
SELECT kind, max_concurrency, admitted, parked,
       COALESCE(extract(epoch FROM oldest_parked_age), 0)::float8 AS oldest_parked_seconds
FROM sluice_concurrency_overview
ORDER BY kind;

-- name: NotifyRiverInsert :exec
-- Wakes the River producers of queues the way River's own insert
-- notification does (topic <schema>.river_insert, payload {"queue": Q}),
-- without River's per-client rate limit: a resumed job must start promptly.
SELECT pg_notify(current_schema() || '.river_insert', json_build_object('queue', q)::text)
FROM unnest(sqlc.arg(queues)::text[]) AS q;
