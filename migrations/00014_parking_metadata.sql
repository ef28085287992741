-- A job that parked says so in its own metadata, under sluice_parking: the
-- attempt it parked at (attempt, as undone), when that attempt first
-- began to wait (first_at: its fetch), when it last parked (parked_at) and
-- why (reason, as in concurrency_parked_jobs), how many times it parked
-- before this attempt ran (parks), and when it was last resumed
-- (resumed_at). The record outlives the parking (the parking record goes
-- when the job is resumed), so an operator can ask of any job how long it
-- waited, and its work span (package tracing) carries the parking and the
-- resume as events:
--
--   SELECT id, metadata->'sluice_parking' FROM river_job WHERE metadata ? 'sluice_parking';
--
-- A later attempt that parks again starts a record of its own.

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

-- A parked job resumed (pending -> available) records when.
-- +goose StatementBegin
CREATE FUNCTION sluice_parking_resumed() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    NEW.metadata := jsonb_set(NEW.metadata, '{sluice_parking,resumed_at}', to_jsonb(now()));
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER sluice_parking_resumed
    BEFORE UPDATE ON river_job
    FOR EACH ROW
    WHEN (OLD.state = 'pending' AND NEW.state = 'available' AND OLD.metadata ? 'sluice_parking')
    EXECUTE FUNCTION sluice_parking_resumed();

-- +goose Down
DROP TRIGGER sluice_parking_resumed ON river_job;
DROP FUNCTION sluice_parking_resumed();
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION sluice_park_in_place() RETURNS trigger LANGUAGE plpgsql
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
