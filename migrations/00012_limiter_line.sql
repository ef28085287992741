-- The limiter's line: one order, kept in one place, for every job that
-- waits for its kind's limits, wherever it waits.
--
-- A job of a limited kind waits for a slot (or, under a rate, a start) in
-- one of three places:
--
--   parked     river_job pending, a concurrency_parked_jobs record;
--   waiting    river_job running: fetched by a worker and waiting in it, a
--              concurrency_waiters row naming the worker;
--   ahead      river_job available: resumed ahead of a free slot so that it
--              is fetched and ready when one frees, a concurrency_waiters
--              row without a worker.
--
-- Together they are the kind's line. Every decision reads it under the
-- kind's limit row lock: within a key (the whole kind without a partition)
-- jobs go in job-id order, across keys round-robin (concurrency_key_turns,
-- which now has a row for every key with waiting jobs). A slot that frees
-- goes to the front of the line as a grant: a concurrency_executions row
-- reserved for that job, and a reserved start under a rate, which the job
-- claims when it starts.
--
-- A job that waits in a worker is `running` to River. SQL tells it from a
-- job that works: sluice_waiting_jobs lists the running jobs that wait
-- (those of the line, and those a worker's lease keeper publishes in its
-- lease row while they wait for a leased slot), and
-- sluice_concurrency_overview counts running, working and waiting jobs per
-- kind.

-- +goose Up
CREATE TABLE concurrency_waiters (
    -- The river_job.id of the waiting job.
    job_id    bigint PRIMARY KEY,
    kind      text NOT NULL,
    -- Its partition key (NULL: the kind has no partition).
    key       text,
    -- The worker it waits in; NULL: resumed ahead, not fetched yet.
    worker_id text,
    -- What holds it: the kind's limit (limit), older jobs of the kind
    -- (fifo), the kind's rate (rate), its key's limit, older jobs of its
    -- key or its key's rate (key_limit, key_fifo, key_rate).
    reason    text NOT NULL CHECK (reason IN ('limit', 'fifo', 'rate', 'key_limit', 'key_fifo', 'key_rate', 'breaker', 'migrated')),
    since     timestamptz NOT NULL DEFAULT now(),
    -- Resumed ahead of a free slot (lookahead), not granted one.
    ahead     boolean NOT NULL DEFAULT false
);

CREATE INDEX concurrency_waiters_kind_key_job_id_idx ON concurrency_waiters (kind, key, job_id);
CREATE INDEX concurrency_waiters_worker_id_idx ON concurrency_waiters (worker_id) WHERE worker_id IS NOT NULL;

COMMENT ON TABLE concurrency_waiters IS
    'Jobs of the line that are not parked: fetched and waiting in worker_id for a slot (river_job running), or resumed ahead of a free slot and not fetched yet (worker_id NULL, river_job available).';

-- A job resumed ahead that waited its park-after time without a grant
-- parks again, marked: it is resumed again only with a slot, never ahead
-- (jobs too long for the lookahead to pay are resumed ahead once).
ALTER TABLE concurrency_parked_jobs ADD COLUMN ahead boolean NOT NULL DEFAULT false;

-- The jobs waiting in the worker for one of its leased slots, published by
-- its lease keeper while they wait.
ALTER TABLE concurrency_leases ADD COLUMN waiting bigint[] NOT NULL DEFAULT '{}';

-- An admitted job of a kind with a rate and no concurrency limit holds no
-- slot row: its start row says it was admitted.
CREATE INDEX concurrency_starts_job_id_idx ON concurrency_starts (job_id);

-- Every key with waiting jobs has a turn row; served_at NULL: not served
-- since it started waiting, first in the round.
ALTER TABLE concurrency_key_turns ALTER COLUMN served_at DROP NOT NULL;
CREATE INDEX concurrency_key_turns_round_idx ON concurrency_key_turns (kind, served_at NULLS FIRST, key);
INSERT INTO concurrency_key_turns (kind, key, served_at)
SELECT DISTINCT p.kind, p.key, NULL::timestamptz FROM concurrency_parked_jobs p WHERE p.key IS NOT NULL
ON CONFLICT (kind, key) DO NOTHING;

-- has_parked: jobs of the line wait for the kind itself (its limit, its
-- rate, older jobs of the kind, its breaker), parked or waiting; new jobs
-- of the kind queue behind them.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION concurrency_limits_init_counts() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    NEW.admitted := (SELECT count(*) FROM concurrency_executions e WHERE e.kind = NEW.kind)
        + (SELECT COALESCE(sum(l.slots), 0) FROM concurrency_leases l WHERE l.kind = NEW.kind);
    NEW.has_parked := EXISTS (SELECT 1 FROM concurrency_parked_jobs p
                              WHERE p.kind = NEW.kind AND p.reason NOT IN ('key_limit', 'key_fifo', 'key_rate'))
        OR EXISTS (SELECT 1 FROM concurrency_waiters w
                   WHERE w.kind = NEW.kind AND w.reason NOT IN ('key_limit', 'key_fifo', 'key_rate'));
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

-- The running jobs that wait for a slot: those of the line, and those
-- waiting in a worker for a leased slot (since: when the keeper last
-- published them).
CREATE VIEW sluice_waiting_jobs AS
SELECT w.job_id, w.kind, w.key, w.worker_id, w.reason, w.since, now() - w.since AS waiting
FROM concurrency_waiters w
JOIN river_job j ON j.id = w.job_id AND j.state = 'running'
WHERE w.worker_id IS NOT NULL
UNION ALL
SELECT u.job_id, cl.kind, NULL::text, cl.worker_id, 'limit'::text, cl.renewed_at, now() - cl.renewed_at
FROM concurrency_leases cl
CROSS JOIN LATERAL unnest(cl.waiting) AS u(job_id)
JOIN river_job j ON j.id = u.job_id AND j.state = 'running'
WHERE NOT EXISTS (SELECT 1 FROM concurrency_waiters w WHERE w.job_id = u.job_id);

COMMENT ON VIEW sluice_waiting_jobs IS
    'Running River jobs that wait in their worker for a concurrency slot (they do no work yet); every other running job of a limited kind works.';

-- The overview gains, per kind, its running jobs and how many of them work
-- and how many wait in their workers.
CREATE OR REPLACE VIEW sluice_concurrency_overview AS
WITH kinds AS (
    SELECT kind FROM concurrency_limits
    UNION
    SELECT DISTINCT kind FROM concurrency_parked_jobs
    UNION
    SELECT DISTINCT kind FROM concurrency_executions
    UNION
    SELECT DISTINCT kind FROM concurrency_leases WHERE slots > 0
    UNION
    SELECT DISTINCT kind FROM concurrency_waiters
)
SELECT
    k.kind,
    l.max_concurrency AS max_concurrency,
    (SELECT count(*) FROM concurrency_executions e WHERE e.kind = k.kind)
        + (SELECT COALESCE(sum(cl.slots), 0) FROM concurrency_leases cl WHERE cl.kind = k.kind) AS admitted,
    (SELECT count(*) FROM concurrency_parked_jobs p WHERE p.kind = k.kind) AS parked,
    now() - (SELECT min(p.parked_at) FROM concurrency_parked_jobs p WHERE p.kind = k.kind) AS oldest_parked_age,
    l.partition_fields AS by_args,
    l.key_max AS max_per_key,
    l.rate_max,
    l.rate_period,
    l.rate_per_key,
    (SELECT count(DISTINCT p.key) FROM concurrency_parked_jobs p WHERE p.kind = k.kind AND p.key IS NOT NULL) AS parked_keys,
    (SELECT count(*) FROM concurrency_starts s
     WHERE s.kind = k.kind AND (s.reserved OR s.started_at > now() - l.rate_period)) AS starts_in_window,
    r.running,
    r.running - r.waiting AS working,
    r.waiting
FROM kinds k
LEFT JOIN concurrency_limits l ON l.kind = k.kind
CROSS JOIN LATERAL (
    SELECT (SELECT count(*) FROM river_job j WHERE j.state = 'running' AND j.kind = k.kind) AS running,
           (SELECT count(*) FROM sluice_waiting_jobs w WHERE w.kind = k.kind) AS waiting
) r;

-- +goose Down
-- Jobs waiting in the line go back to the form the earlier sluice knows:
-- those resumed ahead are simply available; those waiting in a worker
-- (stop the workers first) are no longer recorded.
DROP VIEW sluice_concurrency_overview;
DROP VIEW sluice_waiting_jobs;
CREATE VIEW sluice_concurrency_overview AS
WITH kinds AS (
    SELECT kind FROM concurrency_limits
    UNION
    SELECT DISTINCT kind FROM concurrency_parked_jobs
    UNION
    SELECT DISTINCT kind FROM concurrency_executions
    UNION
    SELECT DISTINCT kind FROM concurrency_leases WHERE slots > 0
)
SELECT
    k.kind,
    l.max_concurrency AS max_concurrency,
    (SELECT count(*) FROM concurrency_executions e WHERE e.kind = k.kind)
        + (SELECT COALESCE(sum(cl.slots), 0) FROM concurrency_leases cl WHERE cl.kind = k.kind) AS admitted,
    (SELECT count(*) FROM concurrency_parked_jobs p WHERE p.kind = k.kind) AS parked,
    now() - (SELECT min(p.parked_at) FROM concurrency_parked_jobs p WHERE p.kind = k.kind) AS oldest_parked_age,
    l.partition_fields AS by_args,
    l.key_max AS max_per_key,
    l.rate_max,
    l.rate_period,
    l.rate_per_key,
    (SELECT count(DISTINCT p.key) FROM concurrency_parked_jobs p WHERE p.kind = k.kind AND p.key IS NOT NULL) AS parked_keys,
    (SELECT count(*) FROM concurrency_starts s
     WHERE s.kind = k.kind AND (s.reserved OR s.started_at > now() - l.rate_period)) AS starts_in_window
FROM kinds k
LEFT JOIN concurrency_limits l ON l.kind = k.kind;
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION concurrency_limits_init_counts() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    NEW.admitted := (SELECT count(*) FROM concurrency_executions e WHERE e.kind = NEW.kind)
        + (SELECT COALESCE(sum(l.slots), 0) FROM concurrency_leases l WHERE l.kind = NEW.kind);
    NEW.has_parked := EXISTS (SELECT 1 FROM concurrency_parked_jobs p
                              WHERE p.kind = NEW.kind AND p.reason NOT IN ('key_limit', 'key_fifo', 'key_rate'));
    RETURN NEW;
END;
$$;
-- +goose StatementEnd
DELETE FROM concurrency_key_turns WHERE served_at IS NULL;
DROP INDEX concurrency_key_turns_round_idx;
ALTER TABLE concurrency_key_turns ALTER COLUMN served_at SET NOT NULL;
DROP INDEX concurrency_starts_job_id_idx;
ALTER TABLE concurrency_leases DROP COLUMN waiting;
ALTER TABLE concurrency_parked_jobs DROP COLUMN ahead;
DROP TABLE concurrency_waiters;
