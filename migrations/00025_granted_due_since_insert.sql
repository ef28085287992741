-- A job granted as its parking completed (sluice_park "granted", migration
-- 00022), which sluice_step_back makes available once River's completion
-- has parked it, is due since its insert, as a parked job that a grant
-- resumes (LedgerGrantParked) or one resumed ahead of a free slot
-- (LedgerResumeAhead): its scheduled_at moves no later than its
-- created_at. River fetches by (priority, scheduled_at, id), and a job
-- granted after a snooze or a retry keeps a later scheduled_at: without
-- this, younger jobs of its line granted after it were fetched, and began,
-- first. Nothing else changes.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION sluice_step_back() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    IF NEW.metadata->>'sluice_park' = 'granted' THEN
        IF EXISTS (SELECT 1 FROM concurrency_executions e WHERE e.job_id = NEW.id AND e.reserved)
           OR EXISTS (SELECT 1 FROM concurrency_starts s WHERE s.job_id = NEW.id AND s.reserved) THEN
            UPDATE river_job
            SET state = 'available', metadata = metadata - 'sluice_park', scheduled_at = LEAST(scheduled_at, created_at)
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

-- +goose Down
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
