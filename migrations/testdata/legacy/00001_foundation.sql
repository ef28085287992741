-- Foundation: dynamic settings, the maintenance-run journal and the queue
-- overview view. River's own tables (river_job, …) are created before this
-- migration by `sluice migrate up` through rivermigrate.

-- +goose Up
CREATE TABLE settings (
    key         text PRIMARY KEY CHECK (key ~ '^[a-z0-9_.]+$'),
    value       jsonb NOT NULL,
    description text NOT NULL DEFAULT '',
    updated_at  timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE settings IS
    'Dynamic settings: read on every use, so an UPDATE takes effect at the next run without a restart.';

CREATE TABLE maintenance_runs (
    id          bigserial PRIMARY KEY,
    kind        text NOT NULL,
    job_id      bigint,
    worker_id   text,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    status      text NOT NULL DEFAULT 'running'
        CHECK (status IN ('running', 'succeeded', 'skipped_locked', 'failed')),
    affected    bigint NOT NULL DEFAULT 0,
    details     jsonb NOT NULL DEFAULT '{}'::jsonb,
    CHECK ((status = 'running') = (finished_at IS NULL))
);

CREATE INDEX maintenance_runs_kind_started_at_idx ON maintenance_runs (kind, started_at DESC);
CREATE INDEX maintenance_runs_running_idx ON maintenance_runs (kind) WHERE status = 'running';

COMMENT ON TABLE maintenance_runs IS
    'One row per maintenance run. status is running while the run holds its advisory lock, then succeeded, skipped_locked or failed.';

-- Jobs per kind and state, with the age of the oldest job that is ready to run.
CREATE VIEW sluice_queue_overview AS
SELECT
    kind,
    state::text AS state,
    count(*) AS jobs,
    CASE WHEN state = 'available'
         THEN now() - min(scheduled_at)
    END AS oldest_available_age
FROM river_job
GROUP BY kind, state;

-- +goose Down
DROP VIEW sluice_queue_overview;
DROP TABLE maintenance_runs;
DROP TABLE settings;
