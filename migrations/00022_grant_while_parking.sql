-- A job whose parking is still being completed (marked sluice_park in its
-- worker, its row running until River's batch completer writes it, up to
-- 250 ms later) may be given its key's turn by a grant round of a kind
-- whose kind-wide limit holds several keys back, when the alternative is
-- a second turn for another key (the fairness promise): the round reserves
-- its slot and marks it sluice_park "granted". River's completion then
-- parks it as any other (pending, its parking recorded), and
-- sluice_step_back, in the same statement, resumes it (available, its
-- River producer woken) when its grant still stands, or leaves it parked
-- (the mark cleared) when a change of limits or an older job took the
-- grant back. River sees the row pending, as for any parking. One
-- cancelled meanwhile gives its reserved slot and start back as River's
-- completion cancels it.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION sluice_park_in_place() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
DECLARE
    prev jsonb := OLD.metadata->'sluice_parking';
    freed_key text;
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
        -- Granted as its parking completed, and cancelled: the slot and the
        -- start reserved for it go back now (the next grant round gives
        -- them on), with the counts, under the kind's lock as the ledger
        -- takes it (hashtextextended('sluice.limit_row:' || kind, 0)). The
        -- lock is tried, never waited for, so that River's completion
        -- never waits for a grant round nor deadlocks with one; what this
        -- leaves, the safety net frees.
        IF OLD.metadata->>'sluice_park' = 'granted'
           AND pg_try_advisory_xact_lock(hashtextextended('sluice.limit_row:' || OLD.kind, 0)) THEN
            DELETE FROM concurrency_executions e WHERE e.job_id = OLD.id AND e.reserved RETURNING e.key INTO freed_key;
            IF FOUND THEN
                UPDATE concurrency_limits l SET admitted = GREATEST(l.admitted - 1, 0)
                WHERE l.kind = OLD.kind AND l.admitted IS NOT NULL;
                IF freed_key IS NOT NULL THEN
                    UPDATE concurrency_key_lines kl SET slots = GREATEST(kl.slots - 1, 0)
                    WHERE kl.kind = OLD.kind AND kl.key = freed_key;
                    DELETE FROM concurrency_key_lines kl
                    WHERE kl.kind = OLD.kind AND kl.key = freed_key AND kl.slots = 0 AND NOT kl.waiting;
                END IF;
            END IF;
            DELETE FROM concurrency_starts s WHERE s.job_id = OLD.id AND s.reserved;
        END IF;
    ELSIF OLD.metadata->>'sluice_park' = 'ahead' THEN
        NEW.state := 'pending';
        NEW.metadata := NEW.metadata || '{"sluice_park": "ahead"}';
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
        IF OLD.metadata->>'sluice_park' = 'granted' THEN
            NEW.metadata := NEW.metadata || '{"sluice_park": "granted"}';
        END IF;
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION sluice_step_back() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    IF NEW.metadata->>'sluice_park' = 'granted' THEN
        IF EXISTS (SELECT 1 FROM concurrency_executions e WHERE e.job_id = NEW.id AND e.reserved)
           OR EXISTS (SELECT 1 FROM concurrency_starts s WHERE s.job_id = NEW.id AND s.reserved) THEN
            UPDATE river_job SET state = 'available', metadata = metadata - 'sluice_park'
            WHERE id = NEW.id AND state = 'pending';
            PERFORM pg_notify(TG_TABLE_SCHEMA || '.river_insert', json_build_object('queue', NEW.queue)::text);
        ELSE
            UPDATE river_job SET metadata = metadata - 'sluice_park'
            WHERE id = NEW.id AND state = 'pending';
        END IF;
        RETURN NULL;
    END IF;
    UPDATE river_job SET state = 'available', metadata = metadata - 'sluice_park'
    WHERE id = NEW.id AND state = 'pending' AND metadata->>'sluice_park' = 'ahead';
    RETURN NULL;
END
$$;
-- +goose StatementEnd

DROP TRIGGER sluice_step_back ON river_job;
CREATE TRIGGER sluice_step_back
    AFTER UPDATE ON river_job
    FOR EACH ROW
    WHEN (OLD.state = 'running' AND NEW.state = 'pending' AND NEW.metadata->>'sluice_park' IN ('ahead', 'granted'))
    EXECUTE FUNCTION sluice_step_back();

-- +goose Down
DROP TRIGGER sluice_step_back ON river_job;
CREATE TRIGGER sluice_step_back
    AFTER UPDATE ON river_job
    FOR EACH ROW
    WHEN (OLD.state = 'running' AND NEW.state = 'pending' AND NEW.metadata->>'sluice_park' = 'ahead')
    EXECUTE FUNCTION sluice_step_back();
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION sluice_step_back() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    UPDATE river_job SET state = 'available', metadata = metadata - 'sluice_park'
    WHERE id = NEW.id AND state = 'pending' AND metadata->>'sluice_park' = 'ahead';
    RETURN NULL;
END
$$;
-- +goose StatementEnd
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
        NEW.state := 'pending';
        NEW.metadata := NEW.metadata || '{"sluice_park": "ahead"}';
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
