-- The line of a limited kind (limiter/line.go, grant.go, waiters.go): every
-- job that waits for the kind's limits — parked (concurrency_parked_jobs),
-- waiting in a worker or resumed ahead of a free slot
-- (concurrency_waiters) — in job-id order within a key, round-robin across
-- keys (concurrency_key_turns). Every statement that decides runs after
-- LockConcurrencyLimits has locked the kind's limit row, in the same
-- transaction; ClaimGrants alone does not: it only takes what a grant
-- already counted.

-- name: PipelineSettings :exec
-- For the rest of the transaction (db.Pipeline's first statement), reads
-- every table by an index where one serves. The line tables swing from
-- empty to thousands of rows and back: a plan made while one looked small
-- scans it, once per key of a nested loop (a generic plan, cached for the
-- connection's life, scanned concurrency_parked_jobs whole at 80 ms a
-- statement; custom plans still scanned concurrency_executions 400 times a
-- statement under P10's churn). With sequential scans off, the statements'
-- cached generic plans are safe to keep, which also spares planning each
-- one (0.1 to 0.6 ms a statement under the kind's lock, P10). A plan
-- that has to scan a table anyway costs more than jit_above_cost with
-- sequential scans off: JIT is off too (it compiled for 190 ms a
-- statement that runs in a millisecond).
SELECT set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true);

-- name: LineRecords :many
-- What the limiter holds for jobs job_ids (kinds and attempted_ats in
-- step: each job's kind, and when it was fetched): a slot or a start
-- reserved for it (a grant), a slot of worker_id or a start it took in
-- this attempt (a grant it claimed), and whether it is in the waiters
-- (waits in a worker, or was resumed ahead); and its kind's limit row as
-- LockConcurrencyLimits reads it (limited false: no row), so that a line
-- transaction reads both in the round trip of its lock (LockLimitRows, a
-- statement before it: this one's snapshot is taken once the rows are
-- locked).
-- A slot or start of an earlier attempt whose release is not written yet
-- (a job retried at once) is not this attempt's: the attempt is decided
-- afresh, and logs a start of its own. (A slot is stamped when taken with
-- the clock, not the transaction's start, which may precede the fetch.)
SELECT r.job_id::bigint AS job_id,
       EXISTS (SELECT 1 FROM concurrency_executions e WHERE e.job_id = r.job_id AND e.reserved) AS slot_reserved,
       EXISTS (SELECT 1 FROM concurrency_starts s WHERE s.job_id = r.job_id AND s.reserved) AS start_reserved,
       EXISTS (SELECT 1 FROM concurrency_executions e
               WHERE e.job_id = r.job_id AND NOT e.reserved AND e.worker_id = sqlc.arg(worker_id)::text
                 AND e.admitted_at >= r.attempted_at) AS slot_held,
       EXISTS (SELECT 1 FROM concurrency_starts s
               WHERE s.job_id = r.job_id AND NOT s.reserved AND s.started_at >= r.attempted_at) AS start_held,
       EXISTS (SELECT 1 FROM concurrency_waiters w WHERE w.job_id = r.job_id) AS waiter,
       r.kind::text AS kind,
       (l.kind IS NOT NULL)::boolean AS limited,
       COALESCE(l.max_concurrency, 0)::integer AS max_concurrency,
       COALESCE(l.admitted, 0)::integer AS admitted,
       COALESCE(l.has_parked, false)::boolean AS has_parked,
       l.partition_fields, l.key_max, l.rate_max,
       COALESCE((extract(epoch FROM l.rate_period) * 1000)::bigint, 0)::bigint AS rate_period_ms,
       COALESCE(l.rate_per_key, false)::boolean AS rate_per_key
FROM (SELECT unnest(sqlc.arg(job_ids)::bigint[]) AS job_id,
             unnest(sqlc.arg(kinds)::text[]) AS kind,
             unnest(sqlc.arg(attempted_ats)::timestamptz[]) AS attempted_at) AS r
LEFT JOIN concurrency_limits l ON l.kind = r.kind;

-- name: KeyLines :many
-- Per key of kind (a kind with a partition; KindLine reads the one line of
-- a kind without): the slots it holds (admitted and reserved), its starts
-- in the rate window of period_ms ending now (with those reserved), in how
-- many ms the window next frees a start (when its oldest start leaves it;
-- period_ms when every start in it is reserved), the oldest job of its
-- line still waiting, parked or in the waiters without a grant (0: none),
-- and how many ms ago it last admitted a job to a slot it still holds (-1:
-- it holds none): a key whose line moves. Each table is read by its (kind,
-- key) index.
SELECT k.key::text AS key,
       e.slots::integer AS slots,
       w.starts::integer AS starts,
       w.frees_in_ms::bigint AS frees_in_ms,
       COALESCE(LEAST(
           (SELECT p.job_id FROM concurrency_parked_jobs p
            WHERE p.kind = sqlc.arg(kind) AND p.key = k.key
            ORDER BY p.job_id LIMIT 1),
           (SELECT cw.job_id FROM concurrency_waiters cw
            JOIN river_job j ON j.id = cw.job_id AND j.state IN ('running', 'available')
            WHERE cw.kind = sqlc.arg(kind) AND cw.key = k.key
              AND NOT EXISTS (SELECT 1 FROM concurrency_executions x WHERE x.job_id = cw.job_id)
            ORDER BY cw.job_id LIMIT 1)
       ), 0)::bigint AS oldest,
       COALESCE(floor(extract(epoch FROM statement_timestamp() - e.last_admitted) * 1000), -1)::bigint AS admitted_ago_ms
FROM unnest(sqlc.arg(keys)::text[]) AS k(key)
CROSS JOIN LATERAL (
    SELECT count(*) AS slots, max(x.admitted_at) AS last_admitted
    FROM concurrency_executions x
    WHERE x.kind = sqlc.arg(kind) AND x.key = k.key
) e
CROSS JOIN LATERAL (
    SELECT count(*) AS starts,
           COALESCE(ceil(extract(epoch FROM min(s.started_at) FILTER (WHERE NOT s.reserved)
                                            + make_interval(secs => sqlc.arg(period_ms)::bigint / 1000.0)
                                            - statement_timestamp()) * 1000),
                    sqlc.arg(period_ms)::bigint) AS frees_in_ms
    FROM concurrency_starts s
    WHERE s.kind = sqlc.arg(kind) AND s.key = k.key
      AND (s.reserved OR s.started_at > statement_timestamp() - make_interval(secs => sqlc.arg(period_ms)::bigint / 1000.0))
) w;

-- name: KindLine :one
-- KeyLines for the one line of a kind without a partition: its rows have
-- no key (NULL), read by the kind's indexes.
SELECT e.slots::integer AS slots,
       w.starts::integer AS starts,
       w.frees_in_ms::bigint AS frees_in_ms,
       COALESCE(LEAST(
           (SELECT p.job_id FROM concurrency_parked_jobs p
            WHERE p.kind = sqlc.arg(kind) AND p.key IS NULL
            ORDER BY p.job_id LIMIT 1),
           (SELECT cw.job_id FROM concurrency_waiters cw
            JOIN river_job j ON j.id = cw.job_id AND j.state IN ('running', 'available')
            WHERE cw.kind = sqlc.arg(kind) AND cw.key IS NULL
              AND NOT EXISTS (SELECT 1 FROM concurrency_executions x WHERE x.job_id = cw.job_id)
            ORDER BY cw.job_id LIMIT 1)
       ), 0)::bigint AS oldest,
       COALESCE(floor(extract(epoch FROM statement_timestamp() - e.last_admitted) * 1000), -1)::bigint AS admitted_ago_ms
FROM (
    SELECT count(*) AS slots, max(x.admitted_at) AS last_admitted
    FROM concurrency_executions x
    WHERE x.kind = sqlc.arg(kind) AND x.key IS NULL
) e
CROSS JOIN (
    SELECT count(*) AS starts,
           COALESCE(ceil(extract(epoch FROM min(s.started_at) FILTER (WHERE NOT s.reserved)
                                            + make_interval(secs => sqlc.arg(period_ms)::bigint / 1000.0)
                                            - statement_timestamp()) * 1000),
                    sqlc.arg(period_ms)::bigint) AS frees_in_ms
    FROM concurrency_starts s
    WHERE s.kind = sqlc.arg(kind) AND s.key IS NULL
      AND (s.reserved OR s.started_at > statement_timestamp() - make_interval(secs => sqlc.arg(period_ms)::bigint / 1000.0))
) w;

-- name: UndecidedOlder :many
-- Running jobs of kind older than max_id that no decision of the limiter
-- covers yet: fetched by a worker whose limiter has not decided them (no
-- slot, no start, no waiter row, no parking), with their partition keys
-- (fields; '' without). A job of a key must not start before them. Jobs
-- fetched more than 10 s ago without a decision run unlimited (they started
-- before the kind was limited, or ignore its limits): they hold nothing up.
-- except_ids are the jobs being decided.
SELECT j.id, COALESCE(sluice_partition_key(j.args, sqlc.narg(fields)::text[]), '')::text AS key
FROM river_job j
WHERE j.state = 'running' AND j.kind = sqlc.arg(kind) AND j.id < sqlc.arg(max_id)
  AND j.attempted_at > statement_timestamp() - interval '10 seconds'
  AND j.id <> ALL(sqlc.arg(except_ids)::bigint[])
  AND NOT EXISTS (SELECT 1 FROM concurrency_executions e WHERE e.job_id = j.id)
  AND NOT EXISTS (SELECT 1 FROM concurrency_starts s WHERE s.job_id = j.id)
  AND NOT EXISTS (SELECT 1 FROM concurrency_waiters w WHERE w.job_id = j.id)
  AND NOT EXISTS (SELECT 1 FROM concurrency_parked_jobs p WHERE p.job_id = j.id);

-- name: UpsertWaiters :exec
-- Records jobs as waiting in worker_id for a slot (job_ids, keys, reasons in
-- step; key '': none), or, without a worker, as resumed ahead. A job already
-- in the line keeps its place, its first since, and whether it came ahead.
INSERT INTO concurrency_waiters (job_id, kind, key, worker_id, reason, ahead)
SELECT r.job_id, sqlc.arg(kind), NULLIF(r.key, ''), sqlc.narg(worker_id)::text, r.reason, sqlc.narg(worker_id)::text IS NULL
FROM (SELECT unnest(sqlc.arg(job_ids)::bigint[]) AS job_id, unnest(sqlc.arg(keys)::text[]) AS key,
             unnest(sqlc.arg(reasons)::text[]) AS reason) AS r
ON CONFLICT (job_id) DO UPDATE
SET worker_id = EXCLUDED.worker_id, reason = EXCLUDED.reason, key = EXCLUDED.key;

-- name: DeleteKindWaiters :exec
-- Lets every waiter of kind go: its limits are gone. A job waiting in a
-- worker finds its place gone at the worker's next poll and is decided
-- again; a job resumed ahead runs when fetched.
DELETE FROM concurrency_waiters WHERE kind = sqlc.arg(kind);

-- name: DeleteWaiters :exec
-- Takes jobs out of the line's waiters (admitted, parked, or gone).
DELETE FROM concurrency_waiters WHERE job_id = ANY(sqlc.arg(job_ids)::bigint[]);

-- name: HasGrants :one
-- Whether a job waiting in worker_id may have a grant to claim: a slot or a
-- start reserved for one of its waiters (whichever worker the grant
-- names: a job resumed ahead may be granted a slot as it is taken by its
-- worker, TakeAheadWaiters). It reads the reserved rows (few: grants not
-- claimed yet) and their waiters, so that a worker's line poller looks
-- every few ms for less than a claim costs (under P10's churn about
-- 0.9 ms against 1.2-1.4 ms), and claims (ClaimGrants) only when there is
-- something.
SELECT (EXISTS (SELECT 1 FROM concurrency_executions e JOIN concurrency_waiters w ON w.job_id = e.job_id
                WHERE e.reserved AND w.worker_id = sqlc.arg(worker_id)::text)
     OR EXISTS (SELECT 1 FROM concurrency_starts s JOIN concurrency_waiters w ON w.job_id = s.job_id
                WHERE s.reserved AND w.worker_id = sqlc.arg(worker_id)::text))::boolean AS has;

-- name: NotifyGrants :exec
-- Tells the workers whose jobs got grants that they can claim them: one
-- notification per worker (payloads, built by the grant round: the worker
-- id and its jobs, or "*" for a job resumed ahead, which any worker may
-- have taken meanwhile). Their line pollers, LISTENing on sluice_grants,
-- claim them at once. Postgres delivers them when the grant's transaction
-- commits, and sends each distinct payload once.
SELECT pg_notify('sluice_grants', p) FROM unnest(sqlc.arg(payloads)::text[]) AS p;

-- name: ListenGrants :exec
-- Subscribes this session to the notifications of grants (NotifyGrants).
LISTEN sluice_grants;

-- name: ClaimGrants :many
-- A worker takes the grants its waiting jobs (job_ids) got from a release
-- in another process: each reserved slot and start becomes the job's own
-- (started now), and the job leaves the line. Returns the jobs that got a
-- grant (slot: a slot, not only a start) and, with gone, the jobs whose
-- waiter row is gone without a grant (their limit was cleared, or the
-- safety net dropped them): they are decided again.
WITH slots AS (
    UPDATE concurrency_executions e
    SET reserved = false, worker_id = sqlc.arg(worker_id)::text, admitted_at = clock_timestamp()
    WHERE e.job_id = ANY(sqlc.arg(job_ids)::bigint[]) AND e.reserved
    RETURNING e.job_id
),
starts AS (
    UPDATE concurrency_starts s
    SET reserved = false, started_at = clock_timestamp()
    WHERE s.job_id = ANY(sqlc.arg(job_ids)::bigint[]) AND s.reserved
    RETURNING s.job_id
),
claimed AS (
    SELECT x.job_id, bool_or(x.slot) AS slot
    FROM (SELECT job_id, true AS slot FROM slots UNION ALL SELECT job_id, false FROM starts) x
    GROUP BY x.job_id
),
gone AS (
    DELETE FROM concurrency_waiters w WHERE w.job_id IN (SELECT c.job_id FROM claimed c)
)
SELECT c.job_id::bigint AS job_id, c.slot::boolean AS slot, false AS gone FROM claimed c
UNION ALL
SELECT r.job_id::bigint, false, true
FROM unnest(sqlc.arg(job_ids)::bigint[]) AS r(job_id)
WHERE NOT EXISTS (SELECT 1 FROM concurrency_waiters w WHERE w.job_id = r.job_id)
  AND NOT EXISTS (SELECT 1 FROM claimed c WHERE c.job_id = r.job_id);

-- name: LineFront :many
-- The front of the line of kind's keys (a kind with a partition;
-- KindLineFront reads the one line of a kind without): per key its oldest
-- per_key waiting jobs, parked or waiters (not holding a grant; one
-- resumed ahead counts from when it is available until its worker decides
-- it), in job-id order, each with where it waits (parked job, or the
-- worker a waiter waits in, NULL when resumed ahead), whether it is ready
-- (a parked job still completing its parking holds up the younger ones
-- unless it is more than 5 s late) and resumable (pending), its queue,
-- what holds it, and whether it was resumed ahead once already; and, on
-- each row, the slots its key holds (admitted and reserved, as KeyLines
-- counts them: a grant round under a per-key limit without a per-key rate
-- needs nothing else of KeyLines). A key's rows are read in job-id order
-- from the (kind, key, job_id) indexes. Under a per-key limit (key_max > 0)
-- a key without parked jobs is read only as deep as a round can use it:
-- its free slots (key_max less those it holds; the lookahead resumes only
-- parked jobs, and only a parked job can be passed over); under P10's
-- churn most keys that freed a slot are read one job deep instead of four.
SELECT k.key::text AS key, f.job_id, f.parked, f.worker_id, f.ready, f.resumable, f.queue, f.reason, f.ahead,
       e.slots::integer AS key_slots
FROM unnest(sqlc.arg(keys)::text[]) AS k(key)
CROSS JOIN LATERAL (
    SELECT count(*) AS slots FROM concurrency_executions x WHERE x.kind = sqlc.arg(kind) AND x.key = k.key
) e
CROSS JOIN LATERAL (
    SELECT CASE WHEN sqlc.arg(key_max)::integer > 0
                     AND NOT EXISTS (SELECT 1 FROM concurrency_parked_jobs p WHERE p.kind = sqlc.arg(kind) AND p.key = k.key)
                THEN LEAST(sqlc.arg(per_key)::integer, GREATEST(sqlc.arg(key_max)::integer - e.slots, 0))
                ELSE sqlc.arg(per_key)::integer END AS depth
) d
CROSS JOIN LATERAL (
    SELECT x.job_id, x.parked, x.worker_id, x.ready, x.resumable, x.queue, x.reason, x.ahead
    FROM (
        (SELECT p.job_id, true AS parked, NULL::text AS worker_id,
                (j.state = 'pending' OR p.parked_at < now() - interval '5 seconds')::boolean AS ready,
                (j.state = 'pending') AS resumable, j.queue, p.reason, p.ahead
         FROM concurrency_parked_jobs p
         JOIN river_job j ON j.id = p.job_id
         WHERE p.kind = sqlc.arg(kind) AND p.key = k.key
         ORDER BY p.job_id
         LIMIT d.depth)
        UNION ALL
        (SELECT w.job_id, false, w.worker_id, true::boolean, true, j.queue, w.reason, w.ahead
         FROM concurrency_waiters w
         JOIN river_job j ON j.id = w.job_id
             AND (j.state = 'running' OR (w.worker_id IS NULL AND j.state = 'available'))
         WHERE w.kind = sqlc.arg(kind) AND w.key = k.key
           AND NOT EXISTS (SELECT 1 FROM concurrency_executions e WHERE e.job_id = w.job_id)
         ORDER BY w.job_id
         LIMIT d.depth)
    ) x
    ORDER BY x.job_id
    LIMIT d.depth
) f
ORDER BY k.key, f.job_id;

-- name: KindLineFront :many
-- LineFront for the one line of a kind without a partition: its rows have
-- no key (NULL), read in job-id order from the (kind, job_id) indexes.
SELECT x.job_id, x.parked, x.worker_id, x.ready, x.resumable, x.queue, x.reason, x.ahead,
       (SELECT count(*) FROM concurrency_executions e
        WHERE e.kind = sqlc.arg(kind) AND e.key IS NULL)::integer AS key_slots
FROM (
    (SELECT p.job_id, true AS parked, NULL::text AS worker_id,
            (j.state = 'pending' OR p.parked_at < now() - interval '5 seconds')::boolean AS ready,
            (j.state = 'pending') AS resumable, j.queue, p.reason, p.ahead
     FROM concurrency_parked_jobs p
     JOIN river_job j ON j.id = p.job_id
     WHERE p.kind = sqlc.arg(kind) AND p.key IS NULL
     ORDER BY p.job_id
     LIMIT sqlc.arg(per_key))
    UNION ALL
    (SELECT w.job_id, false, w.worker_id, true::boolean, true, j.queue, w.reason, w.ahead
     FROM concurrency_waiters w
     JOIN river_job j ON j.id = w.job_id
         AND (j.state = 'running' OR (w.worker_id IS NULL AND j.state = 'available'))
     WHERE w.kind = sqlc.arg(kind) AND w.key IS NULL
       AND NOT EXISTS (SELECT 1 FROM concurrency_executions e WHERE e.job_id = w.job_id)
     ORDER BY w.job_id
     LIMIT sqlc.arg(per_key))
) x
ORDER BY x.job_id
LIMIT sqlc.arg(per_key);

-- name: TurnKeys :many
-- Up to max_keys keys of kind with waiting jobs, in the round's order: the
-- keys least recently served first, a key not served since it started
-- waiting first of all.
SELECT t.key FROM concurrency_key_turns t
WHERE t.kind = sqlc.arg(kind)
ORDER BY t.served_at NULLS FIRST, t.key
LIMIT sqlc.arg(max_keys);

-- name: EnsureKeyTurns :exec
-- Gives keys of kind that start waiting a place in the round: first, as not
-- served since.
INSERT INTO concurrency_key_turns (kind, key, served_at)
SELECT sqlc.arg(kind), k, NULL
FROM unnest(sqlc.arg(keys)::text[]) AS k
ON CONFLICT (kind, key) DO NOTHING;

-- name: HasKindLine :one
-- Whether jobs of kind wait for the kind itself (its limit, its rate, older
-- jobs of the kind, its breaker), parked or in the waiters: new jobs of the
-- kind queue behind them (the kind's has_parked flag).
SELECT (EXISTS (
    SELECT 1 FROM concurrency_parked_jobs p
    WHERE p.kind = sqlc.arg(kind) AND p.reason NOT IN ('key_limit', 'key_fifo', 'key_rate')
) OR EXISTS (
    SELECT 1 FROM concurrency_waiters w
    WHERE w.kind = sqlc.arg(kind) AND w.reason NOT IN ('key_limit', 'key_fifo', 'key_rate')
))::boolean AS has;

-- name: HasAnyLine :one
-- Whether kind has jobs in its line for any reason.
SELECT (EXISTS (SELECT 1 FROM concurrency_parked_jobs p WHERE p.kind = sqlc.arg(kind))
    OR EXISTS (SELECT 1 FROM concurrency_waiters w WHERE w.kind = sqlc.arg(kind)))::boolean AS has;

-- name: CountAhead :one
-- Jobs of kind resumed or waiting without a grant (the lookahead already
-- in the workers, or on its way to them).
SELECT count(*)::integer FROM concurrency_waiters w
JOIN river_job j ON j.id = w.job_id AND j.state IN ('running', 'available')
WHERE w.kind = sqlc.arg(kind)
  AND NOT EXISTS (SELECT 1 FROM concurrency_executions e WHERE e.job_id = w.job_id);

-- name: ReserveGrants :exec
-- Grants slots of kind to the jobs at the front of its line (job_ids,
-- keys, worker_ids in step: the worker a job waits in, '' for none, and
-- claimed: taken at once by a job waiting in the granting worker): a slot
-- row each, reserved for the job unless claimed, and raises the kind's
-- count (its row locked by the caller) by the rows added (xmax 0): a job
-- that still had a row (a stale one of an earlier attempt) keeps it,
-- counted when it was added. Returns nothing, so that it travels with the
-- transaction's next statement (db.Pipeline).
WITH granted AS (
    INSERT INTO concurrency_executions (job_id, kind, worker_id, reserved, key, admitted_at)
    SELECT r.job_id, sqlc.arg(kind), NULLIF(r.worker_id, ''), NOT r.claimed, NULLIF(r.key, ''), clock_timestamp()
    FROM (SELECT unnest(sqlc.arg(job_ids)::bigint[]) AS job_id, unnest(sqlc.arg(keys)::text[]) AS key,
                 unnest(sqlc.arg(worker_ids)::text[]) AS worker_id, unnest(sqlc.arg(claimed)::boolean[]) AS claimed) AS r
    ON CONFLICT (job_id) DO UPDATE
    SET worker_id = EXCLUDED.worker_id, reserved = EXCLUDED.reserved, admitted_at = clock_timestamp(), key = EXCLUDED.key
    RETURNING (xmax::text = '0')::boolean AS inserted
)
UPDATE concurrency_limits l
SET admitted = l.admitted + (SELECT count(*) FROM granted g WHERE g.inserted)::integer
WHERE l.kind = sqlc.arg(kind);

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
    ON CONFLICT (job_id) DO NOTHING
)
SELECT r.job_id FROM revoked r;

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
-- SQL: waiting_jobs).
UPDATE concurrency_leases SET waiting = sqlc.arg(job_ids)::bigint[]
WHERE kind = sqlc.arg(kind) AND worker_id = sqlc.arg(worker_id)::text;

-- name: ParkWorkerWaiters :many
-- Parks the jobs a dead worker had waiting for a slot (its waiter rows, and
-- the jobs its lease keeper published as waiting), in the reap's
-- transaction before they are rescued: each is marked for parking, so that
-- the rescue's update turns it back into a pending job with its attempt
-- undone (sluice_park_in_place: it never ran), and recorded as parked with
-- the reason it waited for. Returns the jobs and kinds.
WITH waiting AS (
    SELECT w.job_id, w.kind, w.key, w.reason FROM concurrency_waiters w
    WHERE w.worker_id = sqlc.arg(worker_id)::text
    UNION
    SELECT u.job_id, cl.kind, NULL::text, 'limit'::text
    FROM concurrency_leases cl CROSS JOIN LATERAL unnest(cl.waiting) AS u(job_id)
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

-- name: HandOverStates :many
-- What a worker needs to hand a freed slot of kinds to a job waiting in it,
-- in memory (limiter/handover.go), read by its line poller while jobs
-- wait: the limit, the slots taken, whether a per-key or rate limit holds
-- the kind (then it never hands over), its oldest parked job (0: none),
-- which goes before any younger job, and how many other workers have jobs
-- of the kind waiting in them (worker_id is the reader): while some do, a
-- worker keeps to its share of the limit.
SELECT l.kind, l.max_concurrency, l.admitted,
       (l.partition_fields IS NOT NULL OR l.rate_max IS NOT NULL)::boolean AS keyed,
       COALESCE((SELECT min(p.job_id) FROM concurrency_parked_jobs p WHERE p.kind = l.kind), 0)::bigint AS oldest_parked,
       (SELECT count(DISTINCT w.worker_id) FROM concurrency_waiters w
        WHERE w.kind = l.kind AND w.worker_id <> sqlc.arg(worker_id)::text)::integer AS other_workers
FROM concurrency_limits l
WHERE l.kind = ANY(sqlc.arg(kinds)::text[]);

-- name: HandOverSlots :many
-- Writes the slots worker_id handed over in memory: the slot of each ended
-- job from_ids[i] now belongs to to_ids[i] (in step), a job of its kind
-- that waited in the same worker, which leaves the waiters. A job handed a
-- slot that a grant round reserved one for meanwhile (it read the job as
-- waiting) keeps that one, claimed, and the ended job's slot is freed
-- instead. The caller holds the kinds' limit rows, locked by an earlier
-- statement of its transaction, so that this one reads every grant that
-- committed before (limiter/release.go); returns the kinds whose count it
-- lowered.
WITH pairs AS (
    SELECT unnest(sqlc.arg(from_ids)::bigint[]) AS from_id, unnest(sqlc.arg(to_ids)::bigint[]) AS to_id
),
granted AS (
    UPDATE concurrency_executions e
    SET reserved = false, worker_id = sqlc.arg(worker_id)::text, admitted_at = clock_timestamp()
    FROM pairs p
    WHERE e.job_id = p.to_id
    RETURNING e.job_id
),
moved AS (
    UPDATE concurrency_executions e
    SET job_id = p.to_id, admitted_at = clock_timestamp()
    FROM pairs p
    WHERE e.job_id = p.from_id AND e.worker_id = sqlc.arg(worker_id)::text
      AND NOT EXISTS (SELECT 1 FROM concurrency_executions x WHERE x.job_id = p.to_id)
    RETURNING e.job_id
),
freed AS (
    DELETE FROM concurrency_executions e
    USING pairs p
    WHERE e.job_id = p.from_id AND e.worker_id = sqlc.arg(worker_id)::text
      AND EXISTS (SELECT 1 FROM concurrency_executions x WHERE x.job_id = p.to_id)
    RETURNING e.kind
),
unwaited AS (
    DELETE FROM concurrency_waiters w
    WHERE w.job_id IN (SELECT p.to_id FROM pairs p)
)
UPDATE concurrency_limits l
SET admitted = GREATEST(l.admitted - f.n, 0)
FROM (SELECT freed.kind, count(*)::integer AS n FROM freed GROUP BY freed.kind) f
WHERE l.kind = f.kind
RETURNING l.kind;

-- name: TakeAheadWaiters :many
-- A worker that fetched jobs resumed ahead of a free slot (waiters without
-- a worker) records them as waiting in it, without the kind's lock: this
-- decides nothing (they keep their place in the line, and a grant reserved
-- for one meanwhile is claimed at the worker's next poll). Only jobs that
-- hold no slot and no start, granted or their own: the others are decided
-- by a line transaction. Returns the jobs it took.
UPDATE concurrency_waiters w
SET worker_id = sqlc.arg(worker_id)::text
WHERE w.job_id = ANY(sqlc.arg(job_ids)::bigint[]) AND w.worker_id IS NULL
  AND NOT EXISTS (SELECT 1 FROM concurrency_executions e WHERE e.job_id = w.job_id)
  AND NOT EXISTS (SELECT 1 FROM concurrency_starts s WHERE s.job_id = w.job_id)
RETURNING w.job_id;
