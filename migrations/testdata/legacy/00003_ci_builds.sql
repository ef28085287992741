-- CI builds, in GitLab's vocabulary, swept by the ci.drop_*_builds kinds and
-- exported by export.project.

-- +goose Up
CREATE TABLE ci_builds (
    id             bigserial PRIMARY KEY,
    project_id     bigint NOT NULL,
    pipeline_id    bigint,
    runner_id      bigint,
    name           text NOT NULL DEFAULT '',
    stage          text NOT NULL DEFAULT '',
    status         text NOT NULL DEFAULT 'created' CHECK (status IN (
        'created', 'waiting_for_resource', 'preparing', 'pending', 'running',
        'canceling', 'canceled', 'success', 'failed', 'skipped', 'manual', 'scheduled')),
    failure_reason text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    scheduled_at   timestamptz,
    started_at     timestamptz,
    finished_at    timestamptz,
    lock_version   integer NOT NULL DEFAULT 0
);

CREATE INDEX ci_builds_project_id_idx ON ci_builds (project_id, id);

-- The stuck-build sweeps (ci.drop_*_builds) walk the builds of one status in
-- (created_at, project_id, id) order, 100 at a time, resuming after the last
-- key of the previous batch. One small partial index per swept status keeps
-- each batch an index range scan over the builds of that status only, however
-- many finished builds the table holds.
CREATE INDEX ci_builds_canceling_sweep_idx ON ci_builds (created_at, project_id, id) WHERE status = 'canceling';
CREATE INDEX ci_builds_running_sweep_idx   ON ci_builds (created_at, project_id, id) WHERE status = 'running';
CREATE INDEX ci_builds_scheduled_sweep_idx ON ci_builds (created_at, project_id, id) WHERE status = 'scheduled';
CREATE INDEX ci_builds_pending_sweep_idx   ON ci_builds (created_at, project_id, id) WHERE status = 'pending';

COMMENT ON TABLE ci_builds IS
    'CI builds (GitLab''s statuses). lock_version is the optimistic lock: every writer that changes a build increments it. Builds stuck in canceling, running, scheduled or pending are failed by the ci.drop_*_builds maintenance kinds.';

-- How old a build must be before each sweep fails it (Go duration strings).
INSERT INTO settings (key, value, description) VALUES
    ('ci.drop_canceling_builds.timeout', '"1h"',
     'ci.drop_canceling_builds fails builds in canceling whose created_at and updated_at are both older than this.'),
    ('ci.drop_running_builds.timeout', '"1h"',
     'ci.drop_running_builds fails builds in running whose updated_at is older than this.'),
    ('ci.drop_scheduled_builds.timeout', '"1h"',
     'ci.drop_scheduled_builds fails builds in scheduled whose scheduled_at is older than this (stale_schedule).'),
    ('ci.drop_pending_builds.timeout', '"24h"',
     'ci.drop_pending_builds fails builds in pending whose created_at and updated_at are both older than this.');

-- Default schedules (GitLab's StuckCiJobsWorker runs the sweeps staggered
-- within the hour).
INSERT INTO schedules (name, cron, kind) VALUES
    ('ci.drop_running_builds',   '0 * * * *',  'ci.drop_running_builds'),
    ('ci.drop_scheduled_builds', '15 * * * *', 'ci.drop_scheduled_builds'),
    ('ci.drop_pending_builds',   '20 * * * *', 'ci.drop_pending_builds'),
    ('ci.drop_canceling_builds', '45 * * * *', 'ci.drop_canceling_builds');

-- +goose Down
DELETE FROM schedules WHERE name IN (
    'ci.drop_canceling_builds', 'ci.drop_running_builds', 'ci.drop_scheduled_builds', 'ci.drop_pending_builds');
DELETE FROM settings WHERE key IN (
    'ci.drop_canceling_builds.timeout', 'ci.drop_running_builds.timeout',
    'ci.drop_scheduled_builds.timeout', 'ci.drop_pending_builds.timeout');
DROP TABLE ci_builds;
