-- Per-key concurrency limits, rate limits and fair admission across keys.
--
-- A kind's limits stay on its concurrency_limits row, which every admission,
-- release and resume of the kind locks first (so they all hold across every
-- worker). Beside max_concurrency (the per-kind limit) the row now has:
--
--   partition_fields  the kind's partition: top-level args fields whose
--                     values, as JSON text (sluice_partition_key), are a
--                     job's key. A per-key limit and a per-key rate share it.
--   key_max           per-key concurrency: at most key_max running jobs per
--                     key (NULL: none).
--   rate_max,         rate limit: at most rate_max starts in any window of
--   rate_period       rate_period (sliding), per key when rate_per_key.
--
-- A start is a real execution: a job moved to running and admitted, not
-- parked. It is logged in concurrency_starts at its attempted_at (River's
-- fetch time), retries included; a parked job logs nothing.
--
-- Each limit (per kind, per key, rate) has a source: 'sql' (the CLI, a
-- migration, any SQL) or 'config' (declared in Go, sluice.Config.Limits,
-- written by every worker at start). A limit set by SQL wins over the
-- declared one until it is cleared; the declared one then applies again
-- (concurrency_limit_declarations keeps it).

-- +goose Up
ALTER TABLE concurrency_limits
    ADD COLUMN partition_fields text[],
    ADD COLUMN key_max integer,
    ADD COLUMN rate_max integer,
    ADD COLUMN rate_period interval,
    ADD COLUMN rate_per_key boolean NOT NULL DEFAULT false,
    ADD COLUMN max_source text CHECK (max_source IN ('sql', 'config')),
    ADD COLUMN key_source text CHECK (key_source IN ('sql', 'config')),
    ADD COLUMN rate_source text CHECK (rate_source IN ('sql', 'config')),
    ADD CONSTRAINT concurrency_limits_partition_fields_check
        CHECK (partition_fields IS NULL OR (cardinality(partition_fields) BETWEEN 1 AND 8 AND array_position(partition_fields, NULL) IS NULL)),
    ADD CONSTRAINT concurrency_limits_key_max_check
        CHECK (key_max IS NULL OR (key_max > 0 AND partition_fields IS NOT NULL)),
    ADD CONSTRAINT concurrency_limits_rate_check
        CHECK ((rate_max IS NULL) = (rate_period IS NULL)
               AND (rate_max IS NULL OR (rate_max > 0 AND rate_period >= interval '1 second'))
               AND (NOT rate_per_key OR (rate_max IS NOT NULL AND partition_fields IS NOT NULL))),
    ADD CONSTRAINT concurrency_limits_partition_used_check
        CHECK (partition_fields IS NULL OR key_max IS NOT NULL OR rate_per_key);

-- Limits already there were set by SQL.
UPDATE concurrency_limits SET max_source = 'sql';

-- A limit a statement changes without naming its source gets the source
-- of the transaction's sluice.limit_source setting: 'config' when a worker
-- writes the declared limits, else 'sql' (the CLI, a migration, any SQL).
-- +goose StatementBegin
CREATE FUNCTION concurrency_limits_sources() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
DECLARE
    src text := COALESCE(NULLIF(current_setting('sluice.limit_source', true), ''), 'sql');
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.max_source IS NULL AND NEW.max_concurrency <> 0 THEN NEW.max_source := src; END IF;
        IF NEW.key_source IS NULL AND NEW.key_max IS NOT NULL THEN NEW.key_source := src; END IF;
        IF NEW.rate_source IS NULL AND NEW.rate_max IS NOT NULL THEN NEW.rate_source := src; END IF;
    ELSE
        IF NEW.max_concurrency IS DISTINCT FROM OLD.max_concurrency
           AND NEW.max_source IS NOT DISTINCT FROM OLD.max_source THEN
            NEW.max_source := src;
        END IF;
        IF (NEW.key_max IS DISTINCT FROM OLD.key_max OR NEW.partition_fields IS DISTINCT FROM OLD.partition_fields)
           AND NEW.key_source IS NOT DISTINCT FROM OLD.key_source THEN
            NEW.key_source := src;
        END IF;
        IF (NEW.rate_max IS DISTINCT FROM OLD.rate_max OR NEW.rate_period IS DISTINCT FROM OLD.rate_period
            OR NEW.rate_per_key IS DISTINCT FROM OLD.rate_per_key)
           AND NEW.rate_source IS NOT DISTINCT FROM OLD.rate_source THEN
            NEW.rate_source := src;
        END IF;
    END IF;
    -- A limit that is not there has no source.
    IF NEW.key_max IS NULL THEN NEW.key_source := NULL; END IF;
    IF NEW.rate_max IS NULL THEN NEW.rate_source := NULL; END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- Only statements that change a limit fire it: the counts the workers keep
-- on the row (admitted, has_parked) do not.
CREATE TRIGGER concurrency_limits_sources
    BEFORE INSERT OR UPDATE OF max_concurrency, partition_fields, key_max, rate_max, rate_period, rate_per_key
    ON concurrency_limits
    FOR EACH ROW EXECUTE FUNCTION concurrency_limits_sources();

COMMENT ON TABLE concurrency_limits IS
    'Limits per job kind: max_concurrency (> 0 limit, 0 none, < 0 circuit breaker), key_max per partition key (partition_fields), rate_max starts per rate_period (per key when rate_per_key). Workers read changes within a second.';

-- A job's key in the partition fields: the JSON text of the field's value
-- (a missing field is null), or of the array of the values for several
-- fields: {"customer": "acme"} is "acme" by customer, ["acme", null] by
-- customer,region.
-- +goose StatementBegin
CREATE FUNCTION sluice_partition_key(args jsonb, fields text[]) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path FROM CURRENT AS $$
SELECT CASE
    WHEN fields IS NULL THEN NULL
    WHEN cardinality(fields) = 1 THEN COALESCE(args -> fields[1], 'null'::jsonb)::text
    ELSE (SELECT jsonb_agg(COALESCE(args -> u.f, 'null'::jsonb) ORDER BY u.i)
          FROM unnest(fields) WITH ORDINALITY AS u(f, i))::text
END
$$;
-- +goose StatementEnd

-- The key of a slot and of a parked job (NULL: the kind has no partition).
ALTER TABLE concurrency_executions ADD COLUMN key text;
CREATE INDEX concurrency_executions_kind_key_idx ON concurrency_executions (kind, key) WHERE key IS NOT NULL;

ALTER TABLE concurrency_parked_jobs ADD COLUMN key text;
CREATE INDEX concurrency_parked_jobs_kind_key_job_id_idx ON concurrency_parked_jobs (kind, key, job_id) WHERE key IS NOT NULL;
-- Why a job waits: the per-kind limit (limit, fifo: older jobs of the kind
-- wait, breaker), its key's limit (key_limit, key_fifo: older jobs of the
-- key wait), a rate limit (rate, key_rate), or migrated.
ALTER TABLE concurrency_parked_jobs DROP CONSTRAINT concurrency_parked_jobs_reason_check;
ALTER TABLE concurrency_parked_jobs ADD CONSTRAINT concurrency_parked_jobs_reason_check
    CHECK (reason IN ('limit', 'fifo', 'breaker', 'migrated', 'key_limit', 'key_fifo', 'rate', 'key_rate'));

-- The starts of rate-limited kinds. A row is written when a job is admitted
-- (started_at = its attempted_at), or reserved for a parked job when it is
-- resumed (reserved, started_at = the resume; counted until the job claims
-- it). Rows older than the kind's rate_period go with the next admission.
CREATE TABLE concurrency_starts (
    id         bigserial PRIMARY KEY,
    kind       text NOT NULL,
    key        text,
    job_id     bigint NOT NULL,
    started_at timestamptz NOT NULL,
    reserved   boolean NOT NULL DEFAULT false
);
CREATE INDEX concurrency_starts_kind_started_at_idx ON concurrency_starts (kind, started_at);
CREATE INDEX concurrency_starts_kind_key_started_at_idx ON concurrency_starts (kind, key, started_at) WHERE key IS NOT NULL;
CREATE INDEX concurrency_starts_reserved_job_id_idx ON concurrency_starts (job_id) WHERE reserved;

COMMENT ON TABLE concurrency_starts IS
    'Starts of rate-limited kinds within their rate window (reserved: for a resumed job not fetched yet).';

-- The round across keys: when a key last got a slot from a resume. Resumes
-- serve the keys with waiting jobs least recently served first (a key never
-- served first of all), one job per key per turn. A key leaves the table
-- when it has no waiting job left.
CREATE TABLE concurrency_key_turns (
    kind      text NOT NULL,
    key       text NOT NULL,
    served_at timestamptz NOT NULL,
    PRIMARY KEY (kind, key)
);

-- Limits declared in Go (sluice.Config.Limits), as the workers that start
-- write them: what a limit cleared by SQL falls back to.
CREATE TABLE concurrency_limit_declarations (
    kind             text PRIMARY KEY,
    max_concurrency  integer,
    partition_fields text[],
    key_max          integer,
    rate_max         integer,
    rate_period      interval,
    rate_per_key     boolean NOT NULL DEFAULT false,
    declared_by      text,
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- A new limit row starts with the true counts; has_parked: jobs wait for
-- the kind, not only for their keys.
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

CREATE OR REPLACE VIEW sluice_concurrency_overview AS
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

-- Per kind and key with activity (slots, waiting jobs, or starts in the
-- rate window): the per-key limits and what they hold. A key without
-- activity has no row.
CREATE VIEW sluice_concurrency_keys AS
WITH keys AS (
    SELECT e.kind, e.key FROM concurrency_executions e WHERE e.key IS NOT NULL
    UNION
    SELECT p.kind, p.key FROM concurrency_parked_jobs p WHERE p.key IS NOT NULL
    UNION
    SELECT s.kind, s.key FROM concurrency_starts s
    JOIN concurrency_limits l ON l.kind = s.kind
    WHERE s.key IS NOT NULL AND (s.reserved OR s.started_at > now() - l.rate_period)
)
SELECT
    k.kind,
    k.key,
    l.key_max AS max_per_key,
    CASE WHEN l.rate_per_key THEN l.rate_max END AS rate_max,
    CASE WHEN l.rate_per_key THEN l.rate_period END AS rate_period,
    (SELECT count(*) FROM concurrency_executions e WHERE e.kind = k.kind AND e.key = k.key) AS slots_in_use,
    (SELECT count(*) FROM concurrency_parked_jobs p WHERE p.kind = k.kind AND p.key = k.key) AS parked,
    now() - (SELECT min(p.parked_at) FROM concurrency_parked_jobs p WHERE p.kind = k.kind AND p.key = k.key) AS oldest_parked_age,
    (SELECT count(*) FROM concurrency_starts s
     WHERE s.kind = k.kind AND s.key = k.key AND (s.reserved OR s.started_at > now() - l.rate_period)) AS starts_in_window
FROM keys k
LEFT JOIN concurrency_limits l ON l.kind = k.kind;

CREATE OR REPLACE VIEW sluice_parked_jobs AS
SELECT p.job_id, p.kind, j.queue, j.state, j.priority, j.attempt, j.max_attempts,
       p.reason, p.parked_at, now() - p.parked_at AS waiting, p.worker_id, j.args, p.key
FROM concurrency_parked_jobs p
JOIN river_job j ON j.id = p.job_id;

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION concurrency_limits_init_counts() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    NEW.admitted := (SELECT count(*) FROM concurrency_executions e WHERE e.kind = NEW.kind)
        + (SELECT COALESCE(sum(l.slots), 0) FROM concurrency_leases l WHERE l.kind = NEW.kind);
    NEW.has_parked := EXISTS (SELECT 1 FROM concurrency_parked_jobs p WHERE p.kind = NEW.kind);
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

-- Jobs waiting for a per-key or rate limit keep waiting, as waiting for the
-- kind (whose resume makes them available: the limits they waited for go).
DROP VIEW sluice_parked_jobs;
CREATE VIEW sluice_parked_jobs AS
SELECT p.job_id, p.kind, j.queue, j.state, j.priority, j.attempt, j.max_attempts,
       p.reason, p.parked_at, now() - p.parked_at AS waiting, p.worker_id, j.args
FROM concurrency_parked_jobs p
JOIN river_job j ON j.id = p.job_id;
DROP VIEW sluice_concurrency_keys;
DROP VIEW sluice_concurrency_overview;
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
    now() - (SELECT min(p.parked_at) FROM concurrency_parked_jobs p WHERE p.kind = k.kind) AS oldest_parked_age
FROM kinds k
LEFT JOIN concurrency_limits l ON l.kind = k.kind;

DROP TABLE concurrency_limit_declarations;
DROP TABLE concurrency_key_turns;
DROP TABLE concurrency_starts;
UPDATE concurrency_parked_jobs SET reason = 'fifo' WHERE reason = 'key_fifo';
UPDATE concurrency_parked_jobs SET reason = 'limit' WHERE reason IN ('key_limit', 'rate', 'key_rate');
ALTER TABLE concurrency_parked_jobs DROP CONSTRAINT concurrency_parked_jobs_reason_check;
ALTER TABLE concurrency_parked_jobs ADD CONSTRAINT concurrency_parked_jobs_reason_check
    CHECK (reason IN ('limit', 'fifo', 'breaker', 'migrated'));
DROP INDEX concurrency_parked_jobs_kind_key_job_id_idx;
ALTER TABLE concurrency_parked_jobs DROP COLUMN key;
DROP INDEX concurrency_executions_kind_key_idx;
ALTER TABLE concurrency_executions DROP COLUMN key;
DROP FUNCTION sluice_partition_key(jsonb, text[]);
DROP TRIGGER concurrency_limits_sources ON concurrency_limits;
DROP FUNCTION concurrency_limits_sources();
-- A kind limited only per key or by rate becomes unlimited; so do the
-- parked jobs of kinds without a limit row left (resumed by
-- concurrency_limit.resume).
DELETE FROM concurrency_limits WHERE max_concurrency = 0 AND (key_max IS NOT NULL OR rate_max IS NOT NULL);
UPDATE concurrency_limits l
SET has_parked = EXISTS (SELECT 1 FROM concurrency_parked_jobs p WHERE p.kind = l.kind);
ALTER TABLE concurrency_limits
    DROP CONSTRAINT concurrency_limits_partition_used_check,
    DROP CONSTRAINT concurrency_limits_rate_check,
    DROP CONSTRAINT concurrency_limits_key_max_check,
    DROP CONSTRAINT concurrency_limits_partition_fields_check,
    DROP COLUMN rate_source,
    DROP COLUMN key_source,
    DROP COLUMN max_source,
    DROP COLUMN rate_per_key,
    DROP COLUMN rate_period,
    DROP COLUMN rate_max,
    DROP COLUMN key_max,
    DROP COLUMN partition_fields;
COMMENT ON TABLE concurrency_limits IS
    'Global concurrency limit per job kind. No row or 0 = unlimited; < 0 = circuit breaker (park everything). Workers read changes within a second.';
