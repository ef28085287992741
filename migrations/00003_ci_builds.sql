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

-- +goose Down
DROP TABLE ci_builds;
