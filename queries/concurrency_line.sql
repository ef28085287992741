-- The line of a limited kind (limiter/internal/ledger): every job that
-- waits for the kind's limits — parked (concurrency_parked_jobs), waiting
-- in a worker or resumed ahead of a free slot (concurrency_waiters) — in
-- job-id order within a key, round-robin across keys (their turns in
-- concurrency_key_lines). Every statement that decides runs in a ledger
-- transaction that holds the kind's lock (LedgerLockKinds).

-- name: NotifyGrants :exec
-- Tells the workers whose waiting jobs got grants that they run: one
-- notification per worker (payloads, built by the grant round: a
-- ledger.GrantNote in JSON, the worker and its jobs; one naming no job has
-- the worker look for every job of its own that got one). Their listeners,
-- LISTENing on sluice_grants, wake those jobs at once. Postgres delivers
-- them when the grant's transaction commits, and sends each distinct
-- payload once.
SELECT pg_notify('sluice_grants', p) FROM unnest(sqlc.arg(payloads)::text[]) AS p;

-- name: ListenGrants :exec
-- Subscribes this session to the notifications of grants (NotifyGrants).
LISTEN sluice_grants;

-- name: RevokeGrants :many
-- Takes back the n newest unclaimed grants of kind (its limit was lowered,
-- or became a circuit breaker), with the starts reserved for them: their
-- jobs wait in the line again (a job resumed ahead keeps its place as a
-- waiter without a worker). Returns the jobs.
WITH revoked AS (
    DELETE FROM concurrency_executions e
    WHERE e.job_id IN (
        SELECT x.job_id FROM concurrency_executions x
        WHERE x.kind = sqlc.arg(kind) AND x.reserved
        ORDER BY x.job_id DESC
        LIMIT sqlc.arg(n)
    )
    RETURNING e.job_id, e.key
),
unstarted AS (
    DELETE FROM concurrency_starts s
    WHERE s.reserved AND s.job_id IN (SELECT r.job_id FROM revoked r)
),
back AS (
    INSERT INTO concurrency_waiters (job_id, kind, key, worker_id, reason)
    SELECT r.job_id, sqlc.arg(kind), r.key, NULL, 'limit' FROM revoked r
    WHERE NOT EXISTS (SELECT 1 FROM concurrency_parked_jobs p WHERE p.job_id = r.job_id) -- granted as its parking completed: it stays parked
    ON CONFLICT (job_id) DO NOTHING
)
SELECT r.job_id FROM revoked r;

-- name: DeleteStaleFetches :exec
-- Drops the marks of jobs of kind fetched and not decided that no decision
-- reads any more (older than a minute: their worker stopped or decided
-- them without the ledger).
DELETE FROM concurrency_fetches WHERE kind = sqlc.arg(kind) AND fetched_at < now() - interval '1 minute';

-- name: DeleteStaleWaiters :many
-- Drops waiter rows of kind whose job no longer waits where the row says:
-- not running (waiting in a worker), not available (resumed ahead), or gone;
-- and rows of a worker that is not a live sluice worker (a process without
-- a liveness row, or stopped without cleaning up).
DELETE FROM concurrency_waiters w
WHERE w.kind = sqlc.arg(kind)
  AND (NOT EXISTS (SELECT 1 FROM river_job j
                   WHERE j.id = w.job_id
                     AND (j.state = 'running' OR (w.worker_id IS NULL AND j.state = 'available')))
       OR (w.worker_id IS NOT NULL AND w.since < now() - interval '1 minute'
           AND NOT EXISTS (SELECT 1 FROM sluice_workers sw WHERE sw.id = w.worker_id)))
RETURNING w.job_id;

-- name: SetLeaseWaiting :exec
-- Publishes the jobs waiting in worker_id for a leased slot of kind (for
-- SQL: waiting_jobs; the other workers let them go first), and deletes
-- the leased fetch marks of unmark_ids (what waits of them is published
-- now). A worker that holds no slot of the kind yet gets a lease row of
-- none: its jobs wait before it leased any.
WITH unmarked AS (
    DELETE FROM concurrency_fetches f
    WHERE f.job_id = ANY(sqlc.arg(unmark_ids)::bigint[]) AND f.leased AND f.worker_id = sqlc.arg(worker_id)::text
),
updated AS (
    UPDATE concurrency_leases SET waiting = sqlc.arg(job_ids)::bigint[]
    WHERE kind = sqlc.arg(kind) AND worker_id = sqlc.arg(worker_id)::text
    RETURNING 1
)
INSERT INTO concurrency_leases (kind, worker_id, slots, waiting)
SELECT sqlc.arg(kind), sqlc.arg(worker_id)::text, 0, sqlc.arg(job_ids)::bigint[]
WHERE cardinality(sqlc.arg(job_ids)::bigint[]) > 0 AND NOT EXISTS (SELECT 1 FROM updated)
ON CONFLICT (kind, worker_id) DO UPDATE SET waiting = EXCLUDED.waiting;

-- name: ParkWorkerWaiters :many
-- Parks the jobs a dead worker had waiting for a slot (its waiter rows, and
-- the jobs its lease keeper published as waiting), in the reap's
-- transaction before they are rescued: each is marked for parking, so that
-- the rescue's update turns it back into a pending job with its attempt
-- undone (sluice_park_in_place: it never ran), and recorded as parked with
-- the reason it waited for, and its key by the kind's partition now (a
-- job published as waiting for a leased slot, or for its decision, may be
-- of a kind partitioned since: its line is its key's). Returns the jobs
-- and kinds.
WITH waiting AS (
    SELECT w.job_id, w.kind, w.key, w.reason FROM concurrency_waiters w
    WHERE w.worker_id = sqlc.arg(worker_id)::text
    UNION
    SELECT u.job_id, cl.kind, sluice_partition_key(j.args, l.partition_fields), 'limit'::text
    FROM concurrency_leases cl CROSS JOIN LATERAL unnest(cl.waiting) AS u(job_id)
    JOIN river_job j ON j.id = u.job_id
    LEFT JOIN concurrency_limits l ON l.kind = cl.kind
    WHERE cl.worker_id = sqlc.arg(worker_id)::text
),
marked AS (
    UPDATE river_job j
    SET metadata = j.metadata || '{"sluice_park": true}'::jsonb
    FROM waiting w
    WHERE j.id = w.job_id AND j.state = 'running'
      AND j.attempted_by[array_upper(j.attempted_by, 1)] = sqlc.arg(worker_id)::text
      AND NOT EXISTS (SELECT 1 FROM concurrency_executions e WHERE e.job_id = j.id AND NOT e.reserved)
    RETURNING j.id
),
recorded AS (
    INSERT INTO concurrency_parked_jobs (job_id, kind, reason, worker_id, key)
    SELECT w.job_id, w.kind, w.reason, sqlc.arg(worker_id)::text, w.key
    FROM waiting w WHERE w.job_id IN (SELECT m.id FROM marked m)
    ON CONFLICT (job_id) DO NOTHING
),
dropped AS (
    DELETE FROM concurrency_waiters cw WHERE cw.worker_id = sqlc.arg(worker_id)::text
)
SELECT w.job_id, w.kind FROM waiting w WHERE w.job_id IN (SELECT m.id FROM marked m);
