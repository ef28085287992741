-- The limiter's ledger (limiter/internal/ledger): every key of a
-- partitioned kind with slots or waiting jobs has a row of its own, which
-- holds its count of slots, whether jobs of it wait in the line, and its
-- turn in the round across keys. Under per-key limits alone the row is
-- the key's lock: decisions and releases of different keys take
-- different locks, and none of the kind's. The kind's count of slots
-- (concurrency_limits.admitted) is kept only while a per-kind limit needs
-- it (NULL otherwise): under per-key limits alone no transaction locks the
-- kind's row.

-- +goose Up
CREATE TABLE concurrency_key_lines (
    kind      text NOT NULL,
    -- The partition key (sluice_partition_key of the job's args).
    key       text NOT NULL,
    -- The slot rows of the key (admitted and reserved).
    slots     integer NOT NULL DEFAULT 0 CHECK (slots >= 0),
    -- Jobs of the key wait in the line without a grant (waiting in a
    -- worker, parked or resumed ahead), as the last transaction of the key
    -- left it: a grant round that finds none clears it.
    waiting   boolean NOT NULL DEFAULT false,
    -- When the key was last granted a slot; NULL: not since it began to
    -- wait (first in the round).
    served_at timestamptz,
    PRIMARY KEY (kind, key)
);

-- The round across keys: the keys with waiting jobs, served longest ago
-- first.
CREATE INDEX concurrency_key_lines_round_idx ON concurrency_key_lines (kind, served_at NULLS FIRST, key) WHERE waiting;

COMMENT ON TABLE concurrency_key_lines IS
    'One row per key of a partitioned kind with slots or waiting jobs: its slot count, whether jobs of it wait, and its turn in the round across keys (its lock under per-key limits alone).';

INSERT INTO concurrency_key_lines (kind, key, slots, waiting, served_at)
SELECT k.kind, k.key,
       (SELECT count(*) FROM concurrency_executions e WHERE e.kind = k.kind AND e.key = k.key),
       EXISTS (SELECT 1 FROM concurrency_waiters w WHERE w.kind = k.kind AND w.key = k.key)
           OR EXISTS (SELECT 1 FROM concurrency_parked_jobs p WHERE p.kind = k.kind AND p.key = k.key),
       (SELECT t.served_at FROM concurrency_key_turns t WHERE t.kind = k.kind AND t.key = k.key)
FROM (
    SELECT kind, key FROM concurrency_executions WHERE key IS NOT NULL
    UNION SELECT kind, key FROM concurrency_waiters WHERE key IS NOT NULL
    UNION SELECT kind, key FROM concurrency_parked_jobs WHERE key IS NOT NULL
) k;

DROP TABLE concurrency_key_turns;

-- The slots of a kind's key, and the reserved slots of a key (a grant on
-- its way to its job).
DROP INDEX concurrency_executions_kind_key_idx;
CREATE INDEX concurrency_executions_kind_key_idx ON concurrency_executions (kind, key, reserved) WHERE key IS NOT NULL;

-- admitted: the kind's slot rows and leased slots, kept while it has a
-- per-kind limit (max_concurrency <> 0); NULL otherwise.
ALTER TABLE concurrency_limits ALTER COLUMN admitted DROP NOT NULL;
ALTER TABLE concurrency_limits ALTER COLUMN admitted DROP DEFAULT;
UPDATE concurrency_limits SET admitted = NULL WHERE max_concurrency = 0;

-- The counts of a new row (made under the kind's ledger lock, whoever
-- inserts it), and the kind's count of slots when a per-kind limit is set
-- or removed by any SQL (the CLI's changes recount in the ledger's own
-- transaction).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION concurrency_limits_init_counts() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        -- The kind's ledger lock (LedgerLockKinds): the new row's counts are
        -- not made while a ledger transaction of the kind changes slots.
        PERFORM pg_advisory_xact_lock(hashtextextended('sluice.limit_row:' || NEW.kind, 0));
    END IF;
    IF TG_OP = 'INSERT' OR (OLD.max_concurrency = 0) <> (NEW.max_concurrency = 0) THEN
        NEW.admitted := CASE WHEN NEW.max_concurrency <> 0 THEN
            (SELECT count(*) FROM concurrency_executions e WHERE e.kind = NEW.kind)
            + (SELECT COALESCE(sum(l.slots), 0) FROM concurrency_leases l WHERE l.kind = NEW.kind)
        END;
    END IF;
    IF TG_OP = 'INSERT' THEN
        NEW.has_parked := EXISTS (SELECT 1 FROM concurrency_parked_jobs p
                                  WHERE p.kind = NEW.kind AND p.reason NOT IN ('key_limit', 'key_fifo', 'key_rate'))
            OR EXISTS (SELECT 1 FROM concurrency_waiters w
                       WHERE w.kind = NEW.kind AND w.reason NOT IN ('key_limit', 'key_fifo', 'key_rate'));
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd
DROP TRIGGER concurrency_limits_init_counts ON concurrency_limits;
CREATE TRIGGER concurrency_limits_init_counts BEFORE INSERT OR UPDATE OF max_concurrency ON concurrency_limits
    FOR EACH ROW EXECUTE FUNCTION concurrency_limits_init_counts();

-- A job resumed ahead of a free slot that steps back (marked sluice_park
-- "ahead": an older job of its line holds a grant and waits to be
-- fetched, and its worker's River slot is for it) goes back to available
-- when River completes it, its attempt undone, still in the line.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION sluice_park_in_place() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
DECLARE
    prev jsonb := OLD.metadata->'sluice_parking';
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
        DELETE FROM concurrency_waiters WHERE job_id = OLD.id;
    ELSIF OLD.metadata->>'sluice_park' = 'ahead' THEN
        NEW.state := 'available';
        NEW.finalized_at := NULL;
        NEW.scheduled_at := OLD.scheduled_at;
    ELSE
        NEW.state := 'pending';
        NEW.finalized_at := NULL;
        NEW.scheduled_at := OLD.scheduled_at;
        IF prev IS NULL OR (prev->>'attempt')::integer IS DISTINCT FROM NEW.attempt THEN
            prev := jsonb_build_object('attempt', NEW.attempt, 'first_at', OLD.attempted_at, 'parks', 0);
        END IF;
        NEW.metadata := NEW.metadata || jsonb_build_object('sluice_parking', prev || jsonb_build_object(
            'parked_at', now(),
            'parks', COALESCE((prev->>'parks')::integer, 0) + 1,
            'reason', (SELECT p.reason FROM concurrency_parked_jobs p WHERE p.job_id = OLD.id)));
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION sluice_park_in_place() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
DECLARE
    prev jsonb := OLD.metadata->'sluice_parking';
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
        IF prev IS NULL OR (prev->>'attempt')::integer IS DISTINCT FROM NEW.attempt THEN
            prev := jsonb_build_object('attempt', NEW.attempt, 'first_at', OLD.attempted_at, 'parks', 0);
        END IF;
        NEW.metadata := NEW.metadata || jsonb_build_object('sluice_parking', prev || jsonb_build_object(
            'parked_at', now(),
            'parks', COALESCE((prev->>'parks')::integer, 0) + 1,
            'reason', (SELECT p.reason FROM concurrency_parked_jobs p WHERE p.job_id = OLD.id)));
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd
DROP TRIGGER concurrency_limits_init_counts ON concurrency_limits;
CREATE TRIGGER concurrency_limits_init_counts BEFORE INSERT ON concurrency_limits
    FOR EACH ROW EXECUTE FUNCTION concurrency_limits_init_counts();
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
UPDATE concurrency_limits l
SET admitted = (SELECT count(*) FROM concurrency_executions e WHERE e.kind = l.kind)
    + (SELECT COALESCE(sum(cl.slots), 0) FROM concurrency_leases cl WHERE cl.kind = l.kind)
WHERE admitted IS NULL;
ALTER TABLE concurrency_limits ALTER COLUMN admitted SET DEFAULT 0;
ALTER TABLE concurrency_limits ALTER COLUMN admitted SET NOT NULL;

DROP INDEX concurrency_executions_kind_key_idx;
CREATE INDEX concurrency_executions_kind_key_idx ON concurrency_executions (kind, key) WHERE key IS NOT NULL;

CREATE TABLE concurrency_key_turns (
    kind      text NOT NULL,
    key       text NOT NULL,
    served_at timestamptz,
    PRIMARY KEY (kind, key)
);
CREATE INDEX concurrency_key_turns_round_idx ON concurrency_key_turns (kind, served_at NULLS FIRST, key);
INSERT INTO concurrency_key_turns (kind, key, served_at)
SELECT kind, key, served_at FROM concurrency_key_lines WHERE waiting;
DROP TABLE concurrency_key_lines;
