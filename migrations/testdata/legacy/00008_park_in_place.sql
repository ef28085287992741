-- Park in place: a job of a limited kind that cannot get a slot stays the
-- same river_job row, in River's `pending` state ("made available by some
-- external update"), instead of being completed and inserted again when
-- resumed. Its id, args, queue, priority, tags, metadata, unique key and
-- max_attempts never change, and parking is not an attempt.
--
-- How a job parks, free of the race with River's batched completer: the
-- Limiter middleware marks the running job (metadata key sluice_park) and
-- writes its parking record in one transaction, then returns nil. River's
-- completer later finishes the job with its usual update (running ->
-- completed); the BEFORE trigger sluice_park_in_place below turns exactly
-- that update into running -> pending, undoing the attempt. Until then the
-- job is running as far as every reader is concerned, so no resume can make
-- it available (resume only moves pending rows) and no stale completion can
-- land on a later run: the completion IS the parking.
--
-- Slot leases (concurrency_leases) are the fast path in front of all this:
-- a worker holds slots of a kind in bulk and hands them from job to job in
-- memory; only a job that waits too long for one parks.
--
-- The functions below pin their search_path to the migration's (SET
-- search_path FROM CURRENT): a caller's search_path cannot swap in another
-- table.
--
-- A resume moves pending -> available on the same row; whenever a job
-- leaves pending (resumed, cancelled, retried, deleted), sluice_unpark
-- deletes its parking record, so JobCancel, JobDelete and JobRetry need no
-- help from sluice.

-- +goose Up
DROP VIEW sluice_concurrency_overview;
ALTER TABLE concurrency_parked_jobs RENAME TO concurrency_parked_jobs_v1;
ALTER INDEX concurrency_parked_jobs_kind_id_idx RENAME TO concurrency_parked_jobs_v1_kind_id_idx;

-- Only what the River row does not hold: when and why the job parked.
CREATE TABLE concurrency_parked_jobs (
    -- The river_job.id of the waiting job (state pending; running while its
    -- parking completes).
    job_id    bigint PRIMARY KEY,
    kind      text NOT NULL,
    parked_at timestamptz NOT NULL DEFAULT now(),
    -- limit (no free slot), fifo (older jobs of the kind wait), breaker
    -- (max_concurrency < 0) or migrated (parked by an earlier sluice).
    reason    text NOT NULL CHECK (reason IN ('limit', 'fifo', 'breaker', 'migrated')),
    -- The worker that parked it (NULL: migrated).
    worker_id text
);

-- Resume order: FIFO by job id within a kind.
CREATE INDEX concurrency_parked_jobs_kind_job_id_idx ON concurrency_parked_jobs (kind, job_id);

COMMENT ON TABLE concurrency_parked_jobs IS
    'Jobs waiting for a concurrency slot: job_id is the river_job.id (state pending). Resumed in job_id order within a kind.';

-- Convert the old form. A parked job was a completed river_job (metadata
-- sluice_parked) plus a record holding a copy of it; the original row comes
-- back as pending, its parking attempt undone. Where River's cleaner already
-- deleted the original, the record's copy is inserted as a new pending row
-- (the only case where the waiting job gets a new id); an original that is
-- live again (retried by hand) is the work, and its record is dropped. A
-- converted job whose unique key another live job now holds (possible in the
-- old form) keeps waiting without its unique key, rather than be lost.
-- +goose StatementBegin
DO $$
DECLARE
    rec record;
    new_id bigint;
BEGIN
    FOR rec IN SELECT * FROM concurrency_parked_jobs_v1 ORDER BY id LOOP
        BEGIN
            UPDATE river_job j
            SET state = 'pending',
                finalized_at = NULL,
                attempt = GREATEST(j.attempt - 1, 0),
                attempted_at = CASE WHEN j.attempt - 1 <= 0 THEN NULL ELSE j.attempted_at END,
                attempted_by = j.attempted_by[1:GREATEST(COALESCE(array_length(j.attempted_by, 1), 0) - 1, 0)],
                metadata = j.metadata - 'sluice_parked'
            WHERE j.id = rec.original_job_id AND j.state = 'completed'
            RETURNING j.id INTO new_id;
        EXCEPTION WHEN unique_violation THEN
            UPDATE river_job j
            SET state = 'pending',
                finalized_at = NULL,
                attempt = GREATEST(j.attempt - 1, 0),
                attempted_at = CASE WHEN j.attempt - 1 <= 0 THEN NULL ELSE j.attempted_at END,
                attempted_by = j.attempted_by[1:GREATEST(COALESCE(array_length(j.attempted_by, 1), 0) - 1, 0)],
                metadata = j.metadata - 'sluice_parked',
                unique_key = NULL,
                unique_states = NULL
            WHERE j.id = rec.original_job_id AND j.state = 'completed'
            RETURNING j.id INTO new_id;
            RAISE NOTICE 'sluice: parked job % keeps waiting without its unique key (a duplicate holds it)', rec.original_job_id;
        END;
        IF new_id IS NULL AND EXISTS (SELECT 1 FROM river_job j WHERE j.id = rec.original_job_id) THEN
            -- The original is live again (retried by hand): it is the work.
            CONTINUE;
        END IF;
        IF new_id IS NULL THEN
            INSERT INTO river_job (state, kind, args, queue, priority, max_attempts, tags, metadata, created_at, scheduled_at)
            VALUES ('pending', rec.kind, rec.args, rec.queue, rec.priority, rec.max_attempts, rec.tags,
                    rec.metadata - 'sluice_parked', rec.parked_at, rec.parked_at)
            RETURNING id INTO new_id;
        END IF;
        INSERT INTO concurrency_parked_jobs (job_id, kind, parked_at, reason)
        VALUES (new_id, rec.kind, rec.parked_at, 'migrated');
        new_id := NULL;
    END LOOP;
END
$$;
-- +goose StatementEnd

DROP TABLE concurrency_parked_jobs_v1;

-- The count of parked jobs becomes a flag kept under the limit row's lock:
-- admission reads it with the lock it takes anyway (FIFO: a new job parks
-- behind parked ones). Records leave by trigger (cancel, delete) without the
-- lock, so the flag may stay set a moment longer than a record: the next
-- resume clears it.
ALTER TABLE concurrency_limits DROP COLUMN parked;
ALTER TABLE concurrency_limits ADD COLUMN has_parked boolean NOT NULL DEFAULT false;
UPDATE concurrency_limits l
SET has_parked = EXISTS (SELECT 1 FROM concurrency_parked_jobs p WHERE p.kind = l.kind);

-- Slot leases: a worker takes slots of a kind in bulk and hands them from
-- one of its jobs to the next in memory, so that a busy kind costs no
-- statement per job. Each row is the slots one worker holds; the kind's
-- admitted count includes them. wanted_at is when the worker last asked for
-- more than it got (other holders then keep to a fair share); renewed_at is
-- refreshed while it holds slots, so that a lease whose holder vanished
-- without a liveness row (an embedded client) expires.
CREATE TABLE concurrency_leases (
    kind       text NOT NULL,
    worker_id  text NOT NULL,
    slots      integer NOT NULL DEFAULT 0 CHECK (slots >= 0),
    wanted_at  timestamptz,
    renewed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, worker_id)
);

-- Reserved slots by kind: lease holders look for them every few ms.
CREATE INDEX concurrency_executions_reserved_kind_idx ON concurrency_executions (kind) WHERE reserved;

COMMENT ON TABLE concurrency_leases IS
    'Concurrency slots held in bulk by a worker, per kind; counted in concurrency_limits.admitted.';

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

-- The parking step: River's completion of a job the Limiter marked for
-- parking becomes running -> pending, as if it had never been fetched:
-- attempt, attempted_by and errors are those of before the fetch
-- (attempted_at too when no attempt is left to describe), finalized_at and
-- scheduled_at unchanged. A job whose cancellation was requested meanwhile
-- (JobCancel sets metadata.cancel_attempted_at on a running job) is cancelled
-- instead, never having run, and its parking record goes. The same holds when
-- the job is rescued (River's rescuer, the liveness reaper) before its
-- completion lands: it never ran.
-- +goose StatementBegin
CREATE FUNCTION sluice_park_in_place() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    NEW.metadata := NEW.metadata - 'sluice_park';
    NEW.attempt := GREATEST(OLD.attempt - 1, 0);
    NEW.attempted_by := OLD.attempted_by[1:GREATEST(COALESCE(array_length(OLD.attempted_by, 1), 0) - 1, 0)];
    NEW.errors := OLD.errors;
    IF NEW.attempt = 0 THEN
        NEW.attempted_at := NULL;
    END IF;
    IF OLD.metadata ? 'cancel_attempted_at' THEN
        NEW.state := 'cancelled';
        NEW.finalized_at := COALESCE(NEW.finalized_at, now());
        DELETE FROM concurrency_parked_jobs WHERE job_id = OLD.id;
    ELSE
        NEW.state := 'pending';
        NEW.finalized_at := NULL;
        NEW.scheduled_at := OLD.scheduled_at;
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- Every other update of river_job stops at the WHEN clause. Named so that it
-- runs before sluice_worker_fence (BEFORE triggers fire in name order): a
-- reaped worker's late completion is still dropped by the fence.
CREATE TRIGGER sluice_park_in_place
    BEFORE UPDATE ON river_job
    FOR EACH ROW
    WHEN (OLD.state = 'running' AND NEW.state <> 'running' AND OLD.metadata ? 'sluice_park')
    EXECUTE FUNCTION sluice_park_in_place();

-- A job leaving pending (resumed, cancelled, retried) or deleted while
-- pending is no longer parked.
-- +goose StatementBegin
CREATE FUNCTION sluice_unpark() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    DELETE FROM concurrency_parked_jobs WHERE job_id = OLD.id;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER sluice_unpark
    AFTER UPDATE ON river_job
    FOR EACH ROW
    WHEN (OLD.state = 'pending' AND NEW.state <> 'pending')
    EXECUTE FUNCTION sluice_unpark();

CREATE TRIGGER sluice_unpark_deleted
    AFTER DELETE ON river_job
    FOR EACH ROW
    WHEN (OLD.state = 'pending')
    EXECUTE FUNCTION sluice_unpark();

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

-- Parked jobs with their River rows, oldest first within a kind.
CREATE VIEW sluice_parked_jobs AS
SELECT p.job_id, p.kind, j.queue, j.state, j.priority, j.attempt, j.max_attempts,
       p.reason, p.parked_at, now() - p.parked_at AS waiting, p.worker_id, j.args
FROM concurrency_parked_jobs p
JOIN river_job j ON j.id = p.job_id;

-- +goose Down
-- Back to the old form, keeping every waiting job: each parked (pending) job
-- becomes a completed row marked sluice_parked plus a record holding its
-- copy, as the earlier sluice expects. A job still completing its parking
-- (running, marked sluice_park) cannot be converted: stop the workers first.
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM river_job WHERE state = 'running' AND metadata ? 'sluice_park') THEN
        RAISE EXCEPTION 'sluice: jobs are being parked right now; stop every sluice worker, then migrate down again';
    END IF;
END
$$;
-- +goose StatementEnd

DROP VIEW sluice_parked_jobs;
DROP VIEW sluice_concurrency_overview;
-- Leases are only held by running workers (which the earlier sluice does
-- not know): their slots are simply no longer counted.
DROP TABLE concurrency_leases;
DROP INDEX concurrency_executions_reserved_kind_idx;
DROP TRIGGER sluice_unpark_deleted ON river_job;
DROP TRIGGER sluice_unpark ON river_job;
DROP FUNCTION sluice_unpark();
DROP TRIGGER sluice_park_in_place ON river_job;
DROP FUNCTION sluice_park_in_place();

ALTER TABLE concurrency_parked_jobs RENAME TO concurrency_parked_jobs_v2;
ALTER INDEX concurrency_parked_jobs_kind_job_id_idx RENAME TO concurrency_parked_jobs_v2_kind_job_id_idx;

CREATE TABLE concurrency_parked_jobs (
    id              bigserial PRIMARY KEY,
    kind            text NOT NULL,
    args            jsonb NOT NULL,
    queue           text NOT NULL,
    priority        smallint NOT NULL,
    max_attempts    smallint NOT NULL,
    tags            text[] NOT NULL DEFAULT '{}',
    metadata        jsonb NOT NULL DEFAULT '{}'::jsonb,
    original_job_id bigint NOT NULL UNIQUE,
    parked_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX concurrency_parked_jobs_kind_id_idx ON concurrency_parked_jobs (kind, id);

INSERT INTO concurrency_parked_jobs (kind, args, queue, priority, max_attempts, tags, metadata, original_job_id, parked_at)
SELECT j.kind, j.args, j.queue, j.priority, j.max_attempts, COALESCE(j.tags, '{}'), j.metadata, j.id, p.parked_at
FROM concurrency_parked_jobs_v2 p
JOIN river_job j ON j.id = p.job_id AND j.state = 'pending'
ORDER BY p.kind, p.job_id;

UPDATE river_job j
SET state = 'completed',
    finalized_at = now(),
    metadata = j.metadata || jsonb_build_object('sluice_parked', jsonb_build_object('at', p.parked_at, 'worker_id', p.worker_id))
FROM concurrency_parked_jobs_v2 p
WHERE j.id = p.job_id AND j.state = 'pending';

DROP TABLE concurrency_parked_jobs_v2;

ALTER TABLE concurrency_limits DROP COLUMN has_parked;
ALTER TABLE concurrency_limits ADD COLUMN parked bigint NOT NULL DEFAULT 0;
UPDATE concurrency_limits l
SET parked = (SELECT count(*) FROM concurrency_parked_jobs p WHERE p.kind = l.kind),
    admitted = (SELECT count(*) FROM concurrency_executions e WHERE e.kind = l.kind);

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION concurrency_limits_init_counts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.admitted := (SELECT count(*) FROM concurrency_executions e WHERE e.kind = NEW.kind);
    NEW.parked := (SELECT count(*) FROM concurrency_parked_jobs p WHERE p.kind = NEW.kind);
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

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
