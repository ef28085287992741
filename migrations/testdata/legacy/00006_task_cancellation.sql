-- Cancellation monitoring (seed 000, OpenSearch's
-- TaskCancellationMonitoringService): River jobs that keep running after
-- River's JobCancel, counted per kind by task_cancellation.monitor.
--
-- The tracker (the seed's cancelledTaskTracker) is kept by the database
-- itself: two row triggers on river_job track every running job that gains
-- metadata.cancel_attempted_at, whichever River client cancelled it
-- (onTaskCancelled), and forget it when it stops running (onTaskCompleted).
-- Their WHEN clauses keep River's hot path cheap: no trigger function runs
-- unless a running job is being cancelled, or a cancelled job finishes. The
-- cheap state comparisons come first: River's fetch (available → running)
-- stops at the first one, its completion (running → completed) costs one
-- jsonb key lookup (untrack).

-- +goose Up
CREATE TABLE task_cancellation_tracker (
    job_id       bigint PRIMARY KEY,
    kind         text NOT NULL,
    -- River's metadata.cancel_attempted_at (the cancelling client's clock);
    -- the time of tracking if it cannot be read.
    cancelled_at timestamptz NOT NULL,
    tracked_at   timestamptz NOT NULL DEFAULT now(),
    -- NULL: not counted yet. Set once, by the run that counts the job.
    counted_at   timestamptz
);

COMMENT ON TABLE task_cancellation_tracker IS
    'Running River jobs whose cancellation was requested (cancelledTaskTracker). Rows come from triggers on river_job and from `sluice jobs cancel`; a row goes when its job stops running. counted_at is set once, when task_cancellation.monitor counts the job.';

CREATE TABLE task_cancellation_counters (
    kind                    text PRIMARY KEY,
    total_count_post_cancel bigint NOT NULL DEFAULT 0 CHECK (total_count_post_cancel >= 0),
    updated_at              timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE task_cancellation_counters IS
    'Cumulative number of jobs per kind that kept running at least task_cancellation.duration_millis after their cancellation.';

INSERT INTO settings (key, value, description) VALUES
    ('task_cancellation.enabled', 'true',
     'task_cancellation.monitor counts jobs still running after their cancellation; false makes its runs return at once.'),
    ('task_cancellation.duration_millis', '10000',
     'How long (milliseconds, 0 to 31622400000) a job must keep running after its cancellation to be counted.'),
    ('task_cancellation.kinds', '[]',
     'Job kinds task_cancellation.monitor counts (a JSON array of strings); [] counts every kind.');

INSERT INTO schedules (name, cron, kind)
VALUES ('task_cancellation.monitor', '@every 5s', 'task_cancellation.monitor');

-- The cancellation time River stamped on a job (metadata.cancel_attempted_at,
-- an RFC 3339 string), or NULL if it is missing or unreadable. Never raises:
-- it runs inside River's own UPDATEs.
-- +goose StatementBegin
CREATE FUNCTION sluice_task_cancellation_attempted_at(metadata jsonb) RETURNS timestamptz
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN (metadata ->> 'cancel_attempted_at')::timestamptz;
EXCEPTION WHEN others THEN
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- onTaskCancelled: a running job gained metadata.cancel_attempted_at.
-- +goose StatementBegin
CREATE FUNCTION sluice_task_cancellation_track() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    INSERT INTO task_cancellation_tracker (job_id, kind, cancelled_at)
    VALUES (NEW.id, NEW.kind, COALESCE(sluice_task_cancellation_attempted_at(NEW.metadata), now()))
    ON CONFLICT (job_id) DO NOTHING;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- onTaskCompleted: a cancelled running job stopped running.
-- +goose StatementBegin
CREATE FUNCTION sluice_task_cancellation_untrack() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    DELETE FROM task_cancellation_tracker WHERE job_id = OLD.id;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER sluice_task_cancellation_track
    AFTER UPDATE ON river_job
    FOR EACH ROW
    WHEN (OLD.state = 'running'
          AND NEW.state = 'running'
          AND NEW.metadata ? 'cancel_attempted_at'
          AND NOT OLD.metadata ? 'cancel_attempted_at')
    EXECUTE FUNCTION sluice_task_cancellation_track();

CREATE TRIGGER sluice_task_cancellation_untrack
    AFTER UPDATE ON river_job
    FOR EACH ROW
    WHEN (OLD.state = 'running'
          AND NEW.state <> 'running'
          AND OLD.metadata ? 'cancel_attempted_at')
    EXECUTE FUNCTION sluice_task_cancellation_untrack();

-- Jobs cancelled before this migration and still running.
INSERT INTO task_cancellation_tracker (job_id, kind, cancelled_at)
SELECT id, kind, COALESCE(sluice_task_cancellation_attempted_at(metadata), now())
FROM river_job
WHERE state = 'running' AND metadata ? 'cancel_attempted_at'
ON CONFLICT (job_id) DO NOTHING;

-- The settings the stats view reads, parsed as strictly as sluice's Go code
-- parses them (db.Settings); a value of the wrong type is an error naming
-- the key. A missing row means the default.
-- +goose StatementBegin
CREATE FUNCTION sluice_task_cancellation_threshold() RETURNS interval
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    v jsonb;
BEGIN
    SELECT value INTO v FROM settings WHERE key = 'task_cancellation.duration_millis';
    IF v IS NULL THEN
        RETURN 10000 * interval '1 millisecond';
    END IF;
    IF jsonb_typeof(v) <> 'number' OR v::text !~ '^[0-9]{1,11}$' OR (v::text)::bigint > 31622400000 THEN
        RAISE EXCEPTION 'setting task_cancellation.duration_millis: want an integer between 0 and 31622400000, got %', v
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN (v::text)::bigint * interval '1 millisecond';
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION sluice_task_cancellation_kinds() RETURNS text[]
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    v jsonb;
BEGIN
    SELECT value INTO v FROM settings WHERE key = 'task_cancellation.kinds';
    IF v IS NULL THEN
        RETURN '{}'::text[];
    END IF;
    IF jsonb_typeof(v) <> 'array'
       OR EXISTS (SELECT 1 FROM jsonb_array_elements(v) e WHERE jsonb_typeof(e) <> 'string') THEN
        RAISE EXCEPTION 'setting task_cancellation.kinds: want an array of strings, got %', v
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN ARRAY(SELECT jsonb_array_elements_text(v));
END
$$;
-- +goose StatementEnd

-- Per kind: jobs running at least duration_millis after their cancellation
-- right now (computed when read, only the kinds of task_cancellation.kinds
-- when it names any), and the cumulative count of such jobs. Lists every kind
-- with a counter, a current job, or a name in task_cancellation.kinds.
CREATE VIEW sluice_task_cancellation_stats AS
WITH config AS MATERIALIZED (
    SELECT now() - sluice_task_cancellation_threshold() AS cancelled_before,
           sluice_task_cancellation_kinds() AS kinds
),
current_counts AS (
    SELECT t.kind, count(*) AS jobs
    FROM config c
    JOIN task_cancellation_tracker t ON t.cancelled_at <= c.cancelled_before
    WHERE (cardinality(c.kinds) = 0 OR t.kind = ANY (c.kinds))
      -- A correlated scalar subquery: one primary-key lookup per tracked
      -- row, never a scan of river_job (an empty tracker reads none).
      AND (SELECT j.state FROM river_job j WHERE j.id = t.job_id) = 'running'
    GROUP BY t.kind
),
kinds AS (
    SELECT kind FROM current_counts
    UNION
    SELECT kind FROM task_cancellation_counters
    UNION
    SELECT unnest(kinds) FROM config
)
SELECT k.kind::text AS kind,
       COALESCE(cc.jobs, 0)::bigint AS current_count_post_cancel,
       COALESCE(tc.total_count_post_cancel, 0)::bigint AS total_count_post_cancel
FROM kinds k
LEFT JOIN current_counts cc ON cc.kind = k.kind
LEFT JOIN task_cancellation_counters tc ON tc.kind = k.kind;

COMMENT ON VIEW sluice_task_cancellation_stats IS
    'Jobs still running after their cancellation, per kind: current_count_post_cancel (now, past task_cancellation.duration_millis) and total_count_post_cancel (cumulative).';

-- +goose Down
DROP VIEW sluice_task_cancellation_stats;
DROP FUNCTION sluice_task_cancellation_kinds();
DROP FUNCTION sluice_task_cancellation_threshold();
DROP TRIGGER sluice_task_cancellation_untrack ON river_job;
DROP TRIGGER sluice_task_cancellation_track ON river_job;
DROP FUNCTION sluice_task_cancellation_untrack();
DROP FUNCTION sluice_task_cancellation_track();
DROP FUNCTION sluice_task_cancellation_attempted_at(jsonb);
DELETE FROM schedules WHERE name = 'task_cancellation.monitor' AND kind = 'task_cancellation.monitor';
DELETE FROM settings WHERE key IN ('task_cancellation.enabled', 'task_cancellation.duration_millis', 'task_cancellation.kinds');
DROP TABLE task_cancellation_counters;
DROP TABLE task_cancellation_tracker;
