-- Per-key concurrency limits, rate limits and the round across keys: the
-- keyed admission and resume of limiter/keyed.go. Every statement here runs
-- after LockConcurrencyLimits has locked the kind's limit row, in the same
-- transaction, so they all see and change a kind's keys one transaction at
-- a time across every worker.

-- name: JobPartitionKeys :many
-- The partition keys of jobs: the JSON text of their args' fields
-- (sluice_partition_key), computed from the River rows.
SELECT j.id AS job_id, COALESCE(sluice_partition_key(j.args, sqlc.arg(fields)::text[]), '')::text AS key
FROM river_job j
WHERE j.id = ANY(sqlc.arg(job_ids)::bigint[]);

-- name: KeyStates :many
-- Per key of kind: its slots taken (admitted and reserved), whether jobs of
-- the key wait (they go first: FIFO within a key), its starts since since
-- (plus the starts reserved for resumed jobs not fetched yet), and the
-- oldest of those not reserved in Unix microseconds (0: none).
SELECT k.key::text AS key,
       (SELECT count(*) FROM concurrency_executions e
        WHERE e.kind = sqlc.arg(kind) AND e.key = k.key)::integer AS slots,
       EXISTS (SELECT 1 FROM concurrency_parked_jobs p
               WHERE p.kind = sqlc.arg(kind) AND p.key = k.key) AS waiting,
       w.starts::integer AS starts,
       w.oldest_us::bigint AS oldest_us
FROM unnest(sqlc.arg(keys)::text[]) AS k(key)
CROSS JOIN LATERAL (
    SELECT count(*) AS starts,
           COALESCE((extract(epoch FROM min(s.started_at) FILTER (WHERE NOT s.reserved)) * 1000000)::bigint, 0) AS oldest_us
    FROM concurrency_starts s
    WHERE s.kind = sqlc.arg(kind) AND s.key = k.key
      AND (s.reserved OR s.started_at > sqlc.arg(since)::timestamptz)
) w;

-- name: RateWindow :one
-- The kind's starts since since (plus those reserved), and the oldest of
-- them not reserved, in Unix microseconds (0: none; the window next frees
-- a start at oldest + rate_period). Deletes the starts older than cutoff, which no window
-- counts any more.
WITH gone AS (
    DELETE FROM concurrency_starts s
    WHERE s.kind = sqlc.arg(kind) AND NOT s.reserved AND s.started_at < sqlc.arg(cutoff)::timestamptz
)
SELECT count(*)::integer AS starts,
       COALESCE((extract(epoch FROM min(s.started_at) FILTER (WHERE NOT s.reserved)) * 1000000)::bigint, 0)::bigint AS oldest_us
FROM concurrency_starts s
WHERE s.kind = sqlc.arg(kind) AND (s.reserved OR s.started_at > sqlc.arg(since)::timestamptz);

-- name: InsertConcurrencyStarts :exec
-- Logs starts of kind (job_ids, keys and started_ats in step; key '':
-- none), reserved for resumed jobs or not.
INSERT INTO concurrency_starts (kind, key, job_id, started_at, reserved)
SELECT sqlc.arg(kind), NULLIF(r.key, ''), r.job_id, r.started_at, sqlc.arg(reserved)::boolean
FROM (SELECT unnest(sqlc.arg(job_ids)::bigint[]) AS job_id, unnest(sqlc.arg(keys)::text[]) AS key,
             unnest(sqlc.arg(started_ats)::timestamptz[]) AS started_at) AS r;

-- name: KeyedReservations :many
-- Which of jobs hold a reservation made when they were resumed: a slot, a
-- start, or both.
SELECT r.job_id::bigint AS job_id, bool_or(r.slot)::boolean AS slot, bool_or(r.start)::boolean AS start
FROM (
    SELECT e.job_id, true AS slot, false AS start
    FROM concurrency_executions e
    WHERE e.job_id = ANY(sqlc.arg(job_ids)::bigint[]) AND e.reserved
    UNION ALL
    SELECT s.job_id, false, true
    FROM concurrency_starts s
    WHERE s.job_id = ANY(sqlc.arg(job_ids)::bigint[]) AND s.reserved
) r
GROUP BY r.job_id;

-- name: ClaimReservedSlots :exec
-- Resumed jobs take their reserved slots as their own.
UPDATE concurrency_executions e
SET reserved = false, worker_id = sqlc.narg(worker_id), admitted_at = now()
WHERE e.job_id = ANY(sqlc.arg(job_ids)::bigint[]) AND e.reserved;

-- name: ClaimReservedStarts :exec
-- Resumed jobs take their reserved starts as their own, at their
-- attempted_at (started_ats in step with job_ids).
UPDATE concurrency_starts s
SET reserved = false, started_at = r.started_at
FROM (SELECT unnest(sqlc.arg(job_ids)::bigint[]) AS job_id,
             unnest(sqlc.arg(started_ats)::timestamptz[]) AS started_at) AS r
WHERE s.job_id = r.job_id AND s.reserved;

-- name: ParkedKeyCandidates :many
-- The jobs a resume of kind may make available, per key with waiting jobs
-- (a loose index scan of (kind, key, job_id)): each key's oldest per_key
-- waiting jobs up to the first still completing its parking, numbered (rn)
-- in job-id order, with when the key was last served (NULL: not since it
-- started waiting). The resume serves them in
-- rounds: rn first, then the keys least recently served first.
WITH RECURSIVE keys AS (
    (SELECT p.key FROM concurrency_parked_jobs p
     WHERE p.kind = sqlc.arg(kind) AND p.key IS NOT NULL
     ORDER BY p.key LIMIT 1)
    UNION ALL
    SELECT (SELECT p.key FROM concurrency_parked_jobs p
            WHERE p.kind = sqlc.arg(kind) AND p.key IS NOT NULL AND p.key > keys.key
            ORDER BY p.key LIMIT 1)
    FROM keys
    WHERE keys.key IS NOT NULL
)
SELECT k.key::text AS key, c.job_id, c.rn::integer AS rn, t.served_at
FROM keys k
LEFT JOIN concurrency_key_turns t ON t.kind = sqlc.arg(kind) AND t.key = k.key
CROSS JOIN LATERAL (
    SELECT x.job_id, x.rn
    FROM (
        SELECT y.job_id, y.pending,
               row_number() OVER (ORDER BY y.job_id) AS rn,
               bool_and(y.pending OR y.stale) OVER (ORDER BY y.job_id) AS ready
        FROM (
            SELECT p.job_id, (j.state = 'pending') AS pending, p.parked_at < now() - interval '5 seconds' AS stale
            FROM concurrency_parked_jobs p
            JOIN river_job j ON j.id = p.job_id
            WHERE p.kind = sqlc.arg(kind) AND p.key = k.key
            ORDER BY p.job_id
            LIMIT sqlc.arg(per_key)
        ) y
    ) x
    -- A job still completing its parking (running) holds up the younger
    -- jobs of its key: they never start before it (unless its completion
    -- is more than 5 s late: its worker is gone, and it waits for a
    -- rescue).
    WHERE x.ready AND x.pending
) c
WHERE k.key IS NOT NULL
ORDER BY c.rn, t.served_at NULLS FIRST, k.key;

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
  AND NOT EXISTS (SELECT 1 FROM concurrency_parked_jobs p WHERE p.kind = t.kind AND p.key = t.key);

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
-- Sets the keys of kind's slots and parked jobs from their River rows and
-- the kind's partition_fields (NULL: none), after the partition changed,
-- and forgets the round.
WITH lim AS (
    SELECT l.partition_fields FROM concurrency_limits l WHERE l.kind = sqlc.arg(kind)
),
slots AS (
    UPDATE concurrency_executions e
    SET key = sluice_partition_key(j.args, (SELECT lim.partition_fields FROM lim))
    FROM river_job j
    WHERE e.kind = sqlc.arg(kind) AND j.id = e.job_id
),
turns AS (
    DELETE FROM concurrency_key_turns t WHERE t.kind = sqlc.arg(kind)
)
UPDATE concurrency_parked_jobs p
SET key = sluice_partition_key(j.args, (SELECT lim.partition_fields FROM lim))
FROM river_job j
WHERE p.kind = sqlc.arg(kind) AND j.id = p.job_id;

-- name: BackfillPartitionKeys :exec
-- Gives the slots and parked jobs of kind without a key theirs, when the
-- kind has a partition: rows left from before a partition that plain SQL
-- set (the CLI repartitions at once). The safety net runs it.
WITH lim AS (
    SELECT l.partition_fields FROM concurrency_limits l
    WHERE l.kind = sqlc.arg(kind) AND l.partition_fields IS NOT NULL
),
slots AS (
    UPDATE concurrency_executions e
    SET key = sluice_partition_key(j.args, (SELECT lim.partition_fields FROM lim))
    FROM river_job j
    WHERE e.kind = sqlc.arg(kind) AND e.key IS NULL AND j.id = e.job_id AND EXISTS (SELECT 1 FROM lim)
)
UPDATE concurrency_parked_jobs p
SET key = sluice_partition_key(j.args, (SELECT lim.partition_fields FROM lim))
FROM river_job j
WHERE p.kind = sqlc.arg(kind) AND p.key IS NULL AND j.id = p.job_id AND EXISTS (SELECT 1 FROM lim);

-- name: TransferSlots :many
-- Hands the slots of ended jobs (from_ids) of this worker to jobs of the
-- same key waiting in it (to_ids, in step), without freeing them: a slot
-- passes only while it is still the ended job's, the waiter holds none,
-- nothing of the kind or the key is parked (they go first), the kind has
-- no rate (every start is counted), and neither the key's nor the kind's
-- slots exceed their limits (lowered meanwhile: the slot is freed
-- instead). Returns the ended jobs whose slots passed.
UPDATE concurrency_executions e
SET job_id = t.to_id, admitted_at = now()
FROM (SELECT unnest(sqlc.arg(from_ids)::bigint[]) AS from_id, unnest(sqlc.arg(to_ids)::bigint[]) AS to_id) AS t,
     concurrency_limits l
WHERE e.job_id = t.from_id AND e.worker_id = sqlc.arg(worker_id)::text AND NOT e.reserved
  AND l.kind = e.kind AND NOT l.has_parked AND l.rate_max IS NULL AND l.key_max IS NOT NULL
  AND (l.max_concurrency = 0 OR l.admitted <= l.max_concurrency)
  AND (SELECT count(*) FROM concurrency_executions x WHERE x.kind = e.kind AND x.key = e.key) <= l.key_max
  AND NOT EXISTS (SELECT 1 FROM concurrency_executions x WHERE x.job_id = t.to_id)
  AND NOT EXISTS (SELECT 1 FROM concurrency_parked_jobs p WHERE p.kind = e.kind AND p.key = e.key)
RETURNING t.from_id::bigint AS from_id;
