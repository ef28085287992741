-- A job resumed ahead of a free slot that steps back after River's
-- executors got it (marked sluice_park "ahead") did not fail, and a River
-- client subscribed to its events must not hear that it did. River's
-- completer maps a row it returns as available after a completion to
-- EventKindJobFailed (and emits nothing for a row it returns as pending).
-- So sluice_park_in_place now makes such a job pending, still marked, as
-- River's statement returns it; and sluice_step_back, an AFTER trigger
-- that runs once that statement is done, makes it available, in the same
-- transaction: no other transaction ever sees it pending.

-- +goose Up
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

-- +goose StatementBegin
CREATE FUNCTION sluice_step_back() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    UPDATE river_job SET state = 'available', metadata = metadata - 'sluice_park'
    WHERE id = NEW.id AND state = 'pending' AND metadata->>'sluice_park' = 'ahead';
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER sluice_step_back
    AFTER UPDATE ON river_job
    FOR EACH ROW
    WHEN (OLD.state = 'running' AND NEW.state = 'pending' AND NEW.metadata->>'sluice_park' = 'ahead')
    EXECUTE FUNCTION sluice_step_back();

-- +goose Down
DROP TRIGGER sluice_step_back ON river_job;
DROP FUNCTION sluice_step_back();
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
