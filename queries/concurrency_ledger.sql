-- The limiter's ledger (limiter/internal/ledger): every transaction that
-- changes slots locks its kinds (LedgerLockKinds: an advisory lock per
-- kind, exclusive, or shared under per-key limits alone) and, under
-- per-key limits alone, its keys' rows (LedgerLockKeys), in that order;
-- then reads in one statement what it decides from (a JSON document, read
-- in the snapshot taken once the locks are held); then writes. Each
-- transaction is two round trips: the locks travel with the read, and the
-- writes with COMMIT (pgkit.Pipeline).

-- name: LedgerSettings :exec
-- For the rest of the transaction (a ledger transaction's first
-- statement), reads every table by a plain index scan where one serves.
-- The line tables swing from empty to thousands of rows and back, faster
-- than autovacuum's statistics follow: a plan made while one looked small
-- scans all of it, once per key of a nested loop (a generic plan, cached
-- for the connection's life, scanned concurrency_parked_jobs whole at
-- 80 ms a statement), or reads all of its rows of the kind in a bitmap
-- scan and sorts them for the 64 at the front (LedgerGrantState: 70 ms
-- with 20,000 jobs parked, 1.8 ms by the index's order). With sequential
-- and bitmap scans off the statements' cached generic plans are safe to
-- keep, and with generic set (a transaction on prepared statements) they
-- are kept: Postgres's own choice (auto) planned the largest statements
-- afresh at every run, 3 to 4 ms each under the kind's lock, which halved
-- the turnover of a kind's slots. Without it (a transaction on unnamed
-- statements, planned for their arguments) the choice stays Postgres's.
-- A plan that has to scan a table anyway costs more than jit_above_cost
-- with sequential scans off: JIT is off too (it compiled for 190 ms a
-- statement that runs in a millisecond).
-- A row of the line tables reads its job by id: a test of the job's state
-- beside the id is written `(j.state = 'running') IS TRUE`, which no
-- index serves, so that the join probes river_job's primary key. Written
-- plainly, the state matched river_job_prioritized_fetching_index, and a
-- plan made while river_job was analyzed with no job running (one row
-- estimated) scanned every running job's index entry once per line row:
-- 274 entries a probe, 24 ms of a 27-ms LedgerDecideState in P10, and
-- about 15 of a 26-ms LedgerGrantState.
-- For the same reason a row's absence from a line table (a waiter without
-- a slot, say) is tested as `(SELECT e.job_id FROM concurrency_executions
-- e WHERE e.job_id = w.job_id) IS NULL`, a probe of the primary key per
-- row: written NOT EXISTS, it was planned as an anti join whose inner side
-- read the primary key end to end for every outer row (200 slot rows for
-- each of 3 waiters of each of 100 keys: 10 of a 24-ms LedgerDecideState
-- in P10).
SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true), set_config('jit', 'off', true),
       set_config('plan_cache_mode', CASE WHEN sqlc.arg(generic)::boolean THEN 'force_generic_plan' ELSE 'auto' END, true);

-- name: LedgerLockKinds :exec
-- Takes the kinds' locks (kinds sorted, shared in step: true for a shared
-- lock), in kind order: transaction-level advisory locks on
-- hashtextextended('sluice.limit_row:' || kind, 0), also taken (exclusive)
-- by every change of a kind's limits and by the creation of its limit row.
SELECT CASE WHEN s.shared THEN pg_advisory_xact_lock_shared(s.h)::text ELSE pg_advisory_xact_lock(s.h)::text END
FROM (SELECT hashtextextended('sluice.limit_row:' || k.kind, 0) AS h, k.shared
      FROM (SELECT unnest(sqlc.arg(kinds)::text[]) AS kind, unnest(sqlc.arg(shared)::boolean[]) AS shared) AS k
      ORDER BY k.kind OFFSET 0) AS s;

-- name: LedgerLockChange :exec
-- Takes kind's change lock, exclusive: the transaction-level advisory lock
-- on hashtextextended('sluice.limit_change:' || kind, 0), which a change
-- of limits (ledger.Change) holds, and which a fetch that parks the jobs
-- behind long lines holds shared (LedgerTryLockChanges): the two never
-- interleave, while decisions and grants never take it.
SELECT pg_advisory_xact_lock(hashtextextended('sluice.limit_change:' || sqlc.arg(kind)::text, 0))::text;

-- name: LedgerTryLockChanges :many
-- Takes the kinds' change locks shared (LedgerLockChange) where no change
-- of limits holds or waits for one, without waiting, and returns those
-- kinds: a fetch parks the jobs behind long lines of those only
-- (LedgerParkAheadPick, the statement after this one, whose snapshot then
-- sees every change committed), and never waits for a change.
SELECT k.kind::text
FROM (SELECT DISTINCT unnest(sqlc.arg(kinds)::text[]) AS kind ORDER BY 1) AS k
WHERE pg_try_advisory_xact_lock_shared(hashtextextended('sluice.limit_change:' || k.kind, 0));

-- name: LedgerLockKeys :exec
-- Takes the rows of the keys (kinds and keys in step, sorted by kind,
-- then key), making those missing: a key's row is its lock under per-key
-- limits alone.
INSERT INTO concurrency_key_lines (kind, key)
SELECT k.kind, k.key
FROM (SELECT DISTINCT r.kind, r.key FROM (SELECT unnest(sqlc.arg(kinds)::text[]) AS kind, unnest(sqlc.arg(keys)::text[]) AS key) AS r
      ORDER BY 1, 2) AS k
ON CONFLICT (kind, key) DO UPDATE SET kind = EXCLUDED.kind;

-- name: LedgerLimits :many
-- The limit rows of kinds, as the ledger decides from them.
SELECT l.kind, l.max_concurrency, l.admitted, l.has_parked, l.partition_fields, l.key_max, l.rate_max,
       COALESCE((extract(epoch FROM l.rate_period) * 1000)::bigint, 0)::bigint AS rate_period_ms,
       l.rate_per_key
FROM concurrency_limits l
WHERE l.kind = ANY(sqlc.arg(kinds)::text[])
ORDER BY l.kind;

-- name: LedgerAllLimits :many
-- Every limit row, as LedgerLimits reads them: a worker's copy of the
-- limits (read without a lock; every decision reads them again under its
-- kinds' locks).
SELECT l.kind, l.max_concurrency, l.admitted, l.has_parked, l.partition_fields, l.key_max, l.rate_max,
       COALESCE((extract(epoch FROM l.rate_period) * 1000)::bigint, 0)::bigint AS rate_period_ms,
       l.rate_per_key
FROM concurrency_limits l
ORDER BY l.kind;

-- name: LedgerDecideState :one
-- What a decision of jobs (job_ids, with their kinds, the keys the caller
-- computed and when each was fetched, in step) reads, as one JSON
-- document: per job its key (from its args and its kind's partition), and
-- what the ledger holds for it (a grant to claim: a reserved slot or
-- start; a slot or start it took in this attempt, or a stale one of an
-- earlier attempt; a place in the line); per kind (with a limit row) its
-- limits and counts, its line (the oldest job waiting for the kind or,
-- without a partition, granted and on its way; the oldest waiting in a
-- worker without a grant; and,
-- without a partition, how many wait, up to max_ahead, the newest
-- max_steals slots and starts reserved for jobs on their way, and the
-- oldest job granted a slot and not fetched yet: transit) and its rate
-- window; per key its count of slots, its line (its oldest job waiting or
-- granted and on its way, its oldest waiting in a worker without a grant,
-- its newest max_steals reserved slots and starts, its transit) and its
-- rate window; per kind without a partition and per key,
-- the oldest job fetched by a worker and not decided yet (fetched: marked
-- by its fetch within the last two seconds, still running, not in this
-- decision; without a partition, also a job another worker published as
-- waiting for a leased slot), which no younger job of its line passes.
WITH lim AS (
    SELECT l.kind, l.partition_fields AS fields, l.rate_max,
           COALESCE(l.rate_period, interval '0') AS period, l.rate_per_key
    FROM concurrency_limits l
    WHERE l.kind = ANY(sqlc.arg(kinds)::text[])
),
batch AS (
    SELECT b.job_id, b.kind, b.key, b.fetched_at
    FROM (SELECT unnest(sqlc.arg(job_ids)::bigint[]) AS job_id, unnest(sqlc.arg(job_kinds)::text[]) AS kind, unnest(sqlc.arg(job_keys)::text[]) AS key, unnest(sqlc.arg(fetched_ats)::timestamptz[]) AS fetched_at) AS b
),
jobs AS (
    SELECT b.job_id, b.kind,
           COALESCE(sluice_partition_key(j.args, lim.fields), '') AS key,
           EXISTS (SELECT 1 FROM concurrency_executions e WHERE e.job_id = b.job_id AND e.reserved) AS slot_reserved,
           EXISTS (SELECT 1 FROM concurrency_starts s WHERE s.job_id = b.job_id AND s.reserved) AS start_reserved,
           EXISTS (SELECT 1 FROM concurrency_executions e
                   WHERE e.job_id = b.job_id AND NOT e.reserved AND e.worker_id = sqlc.arg(worker_id)::text
                     AND e.admitted_at >= b.fetched_at) AS slot_held,
           EXISTS (SELECT 1 FROM concurrency_executions e
                   WHERE e.job_id = b.job_id AND NOT e.reserved
                     AND NOT (e.worker_id = sqlc.arg(worker_id)::text AND e.admitted_at >= b.fetched_at)) AS slot_stale,
           EXISTS (SELECT 1 FROM concurrency_starts s
                   WHERE s.job_id = b.job_id AND NOT s.reserved AND s.started_at >= b.fetched_at) AS start_held,
           w.ahead IS NOT NULL AS waiter,
           COALESCE(w.ahead, false) AS ahead
    FROM batch b
    LEFT JOIN river_job j ON j.id = b.job_id
    LEFT JOIN lim ON lim.kind = b.kind
    -- a probe by primary key per job (see LedgerSettings): joined, the
    -- waiters were read whole for each job of the batch
    CROSS JOIN LATERAL (SELECT (SELECT w.ahead FROM concurrency_waiters w WHERE w.job_id = b.job_id) AS ahead) AS w
),
keys AS (
    -- The jobs' keys as the database computes them (the caller's locked the
    -- keys' rows; a decision checks that the two agree).
    SELECT DISTINCT j.kind, j.key FROM jobs j JOIN lim ON lim.kind = j.kind AND lim.fields IS NOT NULL
)
SELECT jsonb_build_object(
    'jobs', COALESCE((SELECT jsonb_agg(to_jsonb(jobs)) FROM jobs), '[]'),
    'kinds', COALESCE((
        SELECT jsonb_agg(jsonb_build_object(
            'kind', lim.kind, 'max', l.max_concurrency, 'admitted', l.admitted, 'has_parked', l.has_parked,
            'fields', l.partition_fields, 'key_max', l.key_max, 'rate_max', l.rate_max,
            'rate_period_ms', (extract(epoch FROM lim.period) * 1000)::bigint, 'rate_per_key', l.rate_per_key,
            'reserved_slots', ARRAY(SELECT e.job_id FROM concurrency_executions e
                                    WHERE lim.fields IS NULL AND e.kind = lim.kind AND e.reserved AND e.key IS NULL
                                    ORDER BY e.job_id DESC LIMIT sqlc.arg(max_steals)::integer),
            -- with a partition, under a kind-wide limit: the oldest job of
            -- any key granted one of the kind's slots and not fetched yet
            'transit', (SELECT min(e.job_id) FROM concurrency_executions e JOIN river_job o ON o.id = e.job_id AND (o.state = 'available') IS TRUE
                        WHERE e.kind = lim.kind AND e.reserved
                          AND ((lim.fields IS NULL AND e.key IS NULL) OR (lim.fields IS NOT NULL AND l.max_concurrency > 0))),
            'reserved_starts', ARRAY(SELECT s.job_id FROM concurrency_starts s
                                     WHERE lim.fields IS NULL AND s.kind = lim.kind AND s.reserved AND s.key IS NULL
                                     ORDER BY s.job_id DESC LIMIT sqlc.arg(max_steals)::integer),
            'reserved_both', ARRAY(SELECT e.job_id FROM concurrency_executions e
                                   JOIN concurrency_starts s ON s.job_id = e.job_id AND s.reserved
                                   WHERE lim.fields IS NULL AND e.kind = lim.kind AND e.reserved AND e.key IS NULL
                                   ORDER BY e.job_id DESC LIMIT sqlc.arg(max_steals)::integer),
            'fetched', (SELECT min(x.job_id) FROM (
                (SELECT f.job_id FROM concurrency_fetches f JOIN river_job o ON o.id = f.job_id AND (o.state = 'running') IS TRUE
                 WHERE lim.fields IS NULL AND f.kind = lim.kind AND f.key IS NULL
                   AND f.fetched_at > statement_timestamp() - interval '2 seconds'
                   AND f.job_id <> ALL(sqlc.arg(job_ids)::bigint[])
                 ORDER BY f.job_id LIMIT 1)
                UNION ALL
                -- waiting in another worker for a leased slot, published
                (SELECT u.job_id FROM concurrency_leases cl CROSS JOIN LATERAL unnest(cl.waiting) AS u(job_id)
                 JOIN river_job o ON o.id = u.job_id AND (o.state = 'running') IS TRUE
                 WHERE lim.fields IS NULL AND cl.kind = lim.kind AND cl.worker_id <> sqlc.arg(worker_id)::text
                   AND u.job_id <> ALL(sqlc.arg(job_ids)::bigint[]))) x),
            'front', (SELECT min(x.job_id) FROM (
                (SELECT w.job_id FROM concurrency_waiters w
                 WHERE w.kind = lim.kind AND (lim.fields IS NULL OR w.reason NOT IN ('key_limit', 'key_fifo', 'key_rate'))
                 ORDER BY w.job_id LIMIT 1)
                UNION ALL
                (SELECT p.job_id FROM concurrency_parked_jobs p
                 WHERE p.kind = lim.kind AND (lim.fields IS NULL OR p.reason NOT IN ('key_limit', 'key_fifo', 'key_rate'))
                 ORDER BY p.job_id LIMIT 1)
                UNION ALL
                (SELECT e.job_id FROM concurrency_executions e WHERE lim.fields IS NULL AND e.kind = lim.kind AND e.reserved
                 ORDER BY e.job_id LIMIT 1)
                UNION ALL
                (SELECT s.job_id FROM concurrency_starts s WHERE lim.fields IS NULL AND s.kind = lim.kind AND s.reserved
                 ORDER BY s.job_id LIMIT 1)) x),
            'waiting', (SELECT min(w.job_id) FROM concurrency_waiters w
                        WHERE lim.fields IS NULL AND w.kind = lim.kind AND w.worker_id IS NOT NULL
                          AND (SELECT e.job_id FROM concurrency_executions e WHERE e.job_id = w.job_id) IS NULL),
            'ahead', (SELECT count(*) FROM (
                (SELECT 1 FROM concurrency_waiters w WHERE w.kind = lim.kind AND lim.fields IS NULL
                 LIMIT sqlc.arg(max_ahead)::integer)
                UNION ALL
                (SELECT 1 FROM concurrency_parked_jobs p WHERE p.kind = lim.kind AND lim.fields IS NULL
                 LIMIT sqlc.arg(max_ahead)::integer)) x),
            'starts', (SELECT count(*) FROM concurrency_starts s
                       WHERE lim.rate_max IS NOT NULL AND NOT lim.rate_per_key AND s.kind = lim.kind
                         AND (s.reserved OR s.started_at > statement_timestamp() - lim.period)),
            'frees_in_ms', (SELECT COALESCE(ceil(extract(epoch FROM min(s.started_at) + lim.period - statement_timestamp()) * 1000),
                                            extract(epoch FROM lim.period) * 1000)::bigint
                            FROM concurrency_starts s
                            WHERE lim.rate_max IS NOT NULL AND NOT lim.rate_per_key AND s.kind = lim.kind AND NOT s.reserved
                              AND s.started_at > statement_timestamp() - lim.period)))
        FROM lim JOIN concurrency_limits l ON l.kind = lim.kind), '[]'),
    'keys', COALESCE((
        SELECT jsonb_agg(jsonb_build_object(
            'kind', k.kind, 'key', k.key,
            'slots', COALESCE(kl.slots, 0),
            'reserved_slots', COALESCE(r.last_ids, '{}'),
            'transit', r.transit_id,
            'reserved_starts', ARRAY(SELECT s.job_id FROM concurrency_starts s
                                     WHERE s.kind = k.kind AND s.key = k.key AND s.reserved
                                     ORDER BY s.job_id DESC LIMIT sqlc.arg(max_steals)::integer),
            'reserved_both', COALESCE(r.both_ids, '{}'),
            'fetched', (SELECT min(f.job_id) FROM concurrency_fetches f JOIN river_job o ON o.id = f.job_id AND (o.state = 'running') IS TRUE
                        WHERE f.kind = k.kind AND f.key = k.key
                          AND f.fetched_at > statement_timestamp() - interval '2 seconds' AND NOT f.leased
                          AND f.job_id <> ALL(sqlc.arg(job_ids)::bigint[])),
            'front', LEAST(r.first_id, (SELECT min(x.job_id) FROM (
                (SELECT w.job_id FROM concurrency_waiters w WHERE w.kind = k.kind AND w.key = k.key ORDER BY w.job_id LIMIT 1)
                UNION ALL
                (SELECT p.job_id FROM concurrency_parked_jobs p WHERE p.kind = k.kind AND p.key = k.key ORDER BY p.job_id LIMIT 1)
                UNION ALL
                (SELECT s.job_id FROM concurrency_starts s WHERE s.kind = k.kind AND s.key = k.key AND s.reserved
                 ORDER BY s.job_id LIMIT 1)) x)),
            'waiting', (SELECT min(w.job_id) FROM concurrency_waiters w
                        WHERE w.kind = k.kind AND w.key = k.key AND w.worker_id IS NOT NULL
                          AND (SELECT e.job_id FROM concurrency_executions e WHERE e.job_id = w.job_id) IS NULL),
            'ahead', (SELECT count(*) FROM (
                (SELECT 1 FROM concurrency_waiters w WHERE w.kind = k.kind AND w.key = k.key LIMIT sqlc.arg(max_ahead)::integer)
                UNION ALL
                (SELECT 1 FROM concurrency_parked_jobs p WHERE p.kind = k.kind AND p.key = k.key LIMIT sqlc.arg(max_ahead)::integer)) x),
            'starts', (SELECT count(*) FROM concurrency_starts s, lim
                       WHERE lim.kind = k.kind AND lim.rate_max IS NOT NULL AND lim.rate_per_key AND s.kind = k.kind AND s.key = k.key
                         AND (s.reserved OR s.started_at > statement_timestamp() - lim.period)),
            'frees_in_ms', COALESCE(
                (SELECT ceil(extract(epoch FROM min(s.started_at + lim.period) - statement_timestamp()) * 1000)
                 FROM concurrency_starts s, lim
                 WHERE lim.kind = k.kind AND lim.rate_max IS NOT NULL AND lim.rate_per_key AND s.kind = k.kind
                   AND s.key = k.key AND NOT s.reserved AND s.started_at > statement_timestamp() - lim.period),
                (SELECT extract(epoch FROM lim.period) * 1000 FROM lim WHERE lim.kind = k.kind))::bigint))
        FROM keys k
        LEFT JOIN concurrency_key_lines kl ON kl.kind = k.kind AND kl.key = k.key
        -- The key's reserved slots, read once by its index: its oldest
        -- (the front), its newest max_steals, its oldest on its way
        -- (available), its newest max_steals with a reserved start too.
        -- Written as a max() or an ORDER BY job_id LIMIT 1 each, a plan made
        -- with the table analyzed small read concurrency_executions_pkey
        -- end to end for each, once per key (200 rows a probe in P10); an
        -- aggregate with filters cannot be read off the primary key's order.
        CROSS JOIN LATERAL (
            SELECT min(e.job_id) AS first_id,
                   (array_agg(e.job_id ORDER BY e.job_id DESC))[1:sqlc.arg(max_steals)::integer] AS last_ids,
                   min(e.job_id) FILTER (WHERE (SELECT o.state FROM river_job o WHERE o.id = e.job_id) = 'available') AS transit_id,
                   (array_agg(e.job_id ORDER BY e.job_id DESC)
                    FILTER (WHERE EXISTS (SELECT 1 FROM concurrency_starts s WHERE s.job_id = e.job_id AND s.reserved)))[1:sqlc.arg(max_steals)::integer] AS both_ids
            FROM concurrency_executions e
            WHERE e.kind = k.kind AND e.key = k.key AND e.reserved) AS r), '[]')
)::jsonb AS state;

-- name: LedgerRelease :exec
-- Frees slots, in a transaction that holds their kinds' locks (and, under
-- per-key limits alone, their keys' rows: LedgerLockKeys): those of
-- jobs that ended (job_ids, worker_id's own), those of jobs that gave up
-- waiting (forget_ids: worker_id's, or a grant not started yet; those
-- leave the waiters too, with their starts of this attempt), and moves
-- the slots handed over in memory (from_ids[i] to to_ids[i]: the slot row
-- of an ended job becomes the job's it was handed to, which leaves the
-- waiters; one that a grant reserved a slot for meanwhile keeps that one,
-- and the ended job's slot is freed instead). The counts follow: each
-- key's slots, and the kind's admitted where it is kept. A job rescued and
-- running on another worker keeps the slot of its new attempt when the old
-- attempt's worker releases late (the slot is worker_id's no more).
WITH pairs AS (
    SELECT p.from_id, p.to_id
    FROM (SELECT unnest(sqlc.arg(from_ids)::bigint[]) AS from_id, unnest(sqlc.arg(to_ids)::bigint[]) AS to_id) AS p
),
handed AS (
    UPDATE concurrency_executions e
    SET job_id = p.to_id, admitted_at = clock_timestamp()
    FROM pairs p
    WHERE e.job_id = p.from_id AND e.worker_id = sqlc.arg(worker_id)::text
      AND (SELECT x.job_id FROM concurrency_executions x WHERE x.job_id = p.to_id) IS NULL
    RETURNING e.job_id
),
granted AS (
    UPDATE concurrency_executions e
    SET reserved = false, worker_id = sqlc.arg(worker_id)::text, admitted_at = clock_timestamp()
    FROM pairs p
    WHERE e.job_id = p.to_id
    RETURNING e.job_id
),
freed AS (
    DELETE FROM concurrency_executions e
    WHERE (e.job_id = ANY(sqlc.arg(job_ids)::bigint[]) AND e.worker_id = sqlc.arg(worker_id)::text)
       OR (e.job_id = ANY(sqlc.arg(forget_ids)::bigint[]) AND (e.worker_id = sqlc.arg(worker_id)::text OR e.worker_id IS NULL))
       OR (e.job_id IN (SELECT p.from_id FROM pairs p) AND e.worker_id = sqlc.arg(worker_id)::text
           AND EXISTS (SELECT 1 FROM concurrency_executions x, pairs p2 WHERE p2.from_id = e.job_id AND x.job_id = p2.to_id))
    RETURNING e.kind, e.key
),
unwaited AS (
    DELETE FROM concurrency_waiters w
    WHERE w.job_id = ANY(sqlc.arg(forget_ids)::bigint[]) OR w.job_id IN (SELECT p.to_id FROM pairs p)
),
unstarted AS (
    -- A job forgotten never began: its starts of this attempt go (reserved,
    -- or logged at its decision or grant).
    DELETE FROM concurrency_starts s
    WHERE s.job_id = ANY(sqlc.arg(forget_ids)::bigint[])
      AND (s.reserved OR s.started_at >= (SELECT j.attempted_at FROM river_job j WHERE j.id = s.job_id))
),
per_key AS (
    SELECT f.kind, f.key, count(*)::integer AS n FROM freed f WHERE f.key IS NOT NULL GROUP BY f.kind, f.key
),
keys AS (
    UPDATE concurrency_key_lines kl
    SET slots = GREATEST(kl.slots - pk.n, 0)
    FROM per_key pk
    WHERE kl.kind = pk.kind AND kl.key = pk.key AND (kl.slots > pk.n OR kl.waiting)
),
idle_keys AS (
    -- A key left with no slot and nothing waiting has no row.
    DELETE FROM concurrency_key_lines kl
    USING per_key pk
    WHERE kl.kind = pk.kind AND kl.key = pk.key AND kl.slots <= pk.n AND NOT kl.waiting
)
UPDATE concurrency_limits l
SET admitted = GREATEST(l.admitted - pk.n, 0)
FROM (SELECT f.kind, count(*)::integer AS n FROM freed f GROUP BY f.kind) pk
WHERE l.kind = pk.kind AND l.admitted IS NOT NULL;

-- name: LedgerGrantState :one
-- What a grant round of kinds reads, as one JSON document: per kind, its
-- limits and counts, its rate window, and the front of its line: for a
-- kind without a partition, its oldest waiting jobs (depth of them); for a
-- partitioned kind, per key (the keys named in step with key_kinds, or,
-- for a kind whose limits need one view of its keys, the keys with
-- waiting jobs in the round's order, up to turn_keys, each marked turn,
-- and whether more wait past them: turn_more) its slots, its
-- oldest slot or start reserved for a job on its way (no job of the key
-- waiting in a worker is granted past it), its rate window, its oldest
-- waiting jobs (key_depth of them: twice the key's limit and 8, at most
-- depth, since a round gives a key at most its limit and resumes at most
-- its limit ahead; reading 64 of each key cost 1 ms a key with 20,000
-- parked over 100 keys), and how many of its jobs wait unparked (others);
-- the keys in the round's order, the one that began waiting for its turn
-- longest ago first (since_us: its last turn, or, never served, its
-- arrival), with when the key last had a turn (served_us). kind_waiting
-- is read only where the round uses it (a partitioned kind with parked
-- jobs). A front job is a waiter without a grant (waiting in
-- a worker, or resumed ahead and not fetched yet: no worker), a parked
-- job, or a job fetched by a worker and not decided yet (marked by its
-- fetch within the last two seconds, still running; never ready), with
-- whether it is ready (a parked job still completing its parking, unless
-- it is more than 5 s late, and a job not decided yet hold up the younger
-- ones; a job resumed ahead still stepping back from its worker, marked
-- and running, is ready: its slot is reserved for it as River's
-- completion makes it available, and its key keeps its turn),
-- resumable (pending) and, for a key's parked job, completing (its
-- parking marked in its worker, not written by River's completer yet, and
-- not late: a grant may be reserved for it, see LedgerGrantParked).
WITH lim AS (
    SELECT l.kind, l.max_concurrency, l.admitted, l.has_parked, l.partition_fields AS fields, l.key_max, l.rate_max,
           COALESCE(l.rate_period, interval '0') AS period, l.rate_per_key,
           CASE WHEN l.key_max > 0 THEN LEAST(sqlc.arg(depth)::integer, 2 * l.key_max + 8) ELSE sqlc.arg(depth)::integer END AS key_depth
    FROM concurrency_limits l
    WHERE l.kind = ANY(sqlc.arg(kinds)::text[])
),
named AS (
    SELECT DISTINCT n.kind, n.key FROM (SELECT unnest(sqlc.arg(key_kinds)::text[]) AS kind, unnest(sqlc.arg(keys)::text[]) AS key) AS n
),
turn AS (
    -- The keys with waiting jobs in the round's order, one past turn_keys
    -- (that one tells the round that it read the order in part).
    SELECT lim.kind, t.key, t.n FROM lim
    CROSS JOIN LATERAL (
        SELECT kl.key, row_number() OVER (ORDER BY COALESCE(kl.served_at, kl.arrived_at), kl.key) AS n
        FROM concurrency_key_lines kl
        WHERE kl.kind = lim.kind AND kl.waiting
        ORDER BY COALESCE(kl.served_at, kl.arrived_at), kl.key
        LIMIT sqlc.arg(turn_keys)::integer + 1
    ) t
    WHERE lim.fields IS NOT NULL
      AND (lim.kind = ANY(sqlc.arg(full_kinds)::text[])
           OR NOT (lim.max_concurrency = 0 AND (lim.rate_max IS NULL OR lim.rate_per_key)))
),
keys AS (
    SELECT k.kind, k.key, bool_or(k.turn) AS turn FROM (
        SELECT lim.kind, n.key, false AS turn FROM lim JOIN named n ON n.kind = lim.kind
        WHERE lim.fields IS NOT NULL
        UNION ALL
        SELECT t.kind, t.key, true FROM turn t WHERE t.n <= sqlc.arg(turn_keys)::integer
    ) k
    GROUP BY k.kind, k.key
)
SELECT jsonb_build_object('kinds', COALESCE(jsonb_agg(jsonb_build_object(
    'kind', lim.kind, 'max', lim.max_concurrency, 'admitted', lim.admitted, 'has_parked', lim.has_parked,
    'fields', lim.fields, 'key_max', lim.key_max, 'rate_max', lim.rate_max,
    'rate_period_ms', (extract(epoch FROM lim.period) * 1000)::bigint, 'rate_per_key', lim.rate_per_key,
    'key_depth', lim.key_depth,
    'turn_more', EXISTS (SELECT 1 FROM turn t WHERE t.kind = lim.kind AND t.n > sqlc.arg(turn_keys)::integer),
    'starts', (SELECT count(*) FROM concurrency_starts s
               WHERE lim.rate_max IS NOT NULL AND NOT lim.rate_per_key AND s.kind = lim.kind
                 AND (s.reserved OR s.started_at > statement_timestamp() - lim.period)),
    'frees_in_ms', (SELECT COALESCE(ceil(extract(epoch FROM min(s.started_at) + lim.period - statement_timestamp()) * 1000),
                                    extract(epoch FROM lim.period) * 1000)::bigint
                    FROM concurrency_starts s
                    WHERE lim.rate_max IS NOT NULL AND NOT lim.rate_per_key AND s.kind = lim.kind AND NOT s.reserved
                      AND s.started_at > statement_timestamp() - lim.period),
    'oldest_reserved', (SELECT min(x.job_id) FROM (
                            SELECT e.job_id FROM concurrency_executions e
                            WHERE lim.fields IS NULL AND e.kind = lim.kind AND e.reserved AND e.key IS NULL
                            UNION ALL
                            SELECT s.job_id FROM concurrency_starts s
                            WHERE lim.fields IS NULL AND s.kind = lim.kind AND s.reserved AND s.key IS NULL) x),
    'kind_waiting', lim.has_parked AND lim.fields IS NOT NULL
                    AND (EXISTS (SELECT 1 FROM concurrency_parked_jobs p
                                 WHERE p.kind = lim.kind AND p.reason NOT IN ('key_limit', 'key_fifo', 'key_rate'))
                         OR EXISTS (SELECT 1 FROM concurrency_waiters w
                                    WHERE w.kind = lim.kind AND w.reason NOT IN ('key_limit', 'key_fifo', 'key_rate')
                                      AND (SELECT e.job_id FROM concurrency_executions e WHERE e.job_id = w.job_id) IS NULL)),
    'ahead', (SELECT count(*) FROM concurrency_waiters w
              JOIN river_job j ON j.id = w.job_id AND (j.state IN ('running', 'available')) IS TRUE
              WHERE w.kind = lim.kind AND w.ahead
                AND (SELECT e.job_id FROM concurrency_executions e WHERE e.job_id = w.job_id) IS NULL),
    'front', CASE WHEN lim.fields IS NULL THEN (
        SELECT COALESCE(jsonb_agg(to_jsonb(f) ORDER BY f.job_id), '[]') FROM (
            SELECT x.* FROM (
                (SELECT p.job_id, true AS parked, NULL::text AS worker_id,
                        (j.state = 'pending' OR p.parked_at < now() - interval '5 seconds') AS ready,
                        (j.state = 'pending') AS resumable, j.queue, p.reason, p.ahead
                 FROM concurrency_parked_jobs p JOIN river_job j ON j.id = p.job_id
                 WHERE p.kind = lim.kind AND p.key IS NULL
                 ORDER BY p.job_id LIMIT sqlc.arg(depth)::integer)
                UNION ALL
                (SELECT w.job_id, false, w.worker_id,
                        (w.worker_id IS NOT NULL OR j.state = 'available' OR j.metadata->>'sluice_park' = 'ahead'),
                        true, j.queue, w.reason, w.ahead
                 FROM concurrency_waiters w
                 JOIN river_job j ON j.id = w.job_id AND (j.state = 'running' OR (w.worker_id IS NULL AND j.state = 'available'))
                 WHERE w.kind = lim.kind AND w.key IS NULL
                   AND (SELECT e.job_id FROM concurrency_executions e WHERE e.job_id = w.job_id) IS NULL
                 ORDER BY w.job_id LIMIT sqlc.arg(depth)::integer)
                UNION ALL
                (SELECT f.job_id, false, f.worker_id, false, false, j.queue, 'fetched', false
                 FROM concurrency_fetches f JOIN river_job j ON j.id = f.job_id AND (j.state = 'running') IS TRUE
                 WHERE f.kind = lim.kind AND f.key IS NULL AND f.fetched_at > statement_timestamp() - interval '2 seconds'
                   AND (SELECT w.job_id FROM concurrency_waiters w WHERE w.job_id = f.job_id) IS NULL
                   AND (SELECT e.job_id FROM concurrency_executions e WHERE e.job_id = f.job_id) IS NULL
                 ORDER BY f.job_id LIMIT sqlc.arg(depth)::integer)
                UNION ALL
                -- waiting in a worker for a leased slot, published: a job
                -- of the line, not granted past them
                (SELECT u.job_id, false, cl.worker_id, false, false, j.queue, 'fetched', false
                 FROM concurrency_leases cl CROSS JOIN LATERAL unnest(cl.waiting) AS u(job_id)
                 JOIN river_job j ON j.id = u.job_id AND (j.state = 'running') IS TRUE
                 WHERE cl.kind = lim.kind
                   AND (SELECT w.job_id FROM concurrency_waiters w WHERE w.job_id = u.job_id) IS NULL
                   AND (SELECT e.job_id FROM concurrency_executions e WHERE e.job_id = u.job_id) IS NULL
                 ORDER BY u.job_id LIMIT sqlc.arg(depth)::integer)
            ) x ORDER BY x.job_id LIMIT sqlc.arg(depth)::integer
        ) f) END,
    'keys', (SELECT COALESCE(jsonb_agg(jsonb_build_object(
        'key', k.key,
        'turn', k.turn,
        'slots', COALESCE(kl.slots, 0),
        'since_us', (extract(epoch FROM COALESCE(kl.served_at, kl.arrived_at)) * 1000000)::bigint,
        'served_us', (extract(epoch FROM kl.served_at) * 1000000)::bigint,
        'oldest_reserved', (SELECT min(x.job_id) FROM (
                                SELECT e.job_id FROM concurrency_executions e
                                WHERE e.kind = k.kind AND e.key = k.key AND e.reserved
                                UNION ALL
                                SELECT s.job_id FROM concurrency_starts s
                                WHERE s.kind = k.kind AND s.key = k.key AND s.reserved) x),
        'starts', (SELECT count(*) FROM concurrency_starts s
                   WHERE lim.rate_max IS NOT NULL AND lim.rate_per_key AND s.kind = k.kind AND s.key = k.key
                     AND (s.reserved OR s.started_at > statement_timestamp() - lim.period)),
        'frees_in_ms', (SELECT COALESCE(ceil(extract(epoch FROM min(s.started_at) + lim.period - statement_timestamp()) * 1000),
                                        extract(epoch FROM lim.period) * 1000)::bigint
                        FROM concurrency_starts s
                        WHERE lim.rate_max IS NOT NULL AND lim.rate_per_key AND s.kind = k.kind AND s.key = k.key
                          AND NOT s.reserved AND s.started_at > statement_timestamp() - lim.period)
    ) || (
        -- The key's front: its oldest key_depth jobs (the round gives a key
        -- at most its limit, and resumes ahead at most its limit more),
        -- and how many of its jobs wait without being parked (waiting in a
        -- worker, resumed ahead, or fetched and not decided: they take the
        -- key's lookahead first, wherever they stand in its line).
        SELECT jsonb_build_object(
            'front', COALESCE(jsonb_agg(to_jsonb(f) - 'n' ORDER BY f.job_id) FILTER (WHERE f.n <= lim.key_depth), '[]'),
            'others', count(*) FILTER (WHERE NOT f.parked))
        FROM (
            SELECT x.*, row_number() OVER (ORDER BY x.job_id) AS n FROM (
                (SELECT p.job_id, true AS parked, NULL::text AS worker_id,
                        (j.state = 'pending' OR p.parked_at < now() - interval '5 seconds') AS ready,
                        (j.state = 'pending') AS resumable, j.queue, p.reason, p.ahead,
                        (j.state = 'running' AND j.metadata->>'sluice_park' = 'true'
                         AND p.parked_at >= now() - interval '5 seconds') AS completing
                 FROM concurrency_parked_jobs p JOIN river_job j ON j.id = p.job_id
                 WHERE p.kind = k.kind AND p.key = k.key
                 ORDER BY p.job_id LIMIT lim.key_depth)
                UNION ALL
                (SELECT w.job_id, false, w.worker_id,
                        (w.worker_id IS NOT NULL OR j.state = 'available' OR j.metadata->>'sluice_park' = 'ahead'),
                        true, j.queue, w.reason, w.ahead, false
                 FROM concurrency_waiters w
                 JOIN river_job j ON j.id = w.job_id AND (j.state = 'running' OR (w.worker_id IS NULL AND j.state = 'available'))
                 WHERE w.kind = k.kind AND w.key = k.key
                   AND (SELECT e.job_id FROM concurrency_executions e WHERE e.job_id = w.job_id) IS NULL)
                UNION ALL
                (SELECT f.job_id, false, f.worker_id, false, false, j.queue, 'fetched', false, false
                 FROM concurrency_fetches f JOIN river_job j ON j.id = f.job_id AND (j.state = 'running') IS TRUE
                 WHERE f.kind = k.kind AND f.key = k.key AND f.fetched_at > statement_timestamp() - interval '2 seconds' AND NOT f.leased
                   AND (SELECT w.job_id FROM concurrency_waiters w WHERE w.job_id = f.job_id) IS NULL
                   AND (SELECT e.job_id FROM concurrency_executions e WHERE e.job_id = f.job_id) IS NULL)
            ) x
        ) f)
    ORDER BY COALESCE(kl.served_at, kl.arrived_at), k.key), '[]')
      FROM keys k LEFT JOIN concurrency_key_lines kl ON kl.kind = k.kind AND kl.key = k.key
      WHERE k.kind = lim.kind)
)), '[]'))::jsonb AS state
FROM lim;

-- name: LedgerInsertSlots :exec
-- Writes slots taken or granted (job_ids, kinds and keys in step; key ''
-- for none): taken by a job of worker_id, or granted to one (worker_ids in
-- step: the worker a job waits in, '' for a job resumed and not fetched,
-- whose slot is reserved until it is). A job that still had a row (a stale
-- one of an earlier attempt) keeps it, made the new slot's.
INSERT INTO concurrency_executions (job_id, kind, worker_id, reserved, key, admitted_at)
SELECT r.job_id, r.kind, NULLIF(r.worker_id, ''), r.worker_id = '', NULLIF(r.key, ''), clock_timestamp()
FROM (SELECT unnest(sqlc.arg(job_ids)::bigint[]) AS job_id, unnest(sqlc.arg(kinds)::text[]) AS kind, unnest(sqlc.arg(keys)::text[]) AS key, unnest(sqlc.arg(worker_ids)::text[]) AS worker_id) AS r
ON CONFLICT (job_id) DO UPDATE
SET worker_id = EXCLUDED.worker_id, reserved = EXCLUDED.reserved, admitted_at = clock_timestamp(), key = EXCLUDED.key;

-- name: LedgerClaimSlots :exec
-- Jobs of worker_id take the slots and starts reserved for them (granted
-- while they were resumed), as their own, started now.
WITH slots AS (
    UPDATE concurrency_executions e
    SET reserved = false, worker_id = sqlc.arg(worker_id)::text, admitted_at = clock_timestamp()
    WHERE e.job_id = ANY(sqlc.arg(job_ids)::bigint[]) AND e.reserved
)
UPDATE concurrency_starts s
SET reserved = false, started_at = clock_timestamp()
WHERE s.job_id = ANY(sqlc.arg(job_ids)::bigint[]) AND s.reserved;

-- name: LedgerCount :exec
-- Adds to the counts of kinds (kinds, admitted and has_parked in step: the
-- slots added to admitted, where it is kept; has_parked: -1 as it is, 0
-- false, 1 true) and of their keys (key_kinds, keys, key_slots,
-- key_waiting and key_served in step: the slots added; whether jobs of the
-- key wait, -1 as it is; served: the key was granted now, and its turn
-- moves to the end of the round). Keys with neither slots nor waiting jobs
-- lose their row.
WITH kinds AS (
    UPDATE concurrency_limits l
    SET admitted = CASE WHEN l.admitted IS NULL THEN NULL ELSE GREATEST(l.admitted + c.admitted, 0) END,
        has_parked = CASE c.has_parked WHEN -1 THEN l.has_parked ELSE c.has_parked = 1 END
    FROM (SELECT unnest(sqlc.arg(kinds)::text[]) AS kind, unnest(sqlc.arg(admitted)::integer[]) AS admitted,
                 unnest(sqlc.arg(has_parked)::integer[]) AS has_parked) AS c
    WHERE l.kind = c.kind
),
src AS (
    SELECT unnest(sqlc.arg(key_kinds)::text[]) AS kind, unnest(sqlc.arg(keys)::text[]) AS key,
           unnest(sqlc.arg(key_slots)::integer[]) AS slots, unnest(sqlc.arg(key_waiting)::integer[]) AS waiting,
           unnest(sqlc.arg(key_served)::boolean[]) AS served
),
upd AS (
    UPDATE concurrency_key_lines kl
    SET slots = GREATEST(kl.slots + s.slots, 0),
        waiting = CASE s.waiting WHEN -1 THEN kl.waiting ELSE s.waiting = 1 END,
        served_at = CASE WHEN s.served THEN clock_timestamp() ELSE kl.served_at END
    FROM src s
    WHERE kl.kind = s.kind AND kl.key = s.key
    RETURNING kl.kind, kl.key, kl.slots, kl.waiting
),
ins AS (
    INSERT INTO concurrency_key_lines (kind, key, slots, waiting, served_at)
    SELECT s.kind, s.key, GREATEST(s.slots, 0), s.waiting = 1, CASE WHEN s.served THEN clock_timestamp() END
    FROM src s
    WHERE NOT EXISTS (SELECT 1 FROM concurrency_key_lines kl WHERE kl.kind = s.kind AND kl.key = s.key)
      AND (s.slots > 0 OR s.waiting = 1)
    ON CONFLICT (kind, key) DO NOTHING
)
DELETE FROM concurrency_key_lines d
USING upd u
WHERE d.kind = u.kind AND d.key = u.key AND u.slots = 0 AND NOT u.waiting;

-- name: LedgerParkFetched :exec
-- Parks in place, at once, jobs a worker fetched and never handed to
-- River's executors (job_ids, with their kinds, keys and reasons in step;
-- key '' for none): each goes back to pending with its fetch undone
-- (attempt, attempted_by; attempted_at cleared with a first attempt), its
-- parking recorded in its metadata and in concurrency_parked_jobs. None
-- ran, and River will never complete them: there is no completion to race
-- with. A job whose cancellation was asked meanwhile is cancelled instead
-- (it never ran).
WITH p AS (
    SELECT r.job_id, r.kind, r.key, r.reason
    FROM (SELECT unnest(sqlc.arg(job_ids)::bigint[]) AS job_id, unnest(sqlc.arg(kinds)::text[]) AS kind, unnest(sqlc.arg(keys)::text[]) AS key, unnest(sqlc.arg(reasons)::text[]) AS reason) AS r
),
moved AS (
    UPDATE river_job j
    SET state = CASE WHEN j.metadata ? 'cancel_attempted_at' THEN 'cancelled'::river_job_state ELSE 'pending'::river_job_state END,
        finalized_at = CASE WHEN j.metadata ? 'cancel_attempted_at' THEN now() END,
        attempt = GREATEST(j.attempt - 1, 0),
        attempted_by = j.attempted_by[1:GREATEST(COALESCE(array_length(j.attempted_by, 1), 0) - 1, 0)],
        attempted_at = CASE WHEN j.attempt <= 1 THEN NULL ELSE j.attempted_at END,
        metadata = CASE WHEN j.metadata ? 'cancel_attempted_at' THEN j.metadata
                   ELSE j.metadata || jsonb_build_object('sluice_parking',
                       COALESCE(CASE WHEN (j.metadata->'sluice_parking'->>'attempt')::integer = GREATEST(j.attempt - 1, 0)
                                     THEN j.metadata->'sluice_parking' END,
                                jsonb_build_object('attempt', GREATEST(j.attempt - 1, 0), 'first_at', now(), 'parks', 0))
                       || jsonb_build_object('parked_at', now(), 'reason', p.reason,
                                             'parks', COALESCE((j.metadata->'sluice_parking'->>'parks')::integer, 0) + 1))
                   END
    FROM p
    WHERE j.id = p.job_id AND j.state = 'running'
    RETURNING j.id, j.state
),
unwaited AS (
    DELETE FROM concurrency_waiters w WHERE w.job_id IN (SELECT m.id FROM moved m)
)
INSERT INTO concurrency_parked_jobs (job_id, kind, reason, worker_id, key)
SELECT p.job_id, p.kind, p.reason, sqlc.arg(worker_id)::text, NULLIF(p.key, '')
FROM p JOIN moved m ON m.id = p.job_id AND m.state = 'pending'
ON CONFLICT (job_id) DO NOTHING;

-- name: LedgerWait :exec
-- Jobs wait in the line (job_ids, keys and reasons in step; key '' for
-- none): in worker_id, for a grant, or without a worker when resumed ahead
-- (worker_id ''). A job already in the line keeps its place, its first
-- since, and whether it came ahead.
INSERT INTO concurrency_waiters (job_id, kind, key, worker_id, reason, ahead)
SELECT r.job_id, sqlc.arg(kind), NULLIF(r.key, ''), NULLIF(sqlc.arg(worker_id)::text, ''), r.reason,
       sqlc.arg(worker_id)::text = ''
FROM (SELECT unnest(sqlc.arg(job_ids)::bigint[]) AS job_id, unnest(sqlc.arg(keys)::text[]) AS key, unnest(sqlc.arg(reasons)::text[]) AS reason) AS r
ON CONFLICT (job_id) DO UPDATE
SET worker_id = EXCLUDED.worker_id, reason = EXCLUDED.reason, key = EXCLUDED.key;

-- name: LedgerParkDispatched :exec
-- Parks running jobs that River's executors have (job_ids, with their
-- kinds, keys, reasons and attempts in step; key '' for none): each is
-- marked for parking (metadata key sluice_park), so that River's completion
-- of it turns it into a pending job with its attempt undone (trigger
-- sluice_park_in_place), its parking recorded, and it leaves the waiters.
-- A job no longer running this attempt (rescued meanwhile) is left alone.
WITH p AS (
    SELECT unnest(sqlc.arg(job_ids)::bigint[]) AS job_id, unnest(sqlc.arg(kinds)::text[]) AS kind,
           unnest(sqlc.arg(keys)::text[]) AS key, unnest(sqlc.arg(reasons)::text[]) AS reason,
           unnest(sqlc.arg(attempts)::integer[]) AS attempt
),
marked AS (
    UPDATE river_job j
    SET metadata = j.metadata || '{"sluice_park": true}'::jsonb
    FROM p
    WHERE j.id = p.job_id AND j.attempt = p.attempt AND j.state = 'running'
    RETURNING j.id
),
unwaited AS (
    DELETE FROM concurrency_waiters w WHERE w.job_id IN (SELECT m.id FROM marked m)
)
INSERT INTO concurrency_parked_jobs (job_id, kind, reason, worker_id, key, ahead)
SELECT p.job_id, p.kind, p.reason, sqlc.arg(worker_id)::text, NULLIF(p.key, ''),
       COALESCE((SELECT w.ahead FROM concurrency_waiters w WHERE w.job_id = p.job_id), false)
FROM p JOIN marked m ON m.id = p.job_id
ON CONFLICT (job_id) DO NOTHING;

-- name: LedgerStarts :exec
-- Logs starts of kind now, by the database's clock (job_ids and keys in
-- step; key '': none), reserved for granted jobs that have not started yet
-- or not.
INSERT INTO concurrency_starts (kind, key, job_id, started_at, reserved)
SELECT sqlc.arg(kind), NULLIF(r.key, ''), r.job_id, clock_timestamp(), sqlc.arg(reserved)::boolean
FROM (SELECT unnest(sqlc.arg(job_ids)::bigint[]) AS job_id, unnest(sqlc.arg(keys)::text[]) AS key) AS r;

-- name: LedgerUnwait :exec
-- Takes jobs out of the line's waiters (they start, or have gone).
DELETE FROM concurrency_waiters WHERE job_id = ANY(sqlc.arg(job_ids)::bigint[]);

-- name: LedgerGrantParked :exec
-- Grants slots to parked jobs at the front of kind's line (job_ids and
-- keys in step; key '' for none): each still pending is resumed (made
-- available; its parking record goes with it, trigger sluice_unpark) with
-- a slot reserved for it (and a start, under a rate: with_start), claimed
-- when a worker fetches it; the counts follow (the key's slots, the
-- kind's admitted where it is kept), and the River producers of their
-- queues are woken (River's insert notification, as NotifyRiverInsert
-- sends it). A job whose parking River's completer has not written yet
-- (running, marked sluice_park) gets its slot reserved too, and is marked
-- "granted": its completion parks it and resumes it at once (trigger
-- sluice_step_back, which wakes its producer). A job in neither state, or
-- locked by another transaction (a River client call on it, or River's
-- completer writing its parking), is left alone. A job resumed so is due
-- since its insert (scheduled_at no later than created_at: it was due when
-- it was fetched and parked): River fetches by (priority, scheduled_at,
-- id), and a job of the line granted after a retry or a snooze (a later
-- scheduled_at) would otherwise be fetched after the younger jobs of its
-- line granted with it, which then start first (seed 395970325).
WITH p AS (
    SELECT unnest(sqlc.arg(job_ids)::bigint[]) AS job_id, unnest(sqlc.arg(keys)::text[]) AS key
),
resumed AS (
    UPDATE river_job j
    SET state = CASE WHEN j.state = 'pending' THEN 'available' ELSE j.state END,
        scheduled_at = CASE WHEN j.state = 'pending' THEN LEAST(j.scheduled_at, j.created_at) ELSE j.scheduled_at END,
        metadata = CASE WHEN j.state = 'running' THEN j.metadata || '{"sluice_park": "granted"}'::jsonb ELSE j.metadata END
    WHERE j.id IN (SELECT r.id FROM river_job r
                   WHERE r.id = ANY(sqlc.arg(job_ids)::bigint[])
                     AND (r.state = 'pending' OR (r.state = 'running' AND r.metadata->>'sluice_park' = 'true'))
                   ORDER BY r.id
                   FOR UPDATE SKIP LOCKED)
    RETURNING j.id, j.queue, j.state
),
slots AS (
    INSERT INTO concurrency_executions (job_id, kind, worker_id, reserved, key, admitted_at)
    SELECT r.id, sqlc.arg(kind), NULL, true, NULLIF(p.key, ''), clock_timestamp()
    FROM resumed r JOIN p ON p.job_id = r.id
    WHERE sqlc.arg(with_slot)::boolean
    ON CONFLICT (job_id) DO UPDATE SET worker_id = NULL, reserved = true, admitted_at = clock_timestamp(), key = EXCLUDED.key
    RETURNING job_id, key, (xmax::text = '0')::boolean AS inserted
),
starts AS (
    INSERT INTO concurrency_starts (kind, key, job_id, started_at, reserved)
    SELECT sqlc.arg(kind), NULLIF(p.key, ''), r.id, clock_timestamp(), true
    FROM resumed r JOIN p ON p.job_id = r.id
    WHERE sqlc.arg(with_start)::boolean
),
keyed AS (
    UPDATE concurrency_key_lines kl
    SET slots = kl.slots + s.n, served_at = clock_timestamp()
    FROM (SELECT key, count(*)::integer AS n FROM slots WHERE inserted AND key IS NOT NULL GROUP BY key) s
    WHERE kl.kind = sqlc.arg(kind) AND kl.key = s.key
),
counted AS (
    UPDATE concurrency_limits l
    SET admitted = l.admitted + (SELECT count(*) FROM slots WHERE inserted)::integer
    WHERE l.kind = sqlc.arg(kind) AND l.admitted IS NOT NULL
)
SELECT pg_notify(COALESCE(NULLIF(current_setting('sluice.river_schema', true), ''), current_schema()) || '.river_insert',
                 json_build_object('queue', q.queue)::text)
FROM (SELECT DISTINCT queue FROM resumed WHERE state = 'available') q;

-- name: LedgerResumeAhead :exec
-- Resumes parked jobs of kind ahead of a free slot (job_ids, keys and
-- reasons in step; key '' for none): each still pending is made available
-- (its parking record goes with it) and waits in the line without a worker
-- (a waiter resumed ahead), keeping its place: the worker that fetches it
-- records it as waiting in it, and a grant gives it the next slot. The
-- River producers of their queues are woken.
WITH p AS (
    SELECT unnest(sqlc.arg(job_ids)::bigint[]) AS job_id, unnest(sqlc.arg(keys)::text[]) AS key,
           unnest(sqlc.arg(reasons)::text[]) AS reason
),
resumed AS (
    UPDATE river_job j
    SET state = 'available', scheduled_at = LEAST(j.scheduled_at, j.created_at) -- (as LedgerGrantParked)
    WHERE j.id IN (SELECT r.id FROM river_job r
                   WHERE r.id = ANY(sqlc.arg(job_ids)::bigint[]) AND r.state = 'pending'
                   ORDER BY r.id
                   FOR UPDATE SKIP LOCKED)
    RETURNING j.id, j.queue
),
waiting AS (
    INSERT INTO concurrency_waiters (job_id, kind, key, worker_id, reason, ahead)
    SELECT r.id, sqlc.arg(kind), NULLIF(p.key, ''), NULL, p.reason, true
    FROM resumed r JOIN p ON p.job_id = r.id
    ON CONFLICT (job_id) DO UPDATE SET worker_id = NULL, ahead = true
)
SELECT pg_notify(COALESCE(NULLIF(current_setting('sluice.river_schema', true), ''), current_schema()) || '.river_insert',
                 json_build_object('queue', q.queue)::text)
FROM (SELECT DISTINCT queue FROM resumed) q;

-- name: LedgerLease :one
-- Leases up to want more slots of kind to worker_id (under the kind's
-- lock), as many as are free, none while the kind is off the leased path:
-- its limit not positive, jobs of its line waiting (they go first), slots
-- reserved for resumed jobs (they claim them first), or a per-key or rate
-- limit. A worker that gets fewer than it asked for is marked as wanting,
-- which makes the other holders keep to a fair share. Returns the slots
-- granted and whether the kind is off the leased path.
WITH lim AS (
    SELECT l.kind, l.max_concurrency, COALESCE(l.admitted, 0) AS admitted,
           (l.has_parked OR l.partition_fields IS NOT NULL OR l.rate_max IS NOT NULL
            OR EXISTS (SELECT 1 FROM concurrency_executions e WHERE e.kind = l.kind AND e.reserved)) AS off_path
    FROM concurrency_limits l
    WHERE l.kind = sqlc.arg(kind)
),
g AS (
    SELECT CASE WHEN lim.max_concurrency <= 0 OR lim.off_path THEN 0
                ELSE LEAST(sqlc.arg(want)::integer, GREATEST(lim.max_concurrency - lim.admitted, 0)) END AS n
    FROM lim
),
leased AS (
    INSERT INTO concurrency_leases AS cl (kind, worker_id, slots, wanted_at, renewed_at)
    SELECT sqlc.arg(kind), sqlc.arg(worker_id)::text, g.n, CASE WHEN g.n < sqlc.arg(want)::integer THEN now() END, now()
    FROM g
    ON CONFLICT (kind, worker_id) DO UPDATE
    SET slots = cl.slots + EXCLUDED.slots, wanted_at = COALESCE(EXCLUDED.wanted_at, cl.wanted_at), renewed_at = now()
),
counted AS (
    UPDATE concurrency_limits l
    SET admitted = l.admitted + g.n
    FROM g
    WHERE l.kind = sqlc.arg(kind) AND g.n > 0
)
SELECT g.n::integer AS granted, lim.max_concurrency, lim.off_path::boolean AS off_path
FROM g, lim;

-- name: LedgerReturnLease :one
-- Gives back up to n slots of kind leased to worker_id (under the kind's
-- lock; no more than it holds: a lease the reaper already freed gives back
-- nothing), and returns how many went back.
WITH old AS (
    SELECT cl.slots FROM concurrency_leases cl
    WHERE cl.kind = sqlc.arg(kind) AND cl.worker_id = sqlc.arg(worker_id)::text
),
back AS (
    UPDATE concurrency_leases cl
    SET slots = cl.slots - LEAST(sqlc.arg(n)::integer, old.slots), renewed_at = now()
    FROM old
    WHERE cl.kind = sqlc.arg(kind) AND cl.worker_id = sqlc.arg(worker_id)::text
    RETURNING LEAST(sqlc.arg(n)::integer, old.slots) AS n
),
counted AS (
    UPDATE concurrency_limits l
    SET admitted = GREATEST(l.admitted - back.n, 0)
    FROM back
    WHERE l.kind = sqlc.arg(kind) AND l.admitted IS NOT NULL
)
SELECT COALESCE((SELECT back.n FROM back), 0)::integer AS returned;

-- name: LedgerLeaseState :one
-- A leased kind as a worker holding or wanting its slots sees it, without
-- a lock: its limit, the slots taken, whether it is off the leased path
-- (jobs of its line waiting, slots reserved for resumed jobs, a per-key or
-- rate limit), whether it has a per-key or rate limit (keyed), the slots this worker's lease holds, how many other workers
-- hold slots or asked for some within wanted_window_ms (they share the
-- limit fairly), and when the oldest job waiting in another worker for a
-- leased slot (published, or marked leased by its fetch and not published
-- yet), or fetched there and not decided yet (marked for the line: that
-- worker's leased path was closed; or a fetch in flight for more than
-- in_flight_ms, by its start: its marks are not committed yet), was
-- fetched (9999-12-31: none), which
-- goes before this worker's younger jobs; and, for the hand-over of a
-- freed slot in memory, its oldest parked job, its oldest job granted a
-- slot not claimed yet and its oldest job resumed ahead and not fetched
-- yet (0: none), which go before any younger job, and when the oldest job
-- waiting in its line in another worker was fetched (9999-12-31: none):
-- with oldest_other (the jobs fetched there and not decided yet, or
-- waiting there for a leased slot, as the line's decisions and grant
-- rounds count them too), it goes before a job fetched more than the
-- fetch tolerance after it (ledger.LeaseState.OldestOtherLine).
SELECT l.max_concurrency, COALESCE(l.admitted, 0)::integer AS admitted,
       (l.has_parked OR l.partition_fields IS NOT NULL OR l.rate_max IS NOT NULL
        OR EXISTS (SELECT 1 FROM concurrency_executions e WHERE e.kind = l.kind AND e.reserved))::boolean AS off_path,
       (l.partition_fields IS NOT NULL OR l.rate_max IS NOT NULL)::boolean AS keyed,
       COALESCE((SELECT cl.slots FROM concurrency_leases cl
                 WHERE cl.kind = l.kind AND cl.worker_id = sqlc.arg(worker_id)::text), 0)::integer AS own,
       (SELECT count(*) FROM concurrency_leases cl
        WHERE cl.kind = l.kind AND cl.worker_id <> sqlc.arg(worker_id)::text
          AND (cl.slots > 0 OR cl.wanted_at > now() - make_interval(secs => sqlc.arg(wanted_window_ms)::bigint / 1000.0)))::integer AS others,
       COALESCE(LEAST((SELECT min(j.attempted_at) FROM concurrency_leases cl
                       CROSS JOIN LATERAL unnest(cl.waiting) AS u(job_id)
                       JOIN river_job j ON j.id = u.job_id AND (j.state = 'running') IS TRUE
                       WHERE cl.kind = l.kind AND cl.worker_id <> sqlc.arg(worker_id)::text),
                      (SELECT min(f.fetched_at) FROM concurrency_fetches f JOIN river_job j ON j.id = f.job_id AND (j.state = 'running') IS TRUE
                       WHERE f.kind = l.kind AND f.worker_id <> sqlc.arg(worker_id)::text
                         AND f.fetched_at > statement_timestamp() - interval '2 seconds'),
                      -- a fetch in flight (LedgerFetching) for more than
                      -- in_flight_ms, begun within 2 seconds, of another
                      -- connection: it may hold jobs of the kind, marked at
                      -- its start (fetched_at is now()) once it commits
                      (SELECT min(a.xact_start) FROM pg_catalog.pg_locks lk JOIN pg_catalog.pg_stat_activity a ON a.pid = lk.pid
                       WHERE lk.locktype = 'advisory' AND lk.granted AND lk.objsubid = 1 AND lk.pid <> pg_backend_pid()
                         AND lk.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = current_database())
                         AND ((lk.classid::bigint << 32) | lk.objid::bigint) = hashtextextended('sluice.fetching', 0)
                         AND a.xact_start < statement_timestamp() - make_interval(secs => sqlc.arg(in_flight_ms)::bigint / 1000.0)
                         AND a.xact_start > statement_timestamp() - interval '2 seconds')),
                '9999-12-31'::timestamptz)::timestamptz AS oldest_other,
       COALESCE((SELECT min(p.job_id) FROM concurrency_parked_jobs p WHERE p.kind = l.kind), 0)::bigint AS oldest_parked,
       COALESCE((SELECT min(e.job_id) FROM concurrency_executions e WHERE e.kind = l.kind AND e.reserved), 0)::bigint AS oldest_reserved,
       COALESCE((SELECT min(w.job_id) FROM concurrency_waiters w
                 WHERE w.kind = l.kind AND w.worker_id IS NULL
                   AND (SELECT e.job_id FROM concurrency_executions e WHERE e.job_id = w.job_id) IS NULL), 0)::bigint AS oldest_resumed,
       COALESCE((SELECT min(j.attempted_at) FROM concurrency_waiters w JOIN river_job j ON j.id = w.job_id AND (j.state = 'running') IS TRUE
                 WHERE w.kind = l.kind AND w.worker_id <> sqlc.arg(worker_id)::text
                   AND (SELECT e.job_id FROM concurrency_executions e WHERE e.job_id = w.job_id) IS NULL),
                '9999-12-31'::timestamptz)::timestamptz AS oldest_other_waiter
FROM concurrency_limits l
WHERE l.kind = sqlc.arg(kind);

-- name: LedgerRecount :exec
-- Sets kind's counts from the rows they describe (under the kind's
-- exclusive lock): admitted (its slot rows and leased slots; NULL without
-- a per-kind limit), has_parked (jobs of the line wait for the kind
-- itself: without a partition every one, whatever it waited for when it
-- parked, as a partition just cleared leaves jobs parked for their keys),
-- and its keys' rows (each key's slot rows, and whether jobs of it wait; a
-- key with neither has no row; turns kept).
WITH lim AS (
    UPDATE concurrency_limits l
    SET admitted = CASE WHEN l.max_concurrency <> 0 THEN
            (SELECT count(*) FROM concurrency_executions e WHERE e.kind = l.kind)
            + (SELECT COALESCE(sum(cl.slots), 0) FROM concurrency_leases cl WHERE cl.kind = l.kind) END,
        has_parked = EXISTS (SELECT 1 FROM concurrency_parked_jobs p
                             WHERE p.kind = l.kind
                               AND (l.partition_fields IS NULL OR p.reason NOT IN ('key_limit', 'key_fifo', 'key_rate')))
                  OR EXISTS (SELECT 1 FROM concurrency_waiters w
                             WHERE w.kind = l.kind
                               AND (l.partition_fields IS NULL OR w.reason NOT IN ('key_limit', 'key_fifo', 'key_rate')))
    WHERE l.kind = sqlc.arg(kind)
    RETURNING l.kind
),
counted AS (
    SELECT k.key,
           (SELECT count(*) FROM concurrency_executions e WHERE e.kind = sqlc.arg(kind) AND e.key = k.key)::integer AS slots,
           (EXISTS (SELECT 1 FROM concurrency_waiters w WHERE w.kind = sqlc.arg(kind) AND w.key = k.key)
            OR EXISTS (SELECT 1 FROM concurrency_parked_jobs p WHERE p.kind = sqlc.arg(kind) AND p.key = k.key)) AS waiting
    FROM (SELECT key FROM concurrency_executions WHERE kind = sqlc.arg(kind) AND key IS NOT NULL
          UNION SELECT key FROM concurrency_waiters WHERE kind = sqlc.arg(kind) AND key IS NOT NULL
          UNION SELECT key FROM concurrency_parked_jobs WHERE kind = sqlc.arg(kind) AND key IS NOT NULL
          UNION SELECT key FROM concurrency_key_lines WHERE kind = sqlc.arg(kind)) k
),
upserted AS (
    INSERT INTO concurrency_key_lines AS kl (kind, key, slots, waiting)
    SELECT sqlc.arg(kind), c.key, c.slots, c.waiting FROM counted c WHERE c.slots > 0 OR c.waiting
    ON CONFLICT (kind, key) DO UPDATE SET slots = EXCLUDED.slots, waiting = EXCLUDED.waiting
)
DELETE FROM concurrency_key_lines kl
USING counted c
WHERE kl.kind = sqlc.arg(kind) AND kl.key = c.key AND c.slots = 0 AND NOT c.waiting;

-- name: LedgerRepartition :exec
-- Sets the keys of kind's slots, logged starts, waiting, parked and
-- fetched jobs from their River rows and the kind's partition_fields (NULL: none), after
-- the partition changed (so that a rate per key counts the starts made
-- before, in its first window), and starts the round afresh: the keys'
-- rows go (LedgerRecount makes them again).
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
),
parked AS (
    UPDATE concurrency_parked_jobs p
    SET key = sluice_partition_key(j.args, (SELECT lim.partition_fields FROM lim))
    FROM river_job j
    WHERE p.kind = sqlc.arg(kind) AND j.id = p.job_id
),
starts AS (
    UPDATE concurrency_starts s
    SET key = sluice_partition_key(j.args, (SELECT lim.partition_fields FROM lim))
    FROM river_job j
    WHERE s.kind = sqlc.arg(kind) AND j.id = s.job_id
),
fetches AS (
    UPDATE concurrency_fetches f
    SET key = sluice_partition_key(j.args, (SELECT lim.partition_fields FROM lim))
    FROM river_job j
    WHERE f.kind = sqlc.arg(kind) AND j.id = f.job_id
)
DELETE FROM concurrency_key_lines kl WHERE kl.kind = sqlc.arg(kind);

-- name: LedgerEndAheadWaits :exec
-- After a change that sets a rate on kind (it had none): its jobs resumed
-- ahead of a free slot by the lookahead (there is none under a rate) wait
-- in the line as any job does from now, with a deadline, rather than as
-- long as it takes: a window may free long after, and meanwhile each
-- would hold a River slot of its worker that a job of another kind could
-- start on. They keep their places; a worker whose job waits ahead sees it
-- at its next look (LedgerGrantedTo).
UPDATE concurrency_waiters w SET ahead = false
WHERE w.kind = sqlc.arg(kind) AND w.ahead;

-- name: LedgerUnleaseFetches :exec
-- After a change that takes kind off the leased path (a per-kind limit
-- alone no more): the jobs its workers fetched and hold waiting for a
-- leased slot, published (concurrency_leases.waiting) or marked leased and
-- not published yet, count as fetched and not decided, keyed by the kind's
-- partition now, so that no worker's decision or grant round lets a
-- younger job of their lines start before their own worker decides them
-- (its decision takes the mark away; a mark counts for two seconds after
-- the job's fetch).
WITH lim AS (
    SELECT l.partition_fields FROM concurrency_limits l WHERE l.kind = sqlc.arg(kind)
),
published AS (
    SELECT w.job_id, l.worker_id FROM concurrency_leases l, unnest(l.waiting) AS w(job_id)
    WHERE l.kind = sqlc.arg(kind)
),
marked AS (
    UPDATE concurrency_fetches f
    SET leased = false, key = sluice_partition_key(j.args, (SELECT lim.partition_fields FROM lim))
    FROM river_job j
    WHERE f.kind = sqlc.arg(kind) AND f.leased AND j.id = f.job_id
)
INSERT INTO concurrency_fetches (job_id, kind, key, worker_id, fetched_at, leased)
SELECT j.id, j.kind, sluice_partition_key(j.args, (SELECT lim.partition_fields FROM lim)), p.worker_id,
       COALESCE(j.attempted_at, now()), false
FROM published p JOIN river_job j ON j.id = p.job_id AND j.kind = sqlc.arg(kind) AND (j.state = 'running') IS TRUE
-- A job marked leased too is marked's (a row changes once a statement).
WHERE NOT EXISTS (SELECT 1 FROM concurrency_fetches f WHERE f.job_id = j.id AND f.leased)
ON CONFLICT (job_id) DO UPDATE SET leased = false, key = EXCLUDED.key;

-- name: LedgerMarkRechecks :exec
-- After a change of kind's limits (under its exclusive lock, before its
-- grant round): each running job of the kind that holds a slot or a start
-- of this attempt (decided or granted under the old limits) but not all
-- the new ones ask (a slot under a concurrency limit, a start under a
-- rate) is marked as fetched and not decided, as LedgerMarkFetched marks
-- a fetch, so that the change's round and the decisions after it let no
-- younger job of its line take the room first: its worker decides it
-- again before it begins (limiter.limitCameAfter), and that decision
-- takes the mark away. When the kind had no limit before the change
-- (was_unlimited), so are the running jobs of the kind fetched within the
-- two seconds a mark counts that hold nothing (decided to run with no
-- limit: a job that had parked before goes through its worker's queue
-- even then) and neither wait in the line nor are marked already: the
-- ledger has no row of theirs to tell them by. The ledger cannot tell a
-- job that began already (its worker leaves it be), so the mark counts
-- for hold_ms from now at most (its fetched_at is set so: the ledger reads
-- marks for two seconds), and never later than the job's real fetch.
WITH lim AS (
    SELECT l.kind, l.partition_fields,
           (l.max_concurrency > 0 OR COALESCE(l.key_max, 0) > 0) AS slotted,
           (l.rate_max IS NOT NULL) AS rated
    FROM concurrency_limits l
    WHERE l.kind = sqlc.arg(kind) AND l.max_concurrency >= 0
),
held AS (
    SELECT e.job_id FROM concurrency_executions e WHERE e.kind = sqlc.arg(kind) AND NOT e.reserved
    UNION
    SELECT s.job_id FROM concurrency_starts s WHERE s.kind = sqlc.arg(kind) AND NOT s.reserved
    UNION
    SELECT j.id FROM river_job j
    -- (A plain state = 'running', not the IS TRUE form used elsewhere:
    -- River's fetch index, which leads with the state, then serves it; a
    -- kind's finished jobs may be many.)
    WHERE sqlc.arg(was_unlimited)::boolean AND j.state = 'running' AND j.kind = sqlc.arg(kind)
      AND j.attempted_at > statement_timestamp() - interval '2 seconds'
      AND (SELECT w.job_id FROM concurrency_waiters w WHERE w.job_id = j.id) IS NULL
      AND (SELECT f.job_id FROM concurrency_fetches f WHERE f.job_id = j.id) IS NULL
),
unfit AS (
    SELECT j.id, j.args, j.attempted_at,
           COALESCE((SELECT e.worker_id FROM concurrency_executions e WHERE e.job_id = j.id),
                    j.attempted_by[array_upper(j.attempted_by, 1)], '') AS worker_id
    FROM held h
    JOIN river_job j ON j.id = h.job_id AND (j.state = 'running') IS TRUE
    CROSS JOIN lim
    WHERE NOT ((NOT lim.slotted OR EXISTS (SELECT 1 FROM concurrency_executions e WHERE e.job_id = j.id AND NOT e.reserved))
               AND (NOT lim.rated OR EXISTS (SELECT 1 FROM concurrency_starts s
                                             WHERE s.job_id = j.id AND NOT s.reserved AND s.started_at >= j.attempted_at)))
)
INSERT INTO concurrency_fetches (job_id, kind, key, worker_id, fetched_at, leased)
SELECT u.id, sqlc.arg(kind), sluice_partition_key(u.args, (SELECT lim.partition_fields FROM lim)), u.worker_id,
       LEAST(COALESCE(u.attempted_at, statement_timestamp()),
             statement_timestamp() - interval '2 seconds' + make_interval(secs => sqlc.arg(hold_ms)::bigint / 1000.0)),
       false
FROM unfit u
ON CONFLICT (job_id) DO UPDATE
SET kind = EXCLUDED.kind, key = EXCLUDED.key, worker_id = EXCLUDED.worker_id, fetched_at = EXCLUDED.fetched_at, leased = false;

-- name: LedgerRevokeAllGrants :many
-- Takes back every grant of kind not claimed yet, slots and starts
-- reserved (its partition changed: the grants were given in its old
-- lines' order): their jobs wait in the line again, without a worker, with
-- their keys by the new partition; the grant round that follows gives the
-- room in the new lines' order. Under the kind's exclusive lock, after
-- LedgerRepartition. Returns the jobs.
WITH lim AS (
    SELECT l.partition_fields FROM concurrency_limits l WHERE l.kind = sqlc.arg(kind)
),
slots AS (
    DELETE FROM concurrency_executions e WHERE e.kind = sqlc.arg(kind) AND e.reserved
    RETURNING e.job_id
),
starts AS (
    DELETE FROM concurrency_starts s WHERE s.kind = sqlc.arg(kind) AND s.reserved
    RETURNING s.job_id
),
revoked AS (
    SELECT job_id FROM slots UNION SELECT job_id FROM starts
),
back AS (
    INSERT INTO concurrency_waiters (job_id, kind, key, worker_id, reason)
    SELECT r.job_id, sqlc.arg(kind), sluice_partition_key(j.args, (SELECT lim.partition_fields FROM lim)), NULL, 'limit'
    FROM revoked r JOIN river_job j ON j.id = r.job_id
    WHERE NOT EXISTS (SELECT 1 FROM concurrency_parked_jobs p WHERE p.job_id = r.job_id) -- granted as its parking completed: it stays parked
    ON CONFLICT (job_id) DO NOTHING
)
SELECT r.job_id FROM revoked r;

-- name: LedgerLetGo :one
-- Lets jobs of kind's line go, its limits gone (under the kind's lock):
-- the oldest max_rows parked jobs become available (their parking records
-- go with them), the River producers of their queues are woken, and every
-- waiter leaves the line (a job waiting in a worker finds its place gone
-- and is decided again). A job that waited in a worker is marked fetched
-- and not decided again (no key: the next limits' partition is not known),
-- so that, should a limit come back before its worker decides it again, no
-- younger job of the kind starts before it (its decision deletes the
-- mark). Returns how many it resumed.
WITH resumed AS (
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
    RETURNING j.id, j.queue
),
unwaited AS (
    DELETE FROM concurrency_waiters w WHERE w.kind = sqlc.arg(kind)
    RETURNING w.job_id, w.worker_id
),
remarked AS (
    INSERT INTO concurrency_fetches (job_id, kind, key, worker_id, fetched_at, leased)
    SELECT u.job_id, sqlc.arg(kind), NULL, u.worker_id, now(), false
    FROM unwaited u JOIN river_job j ON j.id = u.job_id AND (j.state = 'running') IS TRUE
    WHERE u.worker_id IS NOT NULL
    ON CONFLICT (job_id) DO UPDATE
    SET kind = EXCLUDED.kind, key = NULL, worker_id = EXCLUDED.worker_id, fetched_at = EXCLUDED.fetched_at, leased = false
),
notified AS (
    SELECT pg_notify(COALESCE(NULLIF(current_setting('sluice.river_schema', true), ''), current_schema()) || '.river_insert',
                     json_build_object('queue', q.queue)::text)
    FROM (SELECT DISTINCT queue FROM resumed) q
)
SELECT (SELECT count(*) FROM resumed)::integer AS resumed, (SELECT count(*) FROM notified)::integer AS queues;

-- name: LedgerBackfillKeys :exec
-- Gives the slots, waiting and parked jobs of kind without a key theirs,
-- when the kind has a partition: rows left from before a partition that
-- plain SQL set (a change through sluice sets the keys at once). The
-- safety net runs it, then LedgerRecount.
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
)
UPDATE concurrency_parked_jobs p
SET key = sluice_partition_key(j.args, (SELECT lim.partition_fields FROM lim))
FROM river_job j
WHERE p.kind = sqlc.arg(kind) AND p.key IS NULL AND j.id = p.job_id AND EXISTS (SELECT 1 FROM lim);

-- name: LedgerLineLeft :one
-- Whether jobs of kind wait in its line (parked, or in a worker; a job
-- granted a slot it has not claimed yet is on its way: the safety net
-- frees the grant once it is ReservedSlotTTL old).
SELECT (EXISTS (SELECT 1 FROM concurrency_parked_jobs p WHERE p.kind = sqlc.arg(kind))
     OR EXISTS (SELECT 1 FROM concurrency_waiters w WHERE w.kind = sqlc.arg(kind)))::boolean AS left;

-- name: LedgerGrantedTo :many
-- What the line holds for jobs job_ids waiting in worker_id (a look for
-- the grants whose notifications it missed): each granted a slot (worker
-- worker_id's, not reserved: slot) or a start (since it waits: reserved
-- until it starts), or gone from the line without a grant (its place went: its
-- limits were cleared, or the safety net dropped it); and, for a job
-- resumed ahead of a free slot, whether an older job of its line holds a
-- grant and waits to be fetched, or, under a kind-wide limit with every
-- slot taken, a job of another key does (behind: it steps back), and whether it
-- still waits ahead (a change that set a rate ends that:
-- LedgerEndAheadWaits).
SELECT r.job_id::bigint AS job_id,
       EXISTS (SELECT 1 FROM concurrency_executions e
               WHERE e.job_id = r.job_id AND NOT e.reserved AND e.worker_id = sqlc.arg(worker_id)::text) AS slot,
       EXISTS (SELECT 1 FROM concurrency_starts s WHERE s.job_id = r.job_id
               AND (SELECT w.job_id FROM concurrency_waiters w WHERE w.job_id = r.job_id) IS NULL) AS start,
       ((SELECT w.job_id FROM concurrency_waiters w WHERE w.job_id = r.job_id) IS NULL)::boolean AS out_of_line,
       EXISTS (SELECT 1 FROM concurrency_waiters w
               JOIN concurrency_executions e ON e.kind = w.kind AND e.reserved
                                            AND ((e.key IS NOT DISTINCT FROM w.key AND e.job_id < w.job_id)
                                                 OR (w.key IS NOT NULL AND e.key IS DISTINCT FROM w.key
                                                     AND EXISTS (SELECT 1 FROM concurrency_limits l
                                                                 WHERE l.kind = w.kind AND l.max_concurrency > 0
                                                                   AND l.admitted >= l.max_concurrency)))
               JOIN river_job o ON o.id = e.job_id AND (o.state = 'available') IS TRUE
               WHERE w.job_id = r.job_id AND w.ahead) AS behind,
       EXISTS (SELECT 1 FROM concurrency_waiters w WHERE w.job_id = r.job_id AND w.ahead) AS ahead
FROM unnest(sqlc.arg(job_ids)::bigint[]) AS r(job_id);

-- name: LedgerRevokeKeyGrants :many
-- Takes back, per key of kind, the newest grants not claimed yet beyond
-- key_max (its per-key limit was lowered), with the starts reserved for
-- them: their jobs wait in the line again, without a worker (a resumed
-- job keeps its place). Under the kind's exclusive lock. Returns the jobs.
WITH ranked AS (
    SELECT e.job_id, e.key,
           row_number() OVER (PARTITION BY e.key ORDER BY e.job_id) AS n,
           (SELECT count(*) FROM concurrency_executions h
            WHERE h.kind = e.kind AND h.key = e.key AND NOT h.reserved) AS held
    FROM concurrency_executions e
    WHERE e.kind = sqlc.arg(kind) AND e.reserved AND e.key IS NOT NULL
),
revoked AS (
    DELETE FROM concurrency_executions e
    USING ranked r
    WHERE e.job_id = r.job_id AND r.held + r.n > sqlc.arg(key_max)::integer
    RETURNING e.job_id, e.key
),
unstarted AS (
    DELETE FROM concurrency_starts s
    WHERE s.reserved AND s.job_id IN (SELECT r.job_id FROM revoked r)
),
back AS (
    INSERT INTO concurrency_waiters (job_id, kind, key, worker_id, reason)
    SELECT r.job_id, sqlc.arg(kind), r.key, NULL, 'key_limit' FROM revoked r
    WHERE NOT EXISTS (SELECT 1 FROM concurrency_parked_jobs p WHERE p.job_id = r.job_id) -- granted as its parking completed: it stays parked
    ON CONFLICT (job_id) DO NOTHING
)
SELECT r.job_id FROM revoked r;

-- name: LedgerRevokeRateGrants :many
-- Takes back the newest starts reserved and not claimed yet beyond kind's
-- rate (set, lowered, or made kind-wide: starts granted under the old
-- limits would fill the new window past its rate), of the kind or, under
-- a rate per key, of each key, counting the starts logged in the window,
-- with the slots reserved for them: their jobs wait in the line again,
-- without a worker (a resumed job keeps its place). Under the kind's
-- exclusive lock. Returns the jobs.
WITH lim AS (
    SELECT l.kind, l.rate_max, l.rate_period, l.rate_per_key
    FROM concurrency_limits l
    WHERE l.kind = sqlc.arg(kind) AND l.rate_max IS NOT NULL AND l.rate_period IS NOT NULL
),
ranked AS (
    SELECT s.job_id, s.key,
           row_number() OVER (PARTITION BY CASE WHEN lim.rate_per_key THEN s.key END ORDER BY s.job_id) AS n,
           (SELECT count(*) FROM concurrency_starts h
            WHERE h.kind = lim.kind AND NOT h.reserved AND h.started_at > statement_timestamp() - lim.rate_period
              AND (NOT lim.rate_per_key OR h.key IS NOT DISTINCT FROM s.key)) AS started
    FROM concurrency_starts s JOIN lim ON lim.kind = s.kind
    WHERE s.reserved
),
revoked AS (
    DELETE FROM concurrency_starts s
    USING ranked r, lim
    WHERE s.job_id = r.job_id AND s.reserved AND r.started + r.n > lim.rate_max
    RETURNING s.job_id, s.key
),
unslotted AS (
    DELETE FROM concurrency_executions e
    WHERE e.reserved AND e.job_id IN (SELECT r.job_id FROM revoked r)
),
back AS (
    INSERT INTO concurrency_waiters (job_id, kind, key, worker_id, reason)
    SELECT r.job_id, sqlc.arg(kind), r.key, NULL, CASE WHEN (SELECT lim.rate_per_key FROM lim) THEN 'key_rate' ELSE 'rate' END
    FROM revoked r
    WHERE NOT EXISTS (SELECT 1 FROM concurrency_parked_jobs p WHERE p.job_id = r.job_id) -- granted as its parking completed: it stays parked
    ON CONFLICT (job_id) DO NOTHING
)
SELECT r.job_id FROM revoked r;

-- name: LedgerLockSteals :one
-- Locks the grants a decision takes from younger jobs of their lines
-- (job_ids: LedgerStealGrants), before it writes, and returns those still
-- reserved: their reserved slots and their reserved starts. A start
-- granted to a job waiting in a worker is claimed by that worker without
-- the kind's lock (LedgerClaimStarts, as the grant wakes it): one claimed
-- since the decision read it is its job's now, and the decision, which
-- counted it as taken, is made again. A claim that comes after this lock
-- waits for the decision's commit, and finds the grant gone.
WITH slots AS (
    SELECT e.job_id FROM concurrency_executions e
    WHERE e.job_id = ANY(sqlc.arg(job_ids)::bigint[]) AND e.reserved
    FOR UPDATE
),
starts AS (
    SELECT s.job_id FROM concurrency_starts s
    WHERE s.job_id = ANY(sqlc.arg(job_ids)::bigint[]) AND s.reserved
    FOR UPDATE
)
SELECT COALESCE((SELECT array_agg(job_id) FROM slots), '{}')::bigint[] AS slots,
       COALESCE((SELECT array_agg(job_id) FROM starts), '{}')::bigint[] AS starts;

-- name: LedgerStealGrants :exec
-- Takes back grants not claimed yet (job_ids: their reserved slots and
-- starts) for older jobs of their lines that start in their place: each
-- job granted and not fetched yet (still available) is parked again, as if
-- never resumed (no more jobs of a line wait resumed than its room and
-- lookahead allow); one fetched meanwhile goes back to the line as a job
-- resumed ahead (a waiter without a worker); one granted as its parking
-- completed (LedgerGrantParked) stays parked. Each keeps its place.
WITH slots AS (
    DELETE FROM concurrency_executions e
    WHERE e.job_id = ANY(sqlc.arg(job_ids)::bigint[]) AND e.reserved
    RETURNING e.job_id, e.kind, e.key
),
starts AS (
    DELETE FROM concurrency_starts s
    WHERE s.job_id = ANY(sqlc.arg(job_ids)::bigint[]) AND s.reserved
    RETURNING s.job_id, s.kind, s.key
),
taken AS (
    SELECT DISTINCT ON (x.job_id) x.job_id, x.kind, x.key FROM (SELECT * FROM slots UNION ALL SELECT * FROM starts) x
),
reparked AS (
    UPDATE river_job j
    SET state = 'pending'
    FROM taken t
    WHERE j.id = t.job_id AND j.state = 'available'
    RETURNING j.id
),
parkings AS (
    INSERT INTO concurrency_parked_jobs (job_id, kind, key, reason, worker_id)
    SELECT t.job_id, t.kind, t.key, CASE WHEN t.key IS NULL THEN 'fifo' ELSE 'key_fifo' END, NULL
    FROM taken t JOIN reparked r ON r.id = t.job_id
    ON CONFLICT (job_id) DO NOTHING
)
INSERT INTO concurrency_waiters (job_id, kind, key, worker_id, reason, ahead)
SELECT t.job_id, t.kind, t.key, NULL, CASE WHEN t.key IS NULL THEN 'fifo' ELSE 'key_fifo' END, true
FROM taken t
WHERE NOT EXISTS (SELECT 1 FROM reparked r WHERE r.id = t.job_id)
  AND NOT EXISTS (SELECT 1 FROM concurrency_parked_jobs p WHERE p.job_id = t.job_id) -- granted as its parking completed: it stays parked
ON CONFLICT (job_id) DO UPDATE SET worker_id = NULL, ahead = true;

-- name: LedgerStepBackFetched :exec
-- Jobs resumed ahead of a free slot that a worker fetched and never handed
-- to River's executors step back (job_ids): an older job of their line
-- holds a grant and waits to be fetched (or, under a kind-wide limit with
-- every slot taken, a job of another key does), and the worker's River
-- slot is for it. Each goes back to available with its fetch undone
-- (attempt, attempted_by; attempted_at cleared with a first attempt), still
-- in the line as a job resumed ahead (its waiter row without a worker). Its
-- scheduled_at moves up to the latest of the older granted jobs of its
-- line still available (and just past the latest of the other keys' when
-- it steps back for those), so that River, which fetches by (priority,
-- scheduled_at, id), hands those out first: without it a job granted after
-- a snooze or retry (a later scheduled_at), or a younger job of another
-- key, is never fetched while the jobs ahead step back and are fetched
-- again, round after round.
WITH moved AS (
    UPDATE river_job j
    SET state = 'available',
        attempt = GREATEST(j.attempt - 1, 0),
        attempted_by = j.attempted_by[1:GREATEST(COALESCE(array_length(j.attempted_by, 1), 0) - 1, 0)],
        attempted_at = CASE WHEN j.attempt <= 1 THEN NULL ELSE j.attempted_at END,
        scheduled_at = GREATEST(j.scheduled_at, (
            SELECT max(o.scheduled_at)
            FROM concurrency_waiters w
            JOIN concurrency_executions e ON e.kind = w.kind AND e.key IS NOT DISTINCT FROM w.key AND e.reserved AND e.job_id < w.job_id
            JOIN river_job o ON o.id = e.job_id AND (o.state = 'available') IS TRUE
            WHERE w.job_id = j.id), (
            -- past the grants of other keys too, when those are what it
            -- steps back for (as LedgerGrantedTo's behind): they may be
            -- younger, and River breaks a tie by id
            SELECT max(o.scheduled_at) + interval '1 microsecond'
            FROM concurrency_waiters w
            JOIN concurrency_limits l ON l.kind = w.kind AND l.max_concurrency > 0 AND l.admitted >= l.max_concurrency
            JOIN concurrency_executions e ON e.kind = w.kind AND e.reserved AND e.key IS DISTINCT FROM w.key
            JOIN river_job o ON o.id = e.job_id AND (o.state = 'available') IS TRUE
            WHERE w.job_id = j.id AND w.key IS NOT NULL))
    WHERE j.id = ANY(sqlc.arg(job_ids)::bigint[]) AND j.state = 'running'
    RETURNING j.id
)
UPDATE concurrency_waiters w SET worker_id = NULL, ahead = true
FROM moved m WHERE w.job_id = m.id;

-- name: LedgerStepBackDispatched :exec
-- Jobs resumed ahead of a free slot that River's executors have (job_ids,
-- with their attempts in step) step back (as LedgerStepBackFetched): each
-- is marked (sluice_park "ahead"), so that River's completion of it turns
-- it into an available job with its attempt undone (trigger
-- sluice_park_in_place), still in the line as a job resumed ahead. When
-- it steps back for a grant of another key, its scheduled_at moves now just
-- past that job's, as LedgerStepBackFetched's does (the trigger keeps the
-- running row's): a younger job of another key comes after it in River's
-- order otherwise.
WITH p AS (
    SELECT unnest(sqlc.arg(job_ids)::bigint[]) AS job_id, unnest(sqlc.arg(attempts)::integer[]) AS attempt
),
marked AS (
    UPDATE river_job j
    SET metadata = j.metadata || '{"sluice_park": "ahead"}'::jsonb,
        scheduled_at = GREATEST(j.scheduled_at, (
            SELECT max(o.scheduled_at) + interval '1 microsecond'
            FROM concurrency_waiters w
            JOIN concurrency_limits l ON l.kind = w.kind AND l.max_concurrency > 0 AND l.admitted >= l.max_concurrency
            JOIN concurrency_executions e ON e.kind = w.kind AND e.reserved AND e.key IS DISTINCT FROM w.key
            JOIN river_job o ON o.id = e.job_id AND (o.state = 'available') IS TRUE
            WHERE w.job_id = j.id AND w.key IS NOT NULL))
    FROM p
    WHERE j.id = p.job_id AND j.attempt = p.attempt AND j.state = 'running'
    RETURNING j.id
)
UPDATE concurrency_waiters w SET worker_id = NULL, ahead = true
FROM marked m WHERE w.job_id = m.id;

-- name: LedgerClaimStarts :many
-- Jobs granted a start while they waited in a worker, or held back in it
-- after their decision, started: their starts (reserved, or logged at
-- their decision in this attempt) are theirs, logged now (a start counts
-- in its rate window from when its job began, not from its grant).
-- Returns the jobs whose starts were there: a reserved start can go before
-- it is claimed (an older job of its line took it, LedgerStealGrants; a
-- change took it back), and its job must not start on it.
UPDATE concurrency_starts s
SET reserved = false, started_at = clock_timestamp()
FROM river_job j
WHERE s.job_id = ANY(sqlc.arg(job_ids)::bigint[]) AND j.id = s.job_id
  AND (s.reserved OR s.started_at >= j.attempted_at)
RETURNING s.job_id;

-- name: LedgerSwapSlot :one
-- Moves what from_id holds, a job of worker_id that was granted or
-- admitted a slot (or, under a rate alone, a start) and has not started
-- (its worker holds it back: an older job of its key there was deciding),
-- to to_id, that older job, which its decision put in the line: to_id
-- leaves the line and starts in its place (with the start logged for
-- from_id, if any, reserved for to_id to claim as it begins:
-- LedgerClaimStarts), and from_id waits in the line in worker_id, held for
-- reason. Counts do not change: the two are of one key. But when a job of
-- the line older than to_id waits elsewhere (in the line, parked, or
-- fetched by a worker and not decided yet), what from_id holds is that
-- job's: from_id gives it back (its slot row, and the start logged for it,
-- go) and waits in the line, and the caller counts the slot freed
-- (freed_slot) and runs a grant round. Returns whether it moved or went
-- back, and from_id's key (neither when from_id holds nothing of worker_id's
-- of to_id's key, or to_id holds something). A slot taken with no start
-- while the kind has a rate now (from_id was decided before the rate was
-- set) goes back the same way: it carries no start for to_id to claim.
WITH waiter AS (
    -- to_id's key in the line (a worker's copy of the limits may be older
    -- than the partition the ledger keys by).
    SELECT w.key FROM concurrency_waiters w WHERE w.job_id = sqlc.arg(to_id)::bigint
),
slot AS (
    SELECT e.kind, e.key FROM concurrency_executions e
    WHERE e.job_id = sqlc.arg(from_id)::bigint AND NOT e.reserved AND e.worker_id = sqlc.arg(worker_id)::text
      AND EXISTS (SELECT 1 FROM waiter) AND e.key IS NOT DISTINCT FROM (SELECT key FROM waiter)
      AND (SELECT x.job_id FROM concurrency_executions x WHERE x.job_id = sqlc.arg(to_id)::bigint) IS NULL
),
start AS (
    -- Under a rate alone (from_id holds no slot row): from_id's start of
    -- this attempt, none of to_id's.
    SELECT s.kind, s.key FROM concurrency_starts s JOIN river_job j ON j.id = s.job_id
    WHERE s.job_id = sqlc.arg(from_id)::bigint AND (s.reserved OR s.started_at >= j.attempted_at)
      AND j.attempted_by[array_upper(j.attempted_by, 1)] = sqlc.arg(worker_id)::text
      AND EXISTS (SELECT 1 FROM waiter) AND s.key IS NOT DISTINCT FROM (SELECT key FROM waiter)
      AND (SELECT x.job_id FROM concurrency_executions x WHERE x.job_id = sqlc.arg(from_id)::bigint) IS NULL
      AND NOT EXISTS (SELECT 1 FROM concurrency_starts t JOIN river_job o ON o.id = t.job_id
                      WHERE t.job_id = sqlc.arg(to_id)::bigint AND (t.reserved OR t.started_at >= o.attempted_at))
),
held AS (
    SELECT kind, key FROM slot UNION ALL SELECT kind, key FROM start
),
older AS (
    SELECT EXISTS (
        SELECT 1 FROM held m, concurrency_waiters w
        WHERE w.kind = m.kind AND w.key IS NOT DISTINCT FROM m.key AND w.job_id < sqlc.arg(to_id)::bigint
          AND w.job_id <> sqlc.arg(from_id)::bigint
          AND (SELECT x.job_id FROM concurrency_executions x WHERE x.job_id = w.job_id) IS NULL
        UNION ALL
        SELECT 1 FROM held m, concurrency_parked_jobs p
        WHERE p.kind = m.kind AND p.key IS NOT DISTINCT FROM m.key AND p.job_id < sqlc.arg(to_id)::bigint
        UNION ALL
        SELECT 1 FROM held m, concurrency_fetches f JOIN river_job o ON o.id = f.job_id AND (o.state = 'running') IS TRUE
        WHERE f.kind = m.kind AND f.key IS NOT DISTINCT FROM m.key AND f.job_id < sqlc.arg(to_id)::bigint
          AND f.fetched_at > statement_timestamp() - interval '2 seconds' AND NOT f.leased
    ) AS waits
),
unstarted_slot AS (
    -- from_id's slot was taken with no start of this attempt (decided
    -- before the kind's rate was set) while the kind has a rate now: to_id
    -- would start on it uncounted, so from_id gives it back, and the grant
    -- round gives it to the front with a start of the rate's.
    SELECT EXISTS (SELECT 1 FROM slot m JOIN concurrency_limits l ON l.kind = m.kind WHERE l.rate_max IS NOT NULL)
       AND NOT EXISTS (SELECT 1 FROM concurrency_starts s JOIN river_job j ON j.id = s.job_id
                       WHERE s.job_id = sqlc.arg(from_id)::bigint AND (s.reserved OR s.started_at >= j.attempted_at)) AS gives
),
act AS (
    SELECT EXISTS (SELECT 1 FROM held) AND NOT (o.waits OR u.gives) AS moving,
           EXISTS (SELECT 1 FROM held) AND (o.waits OR u.gives) AS giving
    FROM older o, unstarted_slot u
),
moved AS (
    UPDATE concurrency_executions e
    SET job_id = sqlc.arg(to_id)::bigint, admitted_at = clock_timestamp()
    WHERE e.job_id = sqlc.arg(from_id)::bigint AND EXISTS (SELECT 1 FROM slot) AND (SELECT moving FROM act)
),
given AS (
    DELETE FROM concurrency_executions e
    WHERE e.job_id = sqlc.arg(from_id)::bigint AND EXISTS (SELECT 1 FROM slot) AND (SELECT giving FROM act)
    RETURNING e.job_id
),
started AS (
    UPDATE concurrency_starts s
    SET job_id = sqlc.arg(to_id)::bigint, reserved = true
    WHERE s.job_id = sqlc.arg(from_id)::bigint AND (SELECT moving FROM act)
      AND (s.reserved OR s.started_at >= (SELECT j.attempted_at FROM river_job j WHERE j.id = sqlc.arg(from_id)::bigint))
),
unstarted AS (
    DELETE FROM concurrency_starts s
    WHERE s.job_id = sqlc.arg(from_id)::bigint AND (SELECT giving FROM act)
      AND (s.reserved OR s.started_at >= (SELECT j.attempted_at FROM river_job j WHERE j.id = sqlc.arg(from_id)::bigint))
),
unwaited AS (
    DELETE FROM concurrency_waiters w
    WHERE w.job_id = sqlc.arg(to_id)::bigint AND (SELECT moving FROM act)
),
waiting AS (
    INSERT INTO concurrency_waiters (job_id, kind, key, worker_id, reason, ahead)
    SELECT sqlc.arg(from_id)::bigint, m.kind, m.key, sqlc.arg(worker_id)::text, sqlc.arg(reason)::text, false
    FROM held m
    ON CONFLICT (job_id) DO UPDATE SET worker_id = EXCLUDED.worker_id, reason = EXCLUDED.reason, ahead = false
)
SELECT COALESCE(a.moving, false)::boolean AS swapped, COALESCE(a.giving, false)::boolean AS gave_back,
       EXISTS (SELECT 1 FROM given) AS freed_slot,
       COALESCE((SELECT key FROM held), '')::text AS key
FROM act a;

-- name: LedgerFetching :exec
-- Marks the fetch's transaction as a fetch in flight, before River's
-- statement: the transaction-level advisory lock on
-- hashtextextended('sluice.fetching', 0), shared (fetches never wait for
-- each other; nothing takes it exclusive). LedgerLeaseState reads who
-- holds it: the jobs a fetch marks show from its commit, and a fetch in
-- flight a while may hold jobs fetched well before another worker's.
SELECT pg_advisory_xact_lock_shared(hashtextextended('sluice.fetching', 0))::text;

-- name: LedgerMarkFetched :exec
-- Marks jobs of limited kinds fetched by worker_id and not decided yet
-- (job_ids, kinds, keys and leaseds in step: the keys the worker computed
-- from their args, '' for none), in the transaction of River's fetch, so
-- that no worker's decision or grant round lets a younger job of their
-- lines start before their own decision, which deletes the marks
-- (LedgerUnmarkFetched). A job marked leased (a first attempt on the
-- leased path) counts for the other workers' leases as waiting, and holds
-- up the kind's line as a job fetched, until its worker publishes the jobs
-- waiting for a leased slot (SetLeaseWaiting deletes the mark; a job
-- published as waiting holds up the line in turn).
INSERT INTO concurrency_fetches (job_id, kind, key, worker_id, fetched_at, leased)
SELECT f.job_id, f.kind, NULLIF(f.key, ''), sqlc.arg(worker_id)::text, now(), f.leased
FROM (SELECT unnest(sqlc.arg(job_ids)::bigint[]) AS job_id, unnest(sqlc.arg(kinds)::text[]) AS kind,
             unnest(sqlc.arg(keys)::text[]) AS key, unnest(sqlc.arg(leaseds)::boolean[]) AS leased) AS f
ON CONFLICT (job_id) DO UPDATE
SET kind = EXCLUDED.kind, key = EXCLUDED.key, worker_id = EXCLUDED.worker_id, fetched_at = EXCLUDED.fetched_at,
    leased = EXCLUDED.leased;

-- name: LedgerUnmarkFetched :exec
-- Jobs decided: their marks as fetched and not decided go.
DELETE FROM concurrency_fetches WHERE job_id = ANY(sqlc.arg(job_ids)::bigint[]);

-- name: LedgerParkAheadPick :many
-- Picks, before River's fetch and in its transaction, the next available
-- jobs of queue (the first max_jobs of limited kinds in River's fetch
-- order: priority, scheduled_at, id, locked for the transaction; jobs
-- another holds are skipped) whose line already has at least its kind's
-- wait cap of older jobs parked (kinds and caps in step; the cap is the
-- decision's own: a job fetched behind that many parks at once), with the
-- reason of their parking: the line of the job parked before each (a
-- key's, key_fifo, or the kind's, fifo; breaker under a breaker). Jobs
-- resumed ahead or granted (a waiter, a reserved slot or start) are not of
-- the backlog. The transaction holds the kinds' change locks
-- (LedgerTryLockChanges, shared): no change of limits runs meanwhile, and
-- a kind whose limits were cleared picks nothing. LedgerParkAhead parks
-- them.
WITH lim AS (
    SELECT l.kind, l.partition_fields AS fields, c.cap
    FROM concurrency_limits l
    JOIN (SELECT unnest(sqlc.arg(kinds)::text[]) AS kind, unnest(sqlc.arg(caps)::integer[]) AS cap) AS c ON c.kind = l.kind
    WHERE l.max_concurrency <> 0 OR l.key_max IS NOT NULL OR l.rate_max IS NOT NULL
),
front AS (
    SELECT j.id, j.kind, sluice_partition_key(j.args, lim.fields) AS key, lim.cap
    FROM river_job j JOIN lim ON lim.kind = j.kind
    WHERE j.state = 'available' AND j.queue = sqlc.arg(queue)::text AND j.scheduled_at <= now()
      AND NOT j.metadata ? 'cancel_attempted_at'
    ORDER BY j.priority, j.scheduled_at, j.id
    LIMIT sqlc.arg(max_jobs)::integer
    FOR UPDATE OF j SKIP LOCKED
),
-- The parked jobs of a key's line by the index on (kind, key, job_id); of
-- an unpartitioned kind's by the one on (kind, job_id). Per line of the
-- front, its cap-th oldest parked job, read once (a count of older parked
-- jobs per job read up to cap of them for each of the jobs looked at):
-- a job of the line with a younger id has at least cap older jobs parked.
lines AS MATERIALIZED (
    SELECT l.kind, l.key, l.cap,
           CASE WHEN l.key IS NULL
                THEN (SELECT p.job_id FROM concurrency_parked_jobs p
                      WHERE p.kind = l.kind AND p.key IS NULL ORDER BY p.job_id OFFSET GREATEST(l.cap - 1, 0) LIMIT 1)
                ELSE (SELECT p.job_id FROM concurrency_parked_jobs p
                      WHERE p.kind = l.kind AND p.key = l.key ORDER BY p.job_id OFFSET GREATEST(l.cap - 1, 0) LIMIT 1)
           END AS nth
    FROM (SELECT DISTINCT f.kind, f.key, f.cap FROM front f) AS l
),
behind AS (
    SELECT f.id, f.kind, f.key,
           CASE WHEN f.key IS NULL
                THEN (SELECT p.reason FROM concurrency_parked_jobs p
                      WHERE p.kind = f.kind AND p.key IS NULL AND p.job_id < f.id ORDER BY p.job_id DESC LIMIT 1)
                ELSE (SELECT p.reason FROM concurrency_parked_jobs p
                      WHERE p.kind = f.kind AND p.key = f.key AND p.job_id < f.id ORDER BY p.job_id DESC LIMIT 1)
           END AS before
    FROM front f
    JOIN lines l ON l.kind = f.kind AND COALESCE(l.key, '') = COALESCE(f.key, '') AND l.cap = f.cap
    WHERE (l.cap <= 0 OR l.nth < f.id)
      AND (SELECT w.job_id FROM concurrency_waiters w WHERE w.job_id = f.id) IS NULL
      AND (SELECT e.job_id FROM concurrency_executions e WHERE e.job_id = f.id) IS NULL
      AND NOT EXISTS (SELECT 1 FROM concurrency_starts s WHERE s.job_id = f.id)
)
SELECT b.id, b.kind, COALESCE(b.key, '')::text AS key,
       (CASE WHEN b.before IN ('key_limit', 'key_fifo', 'key_rate') THEN 'key_fifo'
             WHEN b.before = 'breaker' THEN 'breaker'
             ELSE 'fifo' END)::text AS reason
FROM behind b
ORDER BY b.id;

-- name: LedgerPlanIndexes :one
-- Turns sequential and bitmap scans off for the rest of the transaction
-- and returns the settings as they were (LedgerPlanRestore puts them back):
-- LedgerParkAheadPick runs in River's fetch transaction, not a ledger
-- transaction (LedgerSettings), and on a connection's cached generic plan,
-- made while few jobs were parked, it read every parked job of the line
-- (by a bitmap scan and a sort, or a sequential scan) for each of the 500
-- jobs it looked at: 0.8-3 s a fetch with 4,800 parked (P11), while the
-- jobs the rate had granted waited for that fetch.
SELECT current_setting('enable_seqscan')::text AS seqscan, current_setting('enable_bitmapscan')::text AS bitmapscan,
       set_config('enable_seqscan', 'off', true)::text AS seqscan_off, set_config('enable_bitmapscan', 'off', true)::text AS bitmapscan_off;

-- name: LedgerPlanRestore :exec
-- Puts back the settings LedgerPlanIndexes returned, before River's own
-- fetch in the same transaction.
SELECT set_config('enable_seqscan', sqlc.arg(seqscan)::text, true), set_config('enable_bitmapscan', sqlc.arg(bitmapscan)::text, true);

-- name: LedgerParkAhead :many
-- Parks the jobs LedgerParkAheadPick picked (job_ids, with their kinds,
-- keys and reasons in step; key '' for none), never fetched: each goes to
-- pending untouched (its attempt stays), its parking recorded as a
-- fetch's is (metadata sluice_parking, concurrency_parked_jobs). Returns
-- the jobs parked.
WITH p AS (
    SELECT unnest(sqlc.arg(job_ids)::bigint[]) AS job_id, unnest(sqlc.arg(kinds)::text[]) AS kind,
           unnest(sqlc.arg(keys)::text[]) AS key, unnest(sqlc.arg(reasons)::text[]) AS reason
),
moved AS (
    UPDATE river_job j
    SET state = 'pending',
        metadata = j.metadata || jsonb_build_object('sluice_parking',
            COALESCE(CASE WHEN (j.metadata->'sluice_parking'->>'attempt')::integer = j.attempt
                          THEN j.metadata->'sluice_parking' END,
                     jsonb_build_object('attempt', j.attempt, 'first_at', now(), 'parks', 0))
            || jsonb_build_object('parked_at', now(), 'reason', p.reason,
                                  'parks', COALESCE((j.metadata->'sluice_parking'->>'parks')::integer, 0) + 1))
    FROM p
    WHERE j.id = ANY(sqlc.arg(job_ids)::bigint[]) AND j.id = p.job_id AND j.state = 'available'
    RETURNING j.id, p.kind, p.key, p.reason
)
INSERT INTO concurrency_parked_jobs (job_id, kind, reason, worker_id, key)
SELECT m.id, m.kind, m.reason, sqlc.arg(worker_id)::text, NULLIF(m.key, '')
FROM moved m
ON CONFLICT (job_id) DO NOTHING
RETURNING job_id;
