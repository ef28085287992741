-- Project exports (GitLab's ProjectExportJob and RelationExport): one row per
-- export, worked by the export.project River job whose id is job_id (GitLab's
-- Sidekiq jid), and swept by export.stuck_jobs when that River job has
-- finished or is gone while the export is still queued or started.

-- +goose Up
CREATE TABLE project_export_jobs (
    id            bigserial PRIMARY KEY,
    project_id    bigint NOT NULL CHECK (project_id > 0),
    -- river_job.id of the export.project job doing the export. No foreign
    -- key: River prunes finished jobs, and a job that no longer exists is
    -- exactly what export.stuck_jobs looks for. NULL: not judged by the sweep
    -- (export.project claims such a row for itself).
    job_id        bigint,
    status        text NOT NULL DEFAULT 'queued'
        CHECK (status IN ('queued', 'started', 'finished', 'failed')),
    -- Parallel export: one project_relation_exports row per relation.
    parallel      boolean NOT NULL DEFAULT false,
    -- Where export.project wrote the archive (set when finished).
    archive_path  text,
    -- Records written to the archive (set when finished).
    records       bigint,
    -- Why the export failed, or the last error of an attempt to be retried.
    error         text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    started_at    timestamptz,
    finished_at   timestamptz
);

-- One export per River job.
CREATE UNIQUE INDEX project_export_jobs_job_id_idx ON project_export_jobs (job_id) WHERE job_id IS NOT NULL;
-- export.stuck_jobs' first read: (job_id, id) of the exports still in
-- progress, an index-only scan over the few rows that are not finished.
CREATE INDEX project_export_jobs_active_idx ON project_export_jobs (job_id, id)
    WHERE status IN ('queued', 'started') AND job_id IS NOT NULL;
CREATE INDEX project_export_jobs_project_id_idx ON project_export_jobs (project_id, id);

COMMENT ON TABLE project_export_jobs IS
    'Project exports: queued -> started -> finished, or failed. job_id is the river_job.id of the export.project job (GitLab''s jid); export.stuck_jobs fails queued/started rows whose River job is finalized or pruned.';

CREATE TABLE project_relation_exports (
    id                    bigserial PRIMARY KEY,
    project_export_job_id bigint NOT NULL REFERENCES project_export_jobs (id) ON DELETE CASCADE,
    relation              text NOT NULL,
    status                text NOT NULL DEFAULT 'queued'
        CHECK (status IN ('queued', 'started', 'finished', 'failed')),
    -- Records of the relation written to the archive (set when finished).
    records               bigint,
    error                 text,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    -- Also the index of export.stuck_jobs' "has relation exports" check.
    UNIQUE (project_export_job_id, relation)
) WITH (fillfactor = 90); -- room for in-page (HOT) status updates

COMMENT ON TABLE project_relation_exports IS
    'Relations of a parallel project export (sluice export --parallel), one row per relation.';

INSERT INTO settings (key, value, description) VALUES
    ('export.stuck_jobs.relation_exports_grace', '"6h"',
     'export.stuck_jobs leaves an export that has relation exports (a parallel export) alone until it is this old, even when its River job has finished (GitLab''s EXPORT_JOBS_EXPIRATION).');

INSERT INTO schedules (name, cron, kind) VALUES ('export.stuck_jobs', '30 * * * *', 'export.stuck_jobs');

-- +goose Down
DELETE FROM schedules WHERE name = 'export.stuck_jobs';
DELETE FROM settings WHERE key = 'export.stuck_jobs.relation_exports_grace';
DROP TABLE project_relation_exports;
DROP TABLE project_export_jobs;
