-- Worker liveness: every worker declares how long after its last heartbeat it
-- counts as dead (dead_after); a reaper on the live workers rescues a dead
-- worker's running River jobs and concurrency slots and deletes its row.
-- A worker that was only slow (paused, partitioned) and comes back is fenced:
-- its sessions carry the custom settings sluice.worker_id and
-- sluice.worker_incarnation, and a BEFORE trigger drops the changes such a
-- session makes to jobs and slots that are no longer its own once its row
-- (id and incarnation) is gone.

-- +goose Up
ALTER TABLE sluice_workers
    -- How long after heartbeat_at the worker counts as dead (its
    -- --dead-after, at least three heartbeat intervals). Each worker is judged
    -- by its own value.
    ADD COLUMN dead_after interval NOT NULL DEFAULT interval '30 seconds'
        CHECK (dead_after > interval '0'),
    -- A random token of the process that owns the row: a process that reuses
    -- an id (--id) gets a new incarnation, so the fence tells them apart.
    ADD COLUMN incarnation text NOT NULL DEFAULT '',
    -- The application_name of the worker's connections when it is unique to
    -- the worker ('sluice worker <id>'); NULL when the connection string sets
    -- its own. The reaper terminates a dead worker's remaining backends by it.
    ADD COLUMN backend_name text;

COMMENT ON COLUMN sluice_workers.dead_after IS
    'The worker counts as dead when heartbeat_at is older than this; the reaper of a live worker then rescues its running jobs and slots and deletes the row.';

-- Workers with their liveness. live: heartbeat younger than three heartbeat
-- intervals (as before); dead: heartbeat older than the worker's dead_after
-- (the reaper will rescue its jobs and delete the row); status: live, late
-- (missed heartbeats, not dead yet) or dead; running_jobs: River jobs in
-- state running whose current attempt is the worker's.
CREATE OR REPLACE VIEW sluice_worker_status AS
SELECT
    w.id,
    w.host,
    w.pid,
    w.started_at,
    w.heartbeat_at,
    now() - w.heartbeat_at AS heartbeat_age,
    w.heartbeat_interval,
    w.heartbeat_at > now() - 3 * w.heartbeat_interval AS live,
    w.poll_interval,
    w.dispatcher_tick_at,
    now() - w.dispatcher_tick_at AS dispatcher_tick_age,
    COALESCE(w.poll_interval IS NOT NULL
        AND w.heartbeat_at > now() - 3 * w.heartbeat_interval
        AND COALESCE(w.dispatcher_tick_at, w.started_at) > now() - 3 * (w.heartbeat_interval + w.poll_interval),
        false) AS dispatcher_fresh,
    w.dead_after,
    w.heartbeat_at < now() - w.dead_after AS dead,
    CASE
        WHEN w.heartbeat_at < now() - w.dead_after THEN 'dead'
        WHEN w.heartbeat_at > now() - 3 * w.heartbeat_interval THEN 'live'
        ELSE 'late'
    END AS status,
    (SELECT count(*) FROM river_job j
     WHERE j.state = 'running'
       AND j.attempted_by[array_upper(j.attempted_by, 1)] = w.id) AS running_jobs
FROM sluice_workers w;

-- The fence. Called (through the WHEN clauses below) only when a session
-- that names a worker (sluice.worker_id) finishes a running job whose
-- current attempt belongs to another worker, or deletes another worker's
-- concurrency slot: River's rescuer and the reaper on a live worker do so
-- legitimately; a worker that was reaped (its row and incarnation gone)
-- must not: its change of the row is skipped (RETURN NULL), so the late
-- completion of a rescued job's earlier attempt cannot overwrite the state
-- of the attempt now running elsewhere, nor free that attempt's slot.
-- +goose StatementBegin
CREATE FUNCTION sluice_worker_fence() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    me text := current_setting('sluice.worker_id', true);
BEGIN
    IF me IS NULL OR me = '' OR EXISTS (
        SELECT 1 FROM sluice_workers w
        WHERE w.id = me
          AND w.incarnation = COALESCE(current_setting('sluice.worker_incarnation', true), '')) THEN
        IF TG_OP = 'DELETE' THEN
            RETURN OLD;
        END IF;
        RETURN NEW;
    END IF;
    RAISE WARNING 'sluice: % of %.% row % by reaped worker % skipped (fenced)',
        lower(TG_OP), TG_TABLE_SCHEMA, TG_TABLE_NAME,
        CASE WHEN TG_OP = 'DELETE' THEN to_jsonb(OLD) ->> 'job_id' ELSE to_jsonb(NEW) ->> 'id' END,
        me;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- River's own completion of a job by the worker running it (its attempt's
-- owner is the session's worker) and every fetch stop at the WHEN clause: no
-- function call. Sessions without sluice.worker_id (the CLI, psql, other
-- River clients) are never fenced (the comparison with NULL is not true).
CREATE TRIGGER sluice_worker_fence
    BEFORE UPDATE ON river_job
    FOR EACH ROW
    WHEN (OLD.state = 'running'
          AND NEW.state <> 'running'
          AND OLD.attempted_by[array_upper(OLD.attempted_by, 1)] <> current_setting('sluice.worker_id', true))
    EXECUTE FUNCTION sluice_worker_fence();

-- Only another worker's slot goes through the function: a worker releasing
-- its own slot (worker_id is its id), the reserved slot of a resumed job
-- (worker_id NULL: when its job was rescued, the reaper deleted it, and a
-- later attempt's slot names the worker running it), and sessions that name
-- no worker pay the WHEN clause only.
CREATE TRIGGER sluice_worker_fence
    BEFORE DELETE ON concurrency_executions
    FOR EACH ROW
    WHEN (OLD.worker_id <> current_setting('sluice.worker_id', true))
    EXECUTE FUNCTION sluice_worker_fence();

-- Terminates the backends named app_name (a dead worker's connections) in
-- this database (another database's workers may use the same ids), except
-- the caller's own, waiting up to wait_ms for each to exit, and
-- returns how many ended. A backend this role may not signal is skipped
-- with a warning instead of failing the caller's transaction.
-- +goose StatementBegin
CREATE FUNCTION sluice_terminate_backends(app_name text, wait_ms bigint) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    target integer;
    ended integer := 0;
BEGIN
    IF app_name IS NULL OR app_name = '' THEN
        RETURN 0;
    END IF;
    FOR target IN
        SELECT a.pid FROM pg_catalog.pg_stat_activity a
        WHERE a.application_name = app_name
          AND a.datname = current_database()
          AND a.pid <> pg_backend_pid()
    LOOP
        BEGIN
            IF pg_terminate_backend(target, wait_ms) THEN
                ended := ended + 1;
            END IF;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE WARNING 'sluice: may not terminate backend % (%): %', target, app_name, SQLERRM;
        END;
    END LOOP;
    RETURN ended;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION sluice_terminate_backends(text, bigint);
DROP TRIGGER sluice_worker_fence ON concurrency_executions;
DROP TRIGGER sluice_worker_fence ON river_job;
DROP FUNCTION sluice_worker_fence();
DROP VIEW sluice_worker_status;
CREATE VIEW sluice_worker_status AS
SELECT
    id,
    host,
    pid,
    started_at,
    heartbeat_at,
    now() - heartbeat_at AS heartbeat_age,
    heartbeat_interval,
    heartbeat_at > now() - 3 * heartbeat_interval AS live,
    poll_interval,
    dispatcher_tick_at,
    now() - dispatcher_tick_at AS dispatcher_tick_age,
    COALESCE(poll_interval IS NOT NULL
        AND heartbeat_at > now() - 3 * heartbeat_interval
        AND COALESCE(dispatcher_tick_at, started_at) > now() - 3 * (heartbeat_interval + poll_interval),
        false) AS dispatcher_fresh
FROM sluice_workers;
ALTER TABLE sluice_workers
    DROP COLUMN backend_name,
    DROP COLUMN incarnation,
    DROP COLUMN dead_after;
