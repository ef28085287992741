-- Concurrency limits: admission, parking, release and resume. Every
-- statement that decides about slots runs after LockConcurrencyLimits has
-- locked the kinds' limit rows (in kind order), which serializes admission
-- per kind across all worker processes.

-- name: ListConcurrencyLimits :many
-- Every limit row (the workers' cache of which kinds are limited).
SELECT kind, max_concurrency FROM concurrency_limits ORDER BY kind;

-- name: SetConcurrencyLimit :one
INSERT INTO concurrency_limits (kind, max_concurrency)
VALUES (sqlc.arg(kind), sqlc.arg(max_concurrency))
ON CONFLICT (kind) DO UPDATE SET max_concurrency = EXCLUDED.max_concurrency, updated_at = now()
RETURNING kind, max_concurrency;

-- name: DeleteStaleConcurrencyExecutions :many
-- Frees the slots of kind whose River job no longer holds them: a slot
-- reserved for a resumed job whose job was cancelled or deleted, or not
-- fetched within reserved_ttl_ms (a job fetched and about to claim its
-- slot keeps it), at once; a slot a worker holds for a job gone or no
-- longer running, once this has found it so twice, the first time at
-- least stale_grace_ms before (stale_since, for stale_job): the worker
-- may have handed it in memory to the next job of its line, a move it
-- writes a moment after River's completer wrote the job's end (migration
-- 00026). A slot found held for a running job again (moved, or its job
-- rescued and fetched anew) loses its mark.
WITH stale AS (
    SELECT e.job_id, e.reserved, e.stale_since, e.stale_job
    FROM concurrency_executions e
    WHERE e.kind = sqlc.arg(kind)
      AND NOT EXISTS (
          SELECT 1 FROM river_job j
          WHERE j.id = e.job_id
            AND (j.state = 'running'
                 OR (e.reserved AND j.state = 'available'
                     AND e.admitted_at > now() - make_interval(secs => sqlc.arg(reserved_ttl_ms)::bigint / 1000.0)))
      )
),
unmarked AS (
    UPDATE concurrency_executions e
    SET stale_since = NULL, stale_job = NULL
    WHERE e.kind = sqlc.arg(kind) AND e.stale_since IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM stale s WHERE s.job_id = e.job_id)
),
marked AS (
    UPDATE concurrency_executions e
    SET stale_since = now(), stale_job = e.job_id
    FROM stale s
    WHERE e.job_id = s.job_id AND NOT s.reserved
      AND s.stale_job IS DISTINCT FROM s.job_id -- not marked, or marked for the job it held before a move
)
DELETE FROM concurrency_executions e
USING stale s
WHERE e.job_id = s.job_id
  AND (s.reserved
       OR (s.stale_job = s.job_id AND s.stale_since <= now() - make_interval(secs => sqlc.arg(stale_grace_ms)::bigint / 1000.0)))
RETURNING e.job_id;

-- name: ResumableKinds :many
-- The kinds concurrency_limit.resume looks after: those with jobs in their
-- line, parked (a loose index scan of (kind, job_id)) or waiting, with
-- reserved slots or starts (grants, which may be orphaned), or with leases
-- (which may have expired).
WITH RECURSIVE kinds AS (
    (SELECT p.kind FROM concurrency_parked_jobs p ORDER BY p.kind LIMIT 1)
    UNION ALL
    SELECT (SELECT p.kind FROM concurrency_parked_jobs p WHERE p.kind > kinds.kind ORDER BY p.kind LIMIT 1)
    FROM kinds
    WHERE kinds.kind IS NOT NULL
)
SELECT kinds.kind::text AS kind FROM kinds WHERE kinds.kind IS NOT NULL
UNION
SELECT DISTINCT w.kind FROM concurrency_waiters w
UNION
SELECT DISTINCT e.kind FROM concurrency_executions e WHERE e.reserved
UNION
SELECT DISTINCT s.kind FROM concurrency_starts s WHERE s.reserved
UNION
SELECT DISTINCT cl.kind FROM concurrency_leases cl WHERE cl.slots > 0
ORDER BY 1;

-- name: ListParkedJobs :many
-- Parked jobs with their River rows and partition keys, oldest first within
-- a kind (within a key, the order they resume in); kind '' lists every
-- kind.
SELECT p.job_id, p.kind, j.queue, j.state::text AS state, p.reason, p.parked_at,
       extract(epoch FROM now() - p.parked_at)::float8 AS waiting_seconds,
       j.attempt, j.max_attempts, j.args, p.key
FROM concurrency_parked_jobs p
JOIN river_job j ON j.id = p.job_id
WHERE sqlc.arg(kind)::text = '' OR p.kind = sqlc.arg(kind)::text
ORDER BY p.kind, p.job_id
LIMIT sqlc.arg(max_rows);

-- name: NotifyRiverInsert :exec
-- Wakes the River producers of queues the way River's own insert
-- notification does (topic <River's schema>.river_insert, payload {"queue":
-- Q}), without River's per-client rate limit: a resumed job must start
-- promptly. River's schema is the connection's sluice.river_schema setting
-- (every sluice pool carries it); else, as River does, current_schema().
SELECT pg_notify(
    COALESCE(NULLIF(current_setting('sluice.river_schema', true), ''), current_schema()) || '.river_insert',
    json_build_object('queue', q)::text)
FROM unnest(sqlc.arg(queues)::text[]) AS q;

-- name: ParkedJobs :many
-- Which of the jobs ids wait for a concurrency slot (sluice jobs list and
-- show): why, since when and parked by which worker, their place in their
-- kind's line (1: resumed next; jobs resume in job id order) of the kind's
-- parked jobs, and the kind's limit (NULL: none) and slots taken.
WITH line AS (
    SELECT p.job_id, p.kind, p.reason, p.parked_at, p.worker_id,
           row_number() OVER (PARTITION BY p.kind ORDER BY p.job_id) AS position,
           count(*) OVER (PARTITION BY p.kind) AS kind_parked
    FROM concurrency_parked_jobs p
    WHERE p.kind IN (SELECT w.kind FROM concurrency_parked_jobs w WHERE w.job_id = ANY(sqlc.arg(ids)::bigint[]))
)
SELECT l.job_id, l.kind, l.reason, l.parked_at,
       extract(epoch FROM now() - l.parked_at)::float8 AS waiting_seconds,
       l.worker_id,
       l.position::bigint AS position,
       l.kind_parked::bigint AS kind_parked,
       o.max_concurrency,
       COALESCE(o.admitted, 0)::bigint AS slots_taken
FROM line l
LEFT JOIN concurrency_overview o ON o.kind = l.kind
WHERE l.job_id = ANY(sqlc.arg(ids)::bigint[])
ORDER BY l.job_id;

-- name: WaitingJobs :many
-- Which of the jobs ids are running to River but do no work yet: they wait
-- in their worker for a concurrency slot (waiting_jobs; sluice jobs
-- list and show). One statement per listing, whatever its length.
SELECT w.job_id::bigint AS job_id, w.reason::text AS reason, w.worker_id::text AS worker_id,
       w.since::timestamptz AS since,
       extract(epoch FROM w.waiting)::float8 AS waiting_seconds
FROM waiting_jobs w
WHERE w.job_id = ANY(sqlc.arg(ids)::bigint[])
ORDER BY w.job_id;
