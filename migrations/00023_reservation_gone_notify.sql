-- A job granted a slot (or a start) that it has not claimed yet — resumed
-- and available, or granted as its parking completed — may be deleted
-- (River's JobDelete) or cancelled (JobCancel) before a worker fetches it.
-- Its reservation must then go back to the line at once: its key (or its
-- kind) is otherwise held for nobody until the safety net runs (every
-- second while jobs of the kind are parked, else every minute).
--
-- The trigger below runs in River's own transaction, so it frees nothing
-- itself: freeing takes the kind's lock, which a ledger transaction
-- (LedgerStealGrants) takes before the job's row, the other way round. It
-- only reads whether the job held a reservation, and if so notifies
-- sluice_reservations with the job's kind when the transaction commits;
-- every worker LISTENs and runs the safety net's work on the kind
-- (ledger.CleanUp: the reservation freed under the kind's lock, and a
-- grant round giving it on). Every other change of river_job stops at the
-- triggers' WHEN clauses: the cleaner deletes only finalized jobs, and
-- River's completer finalizes running jobs, most of them without a mark.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION sluice_reservation_gone() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM concurrency_executions e WHERE e.job_id = OLD.id AND e.reserved)
       OR EXISTS (SELECT 1 FROM concurrency_starts s WHERE s.job_id = OLD.id AND s.reserved) THEN
        PERFORM pg_notify('sluice_reservations', OLD.kind);
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- A job deleted before it finished (River's JobDelete refuses running
-- jobs; plain SQL may not).
CREATE TRIGGER sluice_reservation_gone_delete
    AFTER DELETE ON river_job
    FOR EACH ROW
    WHEN (OLD.state NOT IN ('completed', 'cancelled', 'discarded'))
    EXECUTE FUNCTION sluice_reservation_gone();

-- A job cancelled or discarded while available (resumed, not fetched yet),
-- or as its parking completed (marked sluice_park: a grant given then is
-- freed by sluice_park_in_place when it gets the kind's lock at once, and
-- is left here otherwise).
CREATE TRIGGER sluice_reservation_gone_finalize
    AFTER UPDATE OF state ON river_job
    FOR EACH ROW
    WHEN (NEW.state IN ('cancelled', 'discarded')
          AND (OLD.state = 'available' OR (OLD.state = 'running' AND OLD.metadata ? 'sluice_park')))
    EXECUTE FUNCTION sluice_reservation_gone();

-- +goose Down
DROP TRIGGER sluice_reservation_gone_finalize ON river_job;
DROP TRIGGER sluice_reservation_gone_delete ON river_job;
DROP FUNCTION sluice_reservation_gone();
