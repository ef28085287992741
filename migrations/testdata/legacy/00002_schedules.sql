-- The durable scheduler's source of truth: one row per schedule. Rows come
-- from migrations (the defaults of the built-in maintenance kinds, inserted by
-- the migration of each kind), from `sluice schedule add`, or from plain SQL.
-- Also the worker heartbeat table (sluice_workers), the scheduler's settings,
-- and the views sluice_schedule_status and sluice_worker_status.

-- +goose Up
CREATE TABLE schedules (
    id            bigserial PRIMARY KEY,
    name          text NOT NULL UNIQUE CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$'),
    cron          text NOT NULL,
    timezone      text NOT NULL DEFAULT 'UTC',
    kind          text NOT NULL,
    args          jsonb NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(args) = 'object'),
    -- NULL: the kind's own queue.
    queue         text,
    enabled       boolean NOT NULL DEFAULT true,
    status        text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'failed')),
    misfire       text NOT NULL DEFAULT 'run_once' CHECK (misfire IN ('run_once', 'skip', 'run_all')),
    -- NULL: not computed yet; the dispatcher computes it from cron and
    -- timezone the first time it sees the row (so SQL and migrations can
    -- insert rows without evaluating cron).
    next_run_at   timestamptz,
    -- The due time of the latest run dispatched (for a trigger: its time).
    last_run_at   timestamptz,
    last_job_id   bigint,
    run_count     bigint NOT NULL DEFAULT 0,
    failure_count integer NOT NULL DEFAULT 0,
    max_retries   integer NOT NULL DEFAULT 5 CHECK (max_retries >= 0),
    last_error    text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    -- While a failed dispatch is retried (next_run_at pushed out with
    -- backoff), the due time the retry is for; NULL otherwise.
    retry_due_at       timestamptz,
    -- When the latest run was inserted (its lag is last_dispatched_at -
    -- last_run_at).
    last_dispatched_at timestamptz
);

COMMENT ON TABLE schedules IS
    'Durable schedules: the dispatcher of every sluice worker inserts one River job per due time. next_run_at NULL means "compute from cron".';

-- The dispatcher's claim (ORDER BY next_run_at ... FOR UPDATE SKIP LOCKED)
-- and its idle check (min(next_run_at), an index-only scan of one entry).
CREATE INDEX schedules_due_idx ON schedules (next_run_at) WHERE enabled AND status = 'active';
-- Rows whose next_run_at the dispatcher has to compute (index-only EXISTS).
CREATE INDEX schedules_uninitialised_idx ON schedules (id) WHERE next_run_at IS NULL;
-- Failed schedules, for health checks.
CREATE INDEX schedules_failed_idx ON schedules (name) WHERE status = 'failed';

-- A change of cron or timezone recomputes next_run_at from now (the
-- dispatcher computes it) unless the same UPDATE sets next_run_at itself;
-- status failed -> active resets failure_count. updated_at follows changes
-- of the definition, not the dispatcher's bookkeeping.
-- +goose StatementBegin
CREATE FUNCTION sluice_schedules_before_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.next_run_at IS NOT DISTINCT FROM OLD.next_run_at
       AND (NEW.cron IS DISTINCT FROM OLD.cron OR NEW.timezone IS DISTINCT FROM OLD.timezone) THEN
        NEW.next_run_at := NULL;
        NEW.retry_due_at := NULL;
    END IF;
    IF NEW.status = 'active' AND OLD.status = 'failed' THEN
        NEW.failure_count := 0;
    END IF;
    IF (NEW.name, NEW.cron, NEW.timezone, NEW.kind, NEW.args, NEW.queue, NEW.enabled,
        NEW.status, NEW.misfire, NEW.max_retries)
       IS DISTINCT FROM
       (OLD.name, OLD.cron, OLD.timezone, OLD.kind, OLD.args, OLD.queue, OLD.enabled,
        OLD.status, OLD.misfire, OLD.max_retries) THEN
        NEW.updated_at := now();
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- Only for changes of the definition: the dispatcher's bookkeeping updates
-- (thousands of rows a second) skip the function call.
CREATE TRIGGER schedules_before_update BEFORE UPDATE ON schedules
    FOR EACH ROW
    WHEN ((NEW.name, NEW.cron, NEW.timezone, NEW.kind, NEW.args, NEW.queue, NEW.enabled,
           NEW.status, NEW.misfire, NEW.max_retries)
          IS DISTINCT FROM
          (OLD.name, OLD.cron, OLD.timezone, OLD.kind, OLD.args, OLD.queue, OLD.enabled,
           OLD.status, OLD.misfire, OLD.max_retries))
    EXECUTE FUNCTION sluice_schedules_before_update();

-- Wakes the dispatchers (LISTEN sluice_schedules) when a schedule may have
-- become due sooner than they know: a new row, a row to initialise, an
-- earlier next_run_at, or a row enabled or reactivated. The dispatcher's own
-- updates (next_run_at moving later, status to failed) do not notify. The
-- payload is empty, so Postgres folds the notifications of one transaction
-- into one.
-- +goose StatementBegin
CREATE FUNCTION sluice_schedules_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('sluice_schedules', '');
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER schedules_notify_insert AFTER INSERT ON schedules
    FOR EACH STATEMENT EXECUTE FUNCTION sluice_schedules_notify();

CREATE TRIGGER schedules_notify_update AFTER UPDATE ON schedules
    FOR EACH ROW
    WHEN (NEW.enabled AND NEW.status = 'active' AND (
           NEW.next_run_at IS NULL
        OR NEW.next_run_at < OLD.next_run_at
        OR NOT OLD.enabled
        OR OLD.status <> 'active'))
    EXECUTE FUNCTION sluice_schedules_notify();

-- One row per running `sluice worker`: inserted at start, refreshed every
-- heartbeat_interval, deleted on a clean shutdown. id is the River client ID
-- (river_job.attempted_by). A row whose heartbeat is older than three
-- heartbeat intervals belongs to a dead or stuck process.
CREATE TABLE sluice_workers (
    id                 text PRIMARY KEY,
    host               text NOT NULL,
    pid                integer NOT NULL,
    started_at         timestamptz NOT NULL DEFAULT now(),
    heartbeat_at       timestamptz NOT NULL DEFAULT now(),
    heartbeat_interval interval NOT NULL CHECK (heartbeat_interval > interval '0'),
    -- The end of the worker's last dispatcher tick, as of its last heartbeat.
    dispatcher_tick_at timestamptz,
    -- The dispatcher's poll interval; NULL: the worker runs no dispatcher.
    poll_interval      interval CHECK (poll_interval > interval '0')
);

COMMENT ON TABLE sluice_workers IS
    'Live sluice workers: each refreshes heartbeat_at every heartbeat_interval and deletes its row on a clean shutdown. id = River client ID (river_job.attempted_by).';

-- Workers with their liveness: live when the heartbeat is younger than three
-- heartbeat intervals; dispatcher_fresh when, in addition, its dispatcher
-- ticked within three (heartbeat + poll) intervals (or it started that
-- recently and has not reported a tick yet).
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

-- How late an enabled, active schedule may be before it counts as overdue:
-- five poll intervals of the slowest live dispatcher (1s when none is live),
-- and at least 5 seconds.
-- +goose StatementBegin
CREATE FUNCTION sluice_schedule_overdue_after() RETURNS interval
LANGUAGE sql STABLE AS $$
    SELECT greatest(interval '5 seconds',
                    5 * COALESCE(max(poll_interval) FILTER (WHERE heartbeat_at > now() - 3 * heartbeat_interval),
                                 interval '1 second'))
    FROM sluice_workers
$$;
-- +goose StatementEnd

-- Schedules at a glance. health is one of: failed (status failed: no longer
-- dispatched until enabled again), disabled, pending (next_run_at not
-- computed yet), overdue (due longer ago than sluice_schedule_overdue_after()),
-- retrying (the last dispatch failed and is being retried), ok.
CREATE VIEW sluice_schedule_status AS
SELECT
    s.id,
    s.name,
    s.kind,
    s.cron,
    s.timezone,
    s.misfire,
    s.enabled,
    s.status,
    CASE
        WHEN s.status = 'failed' THEN 'failed'
        WHEN NOT s.enabled THEN 'disabled'
        WHEN s.next_run_at IS NULL THEN 'pending'
        WHEN s.next_run_at < now() - sluice_schedule_overdue_after() THEN 'overdue'
        WHEN s.failure_count > 0 THEN 'retrying'
        ELSE 'ok'
    END AS health,
    s.next_run_at,
    CASE WHEN s.enabled AND s.status = 'active' AND s.next_run_at < now()
         THEN now() - s.next_run_at
    END AS overdue_by,
    s.last_run_at,
    s.last_dispatched_at,
    s.last_dispatched_at - s.last_run_at AS last_lag,
    s.last_job_id,
    j.state::text AS last_job_state,
    s.run_count,
    s.failure_count,
    s.max_retries,
    s.last_error
FROM schedules s
LEFT JOIN river_job j ON j.id = s.last_job_id;

-- The scheduler's dynamic settings (read when a dispatch needs them).
INSERT INTO settings (key, value, description) VALUES
    ('scheduler.retry_backoff_base', '"5s"',
     'Delay before the first retry of a failed schedule dispatch; doubles with every further consecutive failure.'),
    ('scheduler.retry_backoff_cap', '"5m"',
     'Longest delay between retries of a failed schedule dispatch.'),
    ('scheduler.run_all_cap', '100',
     'misfire=run_all: at most this many missed runs are inserted after downtime (the most recent ones); older missed runs are skipped.'),
    ('scheduler.misfire_grace', '"1m"',
     'misfire=skip: a due time later than this is a misfire and is skipped; a due time within it still runs.');

-- +goose Down
DELETE FROM settings WHERE key IN ('scheduler.retry_backoff_base', 'scheduler.retry_backoff_cap',
                                   'scheduler.run_all_cap', 'scheduler.misfire_grace');
DROP VIEW sluice_schedule_status;
DROP FUNCTION sluice_schedule_overdue_after();
DROP VIEW sluice_worker_status;
DROP TABLE sluice_workers;
DROP TABLE schedules;
DROP FUNCTION sluice_schedules_notify();
DROP FUNCTION sluice_schedules_before_update();
