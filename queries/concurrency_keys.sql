-- Per-key concurrency limits, rate limits and the round across keys
-- (limiter/keys.go, line.go, grant.go). Every statement here runs
-- after LockConcurrencyLimits has locked the kind's limit row, in the same
-- transaction, so they all see and change a kind's keys one transaction at
-- a time across every worker.

-- name: JobPartitionKeys :many
-- The partition keys of jobs: the JSON text of their args' fields
-- (sluice_partition_key), computed from the River rows.
SELECT j.id AS job_id, COALESCE(sluice_partition_key(j.args, sqlc.arg(fields)::text[]), '')::text AS key
FROM river_job j
WHERE j.id = ANY(sqlc.arg(job_ids)::bigint[]);

-- name: RateWindow :one
-- The kind's starts in the window of period_ms ending now (with those
-- reserved), and in how many ms the window next frees a start: when its
-- oldest start (not reserved) leaves it, or a period from now when every
-- start in it is reserved. Deletes the starts that no window counts any
-- more (older than the period and a second).
WITH gone AS (
    DELETE FROM concurrency_starts s
    WHERE s.kind = sqlc.arg(kind) AND NOT s.reserved
      AND s.started_at < statement_timestamp() - make_interval(secs => sqlc.arg(period_ms)::bigint / 1000.0) - interval '1 second'
)
SELECT count(*)::integer AS starts,
       COALESCE(ceil(extract(epoch FROM min(s.started_at) FILTER (WHERE NOT s.reserved)
                                        + make_interval(secs => sqlc.arg(period_ms)::bigint / 1000.0)
                                        - statement_timestamp()) * 1000),
                sqlc.arg(period_ms)::bigint)::bigint AS frees_in_ms
FROM concurrency_starts s
WHERE s.kind = sqlc.arg(kind)
  AND (s.reserved OR s.started_at > statement_timestamp() - make_interval(secs => sqlc.arg(period_ms)::bigint / 1000.0));

-- name: InsertConcurrencyStarts :exec
-- Logs starts of kind now, by the database's clock (job_ids and keys in
-- step; key '': none), reserved for granted jobs that have not started yet
-- or not.
INSERT INTO concurrency_starts (kind, key, job_id, started_at, reserved)
SELECT sqlc.arg(kind), NULLIF(r.key, ''), r.job_id, clock_timestamp(), sqlc.arg(reserved)::boolean
FROM (SELECT unnest(sqlc.arg(job_ids)::bigint[]) AS job_id, unnest(sqlc.arg(keys)::text[]) AS key) AS r;

-- name: ClaimReservedSlots :exec
-- Resumed jobs take their reserved slots as their own.
UPDATE concurrency_executions e
SET reserved = false, worker_id = sqlc.narg(worker_id), admitted_at = clock_timestamp()
WHERE e.job_id = ANY(sqlc.arg(job_ids)::bigint[]) AND e.reserved;

-- name: ClaimReservedStarts :exec
-- Granted jobs take their reserved starts as their own, started now.
UPDATE concurrency_starts s
SET reserved = false, started_at = clock_timestamp()
WHERE s.job_id = ANY(sqlc.arg(job_ids)::bigint[]) AND s.reserved;

-- name: ResumeJobsByID :many
-- Makes the parked jobs ids available again (those still pending and not
-- held by another transaction), and returns them. Their parking records go
-- with them (trigger sluice_unpark).
UPDATE river_job j
SET state = 'available'
WHERE j.id IN (
    SELECT r.id FROM river_job r
    WHERE r.id = ANY(sqlc.arg(ids)::bigint[]) AND r.state = 'pending'
    ORDER BY r.id
    FOR UPDATE SKIP LOCKED
)
RETURNING j.id, j.queue;

-- name: UpsertKeyTurns :exec
-- Records when keys of kind were served by a resume (keys and served_ats in
-- step).
INSERT INTO concurrency_key_turns (kind, key, served_at)
SELECT sqlc.arg(kind), r.key, r.served_at
FROM (SELECT unnest(sqlc.arg(keys)::text[]) AS key, unnest(sqlc.arg(served_ats)::timestamptz[]) AS served_at) AS r
ON CONFLICT (kind, key) DO UPDATE SET served_at = EXCLUDED.served_at;

-- name: DeleteIdleKeyTurns :exec
-- Forgets the turns of kind's keys without waiting jobs: a key that waits
-- again joins the round as a new key.
DELETE FROM concurrency_key_turns t
WHERE t.kind = sqlc.arg(kind)
  AND NOT EXISTS (SELECT 1 FROM concurrency_parked_jobs p WHERE p.kind = t.kind AND p.key = t.key)
  AND NOT EXISTS (SELECT 1 FROM concurrency_waiters w WHERE w.kind = t.kind AND w.key = t.key);

-- name: DeleteReservedStarts :exec
-- Drops the starts reserved for granted jobs of kind, whose rate is gone.
DELETE FROM concurrency_starts WHERE kind = sqlc.arg(kind) AND reserved;

-- name: DeleteStaleStarts :many
-- Frees the starts of kind that no window counts any more: those older
-- than keep_ms, and reservations whose job is gone, finished or parked
-- again, or not fetched within reserved_ttl_ms.
DELETE FROM concurrency_starts s
WHERE s.kind = sqlc.arg(kind)
  AND ((NOT s.reserved AND s.started_at < now() - make_interval(secs => sqlc.arg(keep_ms)::bigint / 1000.0))
       OR (s.reserved AND (s.started_at < now() - make_interval(secs => sqlc.arg(reserved_ttl_ms)::bigint / 1000.0)
                           OR NOT EXISTS (SELECT 1 FROM river_job j
                                          WHERE j.id = s.job_id AND j.state IN ('available', 'running')))))
RETURNING s.job_id;

-- name: RepartitionKind :exec
-- Sets the keys of kind's slots, waiting and parked jobs from their River
-- rows and the kind's partition_fields (NULL: none), after the partition
-- changed, and starts the round afresh: every key with waiting jobs, not
-- served yet.
WITH lim AS (
    SELECT l.partition_fields FROM concurrency_limits l WHERE l.kind = sqlc.arg(kind)
),
slots AS (
    UPDATE concurrency_executions e
    SET key = sluice_partition_key(j.args, (SELECT lim.partition_fields FROM lim))
    FROM river_job j
    WHERE e.kind = sqlc.arg(kind) AND j.id = e.job_id
),
waiting AS (
    UPDATE concurrency_waiters w
    SET key = sluice_partition_key(j.args, (SELECT lim.partition_fields FROM lim))
    FROM river_job j
    WHERE w.kind = sqlc.arg(kind) AND j.id = w.job_id
    RETURNING w.key
),
parked AS (
    UPDATE concurrency_parked_jobs p
    SET key = sluice_partition_key(j.args, (SELECT lim.partition_fields FROM lim))
    FROM river_job j
    WHERE p.kind = sqlc.arg(kind) AND j.id = p.job_id
    RETURNING p.key
),
turns AS (
    DELETE FROM concurrency_key_turns t WHERE t.kind = sqlc.arg(kind)
)
INSERT INTO concurrency_key_turns (kind, key, served_at)
SELECT DISTINCT sqlc.arg(kind), k.key, NULL::timestamptz
FROM (SELECT key FROM waiting UNION SELECT key FROM parked) k
WHERE k.key IS NOT NULL
ON CONFLICT (kind, key) DO UPDATE SET served_at = NULL;

-- name: BackfillPartitionKeys :exec
-- Gives the slots, waiting and parked jobs of kind without a key theirs,
-- when the kind has a partition: rows left from before a partition that
-- plain SQL set (the CLI repartitions at once). The safety net runs it.
WITH lim AS (
    SELECT l.partition_fields FROM concurrency_limits l
    WHERE l.kind = sqlc.arg(kind) AND l.partition_fields IS NOT NULL
),
slots AS (
    UPDATE concurrency_executions e
    SET key = sluice_partition_key(j.args, (SELECT lim.partition_fields FROM lim))
    FROM river_job j
    WHERE e.kind = sqlc.arg(kind) AND e.key IS NULL AND j.id = e.job_id AND EXISTS (SELECT 1 FROM lim)
),
waiting AS (
    UPDATE concurrency_waiters w
    SET key = sluice_partition_key(j.args, (SELECT lim.partition_fields FROM lim))
    FROM river_job j
    WHERE w.kind = sqlc.arg(kind) AND w.key IS NULL AND j.id = w.job_id AND EXISTS (SELECT 1 FROM lim)
    RETURNING w.key
),
parked AS (
    UPDATE concurrency_parked_jobs p
    SET key = sluice_partition_key(j.args, (SELECT lim.partition_fields FROM lim))
    FROM river_job j
    WHERE p.kind = sqlc.arg(kind) AND p.key IS NULL AND j.id = p.job_id AND EXISTS (SELECT 1 FROM lim)
    RETURNING p.key
)
INSERT INTO concurrency_key_turns (kind, key, served_at)
SELECT DISTINCT sqlc.arg(kind), k.key, NULL::timestamptz
FROM (SELECT key FROM waiting UNION SELECT key FROM parked) k
WHERE k.key IS NOT NULL
ON CONFLICT (kind, key) DO NOTHING;
