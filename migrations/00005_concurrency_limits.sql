-- Global concurrency limits per job kind, enforced by the worker middleware
-- in Postgres across every worker process: jobs over the limit are parked
-- (FIFO) and resumed when a slot frees up.

-- +goose Up
CREATE TABLE concurrency_limits (
    kind            text PRIMARY KEY,
    -- > 0: at most this many jobs of kind run at once; 0: unlimited;
    -- < 0: circuit breaker (every job is parked, none resumed).
    max_concurrency integer NOT NULL,
    -- Counts of the kind's concurrency_executions and concurrency_parked_jobs
    -- rows, kept in the same transactions that change those rows, so that
    -- admission reads them with the row lock it takes anyway instead of
    -- counting a table full of dead tuples. Set when the row is inserted;
    -- recounted by concurrency_limit.resume.
    admitted        integer NOT NULL DEFAULT 0,
    parked          bigint NOT NULL DEFAULT 0,
    updated_at      timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE concurrency_limits IS
    'Global concurrency limit per job kind. No row or 0 = unlimited; < 0 = circuit breaker (park everything). Workers read changes within a second.';

-- Parked jobs: everything needed to insert the job again. FIFO by id.
CREATE TABLE concurrency_parked_jobs (
    id              bigserial PRIMARY KEY,
    kind            text NOT NULL,
    args            jsonb NOT NULL,
    queue           text NOT NULL,
    priority        smallint NOT NULL,
    max_attempts    smallint NOT NULL,
    tags            text[] NOT NULL DEFAULT '{}',
    metadata        jsonb NOT NULL DEFAULT '{}'::jsonb,
    -- The River job that was parked (completed, with metadata.sluice_parked).
    -- Unique: a job is never parked twice.
    original_job_id bigint NOT NULL UNIQUE,
    parked_at       timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX concurrency_parked_jobs_kind_id_idx ON concurrency_parked_jobs (kind, id);

-- Admitted executions: which River job of which kind holds a slot. A row is
-- written when the middleware admits a job and deleted when the job ends;
-- a resumed job's row is written ("reserved") when it is resumed, so that
-- resumed jobs not yet started count against the limit too.
CREATE TABLE concurrency_executions (
    job_id      bigint PRIMARY KEY,
    kind        text NOT NULL,
    worker_id   text,
    reserved    boolean NOT NULL DEFAULT false,
    admitted_at timestamptz NOT NULL DEFAULT now()
);

-- No index on kind: the hot path inserts and deletes by job_id only and reads
-- the counts kept in concurrency_limits; per-kind scans (the resume worker's
-- stale cleanup, the overview) are rare and the table is small.

-- A new limit row starts with the true counts (jobs may be parked or admitted
-- from an earlier limit of the kind).
-- +goose StatementBegin
CREATE FUNCTION concurrency_limits_init_counts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.admitted := (SELECT count(*) FROM concurrency_executions e WHERE e.kind = NEW.kind);
    NEW.parked := (SELECT count(*) FROM concurrency_parked_jobs p WHERE p.kind = NEW.kind);
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER concurrency_limits_init_counts BEFORE INSERT ON concurrency_limits
    FOR EACH ROW EXECUTE FUNCTION concurrency_limits_init_counts();

CREATE VIEW sluice_concurrency_overview AS
WITH kinds AS (
    SELECT kind FROM concurrency_limits
    UNION
    SELECT DISTINCT kind FROM concurrency_parked_jobs
    UNION
    SELECT DISTINCT kind FROM concurrency_executions
)
SELECT
    k.kind,
    l.max_concurrency AS max_concurrency,
    (SELECT count(*) FROM concurrency_executions e WHERE e.kind = k.kind) AS admitted,
    (SELECT count(*) FROM concurrency_parked_jobs p WHERE p.kind = k.kind) AS parked,
    now() - (SELECT min(p.parked_at) FROM concurrency_parked_jobs p WHERE p.kind = k.kind) AS oldest_parked_age
FROM kinds k
LEFT JOIN concurrency_limits l ON l.kind = k.kind;

INSERT INTO schedules (name, cron, kind) VALUES
    ('concurrency_limit.resume', '* * * * *', 'concurrency_limit.resume');

-- +goose Down
-- Jobs still parked go back to River as new available jobs, in the order
-- they parked (their limits go with this table): waiting work is never lost.
INSERT INTO river_job (args, kind, max_attempts, metadata, priority, queue, state, scheduled_at, tags)
SELECT args, kind, max_attempts, metadata - 'sluice_parked', priority, queue, 'available', now(), tags
FROM concurrency_parked_jobs
ORDER BY id;
DELETE FROM schedules WHERE name = 'concurrency_limit.resume';
DROP VIEW sluice_concurrency_overview;
DROP TABLE concurrency_limits;
DROP FUNCTION concurrency_limits_init_counts();
DROP TABLE concurrency_executions;
DROP TABLE concurrency_parked_jobs;
