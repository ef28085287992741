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

-- name: ClearConcurrencyLimit :execrows
-- Removes kind's limit and the leases counted against it (workers find
-- their leases gone and stop using them; slot rows of running jobs stay
-- until their jobs end, and count again if a limit returns meanwhile). Run
-- after LockConcurrencyLimits in the same transaction, so that a lease
-- granted meanwhile is seen and deleted too.
WITH leases AS (
    DELETE FROM concurrency_leases cl WHERE cl.kind = sqlc.arg(kind)
)
DELETE FROM concurrency_limits l WHERE l.kind = sqlc.arg(kind);

-- name: LockConcurrencyLimits :many
-- Locks the limit rows of kinds, in kind order (no deadlocks), and returns
-- them with their count of slots taken (admitted + reserved), whether jobs
-- wait for the kind (has_parked), and the kind's per-key and rate limits.
-- Kinds without a row are not limited and not returned.
SELECT kind, max_concurrency, admitted, has_parked,
       partition_fields, key_max, rate_max,
       COALESCE((extract(epoch FROM rate_period) * 1000)::bigint, 0)::bigint AS rate_period_ms,
       rate_per_key
FROM concurrency_limits
WHERE kind = ANY(sqlc.arg(kinds)::text[])
ORDER BY kind
FOR UPDATE;

-- name: LockLimitRows :exec
-- LockConcurrencyLimits without reading the rows: a statement of its own
-- (the next statements of the transaction read snapshots taken once the
-- rows are locked) that travels with them (db.Pipeline).
SELECT 1
FROM concurrency_limits
WHERE kind = ANY(sqlc.arg(kinds)::text[])
ORDER BY kind
FOR UPDATE;

-- name: AddConcurrencyCounts :exec
-- Adjusts the counts of limit rows locked by LockConcurrencyLimits, in the
-- transaction that changed the rows they count, and sets their parked flags.
UPDATE concurrency_limits l
SET admitted = l.admitted + d.admitted,
    has_parked = d.has_parked
FROM (SELECT unnest(sqlc.arg(kinds)::text[]) AS kind,
             unnest(sqlc.arg(admitted)::integer[]) AS admitted,
             unnest(sqlc.arg(has_parked)::boolean[]) AS has_parked) AS d
WHERE l.kind = d.kind;

-- name: RecountConcurrency :exec
-- Sets the count and flag of kind's limit row from the tables they describe
-- (has_parked: jobs of the line wait for the kind, not only for their
-- keys).
UPDATE concurrency_limits
SET admitted = (SELECT count(*) FROM concurrency_executions e WHERE e.kind = sqlc.arg(kind))
        + (SELECT COALESCE(sum(cl.slots), 0) FROM concurrency_leases cl WHERE cl.kind = sqlc.arg(kind)),
    has_parked = EXISTS (SELECT 1 FROM concurrency_parked_jobs p
                         WHERE p.kind = sqlc.arg(kind) AND p.reason NOT IN ('key_limit', 'key_fifo', 'key_rate'))
              OR EXISTS (SELECT 1 FROM concurrency_waiters w
                         WHERE w.kind = sqlc.arg(kind) AND w.reason NOT IN ('key_limit', 'key_fifo', 'key_rate'))
WHERE kind = sqlc.arg(kind);

-- name: InsertConcurrencyExecutions :many
-- Admits jobs: one slot each, with its partition key (keys in step with
-- job_ids; '' or missing: none). A job admitted again (a retry while a
-- stale row of its earlier attempt remains) keeps its one row. Returns the
-- kinds of the rows it inserted (not those it updated), so that the caller
-- raises the counts by exactly the rows added (xmax is 0 on a row this
-- statement inserted).
INSERT INTO concurrency_executions (job_id, kind, worker_id, reserved, key, admitted_at)
SELECT r.job_id, r.kind, sqlc.narg(worker_id), sqlc.arg(reserved)::boolean, NULLIF(r.key, ''), clock_timestamp()
FROM (SELECT unnest(sqlc.arg(job_ids)::bigint[]) AS job_id, unnest(sqlc.arg(kinds)::text[]) AS kind,
             unnest(sqlc.arg(keys)::text[]) AS key) AS r
ON CONFLICT (job_id) DO UPDATE
SET worker_id = EXCLUDED.worker_id, reserved = EXCLUDED.reserved, admitted_at = clock_timestamp(), key = EXCLUDED.key
RETURNING kind, (xmax::text = '0')::boolean AS inserted;

-- name: MarkJobsParking :many
-- Marks running jobs for parking in place (metadata key sluice_park): River's
-- completion of each then becomes running -> pending (trigger
-- sluice_park_in_place), with the attempt undone. Returns the jobs marked; a
-- job no longer running its attempt attempts[i] (rescued meanwhile, or
-- running a later attempt) is left alone.
UPDATE river_job j
SET metadata = j.metadata || '{"sluice_park": true}'::jsonb
FROM (SELECT unnest(sqlc.arg(ids)::bigint[]) AS id, unnest(sqlc.arg(attempts)::integer[]) AS attempt) AS m
WHERE j.id = m.id AND j.attempt = m.attempt AND j.state = 'running'
RETURNING j.id;

-- name: InsertParkedJobs :exec
-- Records why and when jobs parked, with their partition keys (job_ids,
-- kinds, reasons and keys in step; key '' or missing: none); a job that was
-- resumed ahead of a free slot and parks again is marked (ahead): it is
-- resumed next with a slot. A job already parked keeps its first record.
INSERT INTO concurrency_parked_jobs (job_id, kind, reason, worker_id, key, ahead)
SELECT r.job_id, r.kind, r.reason, sqlc.narg(worker_id), NULLIF(r.key, ''),
       COALESCE((SELECT w.ahead FROM concurrency_waiters w WHERE w.job_id = r.job_id), false)
FROM (SELECT unnest(sqlc.arg(job_ids)::bigint[]) AS job_id, unnest(sqlc.arg(kinds)::text[]) AS kind,
             unnest(sqlc.arg(reasons)::text[]) AS reason, unnest(sqlc.arg(keys)::text[]) AS key) AS r
ON CONFLICT (job_id) DO NOTHING;

-- name: ResumeParkedJobs :many
-- Moves the oldest max_rows parked jobs of kind from pending to available,
-- in job-id order, skipping rows another transaction holds, and returns
-- them: a kind whose limits are gone lets every job it held go (a job
-- still completing its parking is resumed by the recheck that follows it).
-- Their parking records go with them (trigger sluice_unpark).
UPDATE river_job j
SET state = 'available'
WHERE j.id IN (
    SELECT r.id FROM river_job r
    JOIN concurrency_parked_jobs p ON p.job_id = r.id
    WHERE p.kind = sqlc.arg(kind) AND r.state = 'pending'
    ORDER BY r.id
    LIMIT sqlc.arg(max_rows)
    FOR UPDATE OF r SKIP LOCKED
)
RETURNING j.id, j.queue;

-- name: DeleteStaleConcurrencyExecutions :many
-- Frees the slots of kind whose River job no longer holds them: the job is
-- gone or no longer running, or — a slot reserved for a resumed job — the
-- job was cancelled or deleted, or not fetched within reserved_ttl_ms (a
-- job fetched and about to claim its slot keeps it).
DELETE FROM concurrency_executions e
WHERE e.kind = sqlc.arg(kind)
  AND NOT EXISTS (
      SELECT 1 FROM river_job j
      WHERE j.id = e.job_id
        AND (j.state = 'running'
             OR (e.reserved AND j.state = 'available'
                 AND e.admitted_at > now() - make_interval(secs => sqlc.arg(reserved_ttl_ms)::bigint / 1000.0)))
  )
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

-- name: ConcurrencyOverview :many
-- concurrency_overview, with the age in seconds (0 when none parked).
SELECT kind, max_concurrency, admitted, parked,
       COALESCE(extract(epoch FROM oldest_parked_age), 0)::float8 AS oldest_parked_seconds
FROM concurrency_overview
ORDER BY kind;

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

-- name: ReleaseJobs :many
-- The release fast path: frees the slots of jobs that ended (job_ids: the
-- caller's slots only, worker_id) and of jobs that gave up waiting
-- (forget_ids: the caller's, or a grant not claimed yet; those also leave
-- the waiters, with any start reserved for them), lowers the kinds'
-- admitted counts (limit rows locked in kind order first), and returns the
-- state of the kinds released with their limits, as LockConcurrencyLimits
-- reads them (freed_keys: the keys whose slots freed, '' without a
-- partition, in byte order, as Go sorts them; keyed: a per-key or rate limit; any_waiting: jobs of the
-- kind's line wait, for the kind or for their keys; has_turns: its keys
-- have places in the round, which a grant round forgets once nothing
-- waits), so the caller can grant the free slots in the same transaction
-- without reading the rows again. A job rescued and running
-- on another worker keeps the slot of its new attempt when the old
-- attempt's worker releases late.
WITH lk AS (
    SELECT l.kind FROM concurrency_limits l
    WHERE l.kind = ANY(sqlc.arg(kinds)::text[])
    ORDER BY l.kind
    FOR UPDATE
),
freed AS (
    -- The uncorrelated count makes the DELETE wait until every limit row
    -- is locked (an InitPlan runs first); it still reads the snapshot the
    -- statement began with, so a caller that may race a grant to the
    -- jobs it forgets locks the rows in an earlier statement of its
    -- transaction (the release batch, limiter/release.go).
    DELETE FROM concurrency_executions e
    WHERE ((e.job_id = ANY(sqlc.arg(job_ids)::bigint[]) AND e.worker_id = sqlc.arg(worker_id)::text)
           OR (e.job_id = ANY(sqlc.arg(forget_ids)::bigint[])
               AND (e.worker_id = sqlc.arg(worker_id)::text OR e.worker_id IS NULL)))
      AND (SELECT count(*) FROM lk) >= 0
    RETURNING e.kind, e.key
),
unwaited AS (
    DELETE FROM concurrency_waiters w
    WHERE w.job_id = ANY(sqlc.arg(forget_ids)::bigint[]) AND (SELECT count(*) FROM lk) >= 0
),
unstarted AS (
    DELETE FROM concurrency_starts s
    WHERE s.job_id = ANY(sqlc.arg(forget_ids)::bigint[]) AND s.reserved AND (SELECT count(*) FROM lk) >= 0
),
per_kind AS (
    SELECT lk.kind, (SELECT count(*) FROM freed f WHERE f.kind = lk.kind)::integer AS n,
           (SELECT COALESCE(array_agg(DISTINCT COALESCE(f.key, '') COLLATE "C" ORDER BY COALESCE(f.key, '') COLLATE "C"), '{}')
            FROM freed f WHERE f.kind = lk.kind) AS keys
    FROM lk
)
UPDATE concurrency_limits l
SET admitted = GREATEST(l.admitted - p.n, 0)
FROM per_kind p
WHERE l.kind = p.kind
RETURNING l.kind, l.max_concurrency, l.admitted, l.has_parked, p.keys::text[] AS freed_keys,
          l.partition_fields, l.key_max, l.rate_max,
          COALESCE((extract(epoch FROM l.rate_period) * 1000)::bigint, 0)::bigint AS rate_period_ms,
          l.rate_per_key,
          (l.partition_fields IS NOT NULL OR l.rate_max IS NOT NULL)::boolean AS keyed,
          (EXISTS (SELECT 1 FROM concurrency_parked_jobs p WHERE p.kind = l.kind)
           OR EXISTS (SELECT 1 FROM concurrency_waiters w WHERE w.kind = l.kind))::boolean AS any_waiting,
          EXISTS (SELECT 1 FROM concurrency_key_turns t WHERE t.kind = l.kind)::boolean AS has_turns;

-- name: CountSlotsOf :one
-- How many slot rows jobs job_ids hold (a Limiter retrying a failed release
-- goes on until its jobs' slots are gone).
SELECT count(*) FROM concurrency_executions WHERE job_id = ANY(sqlc.arg(job_ids)::bigint[]);

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
