-- Project exports: `sluice export` (CreateProjectExportJob,
-- SetProjectExportJobID), the export.project worker (the rest of the first
-- part) and the export.stuck_jobs sweep (the StuckExport* queries).

-- name: CreateProjectExportJob :one
-- A new export of project_id, queued; its River job id is set by
-- SetProjectExportJobID in the same transaction.
INSERT INTO project_export_jobs (project_id, parallel)
VALUES (sqlc.arg(project_id), sqlc.arg(parallel))
RETURNING *;

-- name: SetProjectExportJobID :exec
-- Records the River job doing export id.
UPDATE project_export_jobs
SET job_id = sqlc.arg(job_id), updated_at = now()
WHERE id = sqlc.arg(id);

-- name: GetProjectExportJob :one
SELECT * FROM project_export_jobs WHERE id = sqlc.arg(id);

-- name: LockProjectExportJob :one
-- The export row, locked for the start of an export.project attempt.
SELECT * FROM project_export_jobs WHERE id = sqlc.arg(id) FOR UPDATE;

-- name: StartProjectExportJob :one
-- Marks export id started by River job job_id (claiming a row without a
-- job_id); a retried attempt starts it again.
UPDATE project_export_jobs
SET status = 'started',
    job_id = sqlc.arg(job_id),
    started_at = now(),
    updated_at = now(),
    error = NULL
WHERE id = sqlc.arg(id)
  AND status IN ('queued', 'started')
  AND (job_id IS NULL OR job_id = sqlc.arg(job_id))
RETURNING *;

-- name: StartRelationExports :exec
-- Creates (or, on a retried attempt, restarts) one relation export per
-- relation of a parallel export.
INSERT INTO project_relation_exports (project_export_job_id, relation, status)
SELECT sqlc.arg(project_export_job_id)::bigint, r.relation, 'started'
FROM unnest(sqlc.arg(relations)::text[]) AS r(relation)
ON CONFLICT (project_export_job_id, relation) DO UPDATE
SET status = 'started', records = NULL, error = NULL, updated_at = now();

-- name: ExportBuildsPage :many
-- The next page of a project's ci_builds in id order, for the archive.
SELECT * FROM ci_builds
WHERE project_id = sqlc.arg(project_id) AND id > sqlc.arg(after_id)
ORDER BY id
LIMIT sqlc.arg(max_rows);

-- name: FinishProjectExportJob :one
-- Marks export id finished, if it is still started by River job job_id.
UPDATE project_export_jobs
SET status = 'finished',
    archive_path = sqlc.arg(archive_path),
    records = sqlc.arg(records),
    error = NULL,
    finished_at = now(),
    updated_at = now()
WHERE id = sqlc.arg(id) AND status = 'started' AND job_id = sqlc.arg(job_id)
RETURNING *;

-- name: FinishRelationExports :exec
-- Marks the relation exports of a finished parallel export finished, with the
-- records written per relation.
UPDATE project_relation_exports AS re
SET status = 'finished', records = r.records, error = NULL, updated_at = now()
FROM (SELECT unnest(sqlc.arg(relations)::text[]) AS relation,
             unnest(sqlc.arg(records)::bigint[]) AS records) AS r
WHERE re.project_export_job_id = sqlc.arg(project_export_job_id) AND re.relation = r.relation;

-- name: RecordProjectExportError :exec
-- Records the error of an attempt that River will retry; the export stays
-- started.
UPDATE project_export_jobs
SET error = sqlc.arg(error), updated_at = now()
WHERE id = sqlc.arg(id) AND status = 'started' AND job_id = sqlc.arg(job_id);

-- name: FailProjectExportJob :one
-- Marks export id failed after its last attempt, with its unfinished
-- relation exports.
WITH failed AS (
    UPDATE project_export_jobs AS e
    SET status = 'failed', error = sqlc.arg(error), finished_at = now(), updated_at = now()
    WHERE e.id = sqlc.arg(id) AND e.status IN ('queued', 'started') AND e.job_id = sqlc.arg(job_id)
    RETURNING e.id
), relations AS (
    UPDATE project_relation_exports AS re
    SET status = 'failed', error = sqlc.arg(error), updated_at = now()
    WHERE re.project_export_job_id IN (SELECT f.id FROM failed f) AND re.status IN ('queued', 'started')
)
SELECT count(*) FROM failed;

-- name: ListRelationExports :many
SELECT * FROM project_relation_exports
WHERE project_export_job_id = sqlc.arg(project_export_job_id)
ORDER BY relation;

-- name: StuckExportCandidates :one
-- export.stuck_jobs steps 1 and 2 as one read: of the exports still queued
-- or started that have a River job (in_progress counts them), the
-- (job_id, id) pairs whose River job is done: its river_job row is
-- finalized (completed, cancelled, discarded) or no longer exists (pruned).
-- A job that is available, scheduled, retryable, pending or running is not
-- done. Two aligned arrays: one row to decode, however many exports are in
-- progress.
SELECT count(*)::bigint AS in_progress,
       COALESCE(array_agg(e.job_id ORDER BY e.id)
                FILTER (WHERE r.id IS NULL OR r.state IN ('completed', 'cancelled', 'discarded')), '{}')::bigint[] AS job_ids,
       COALESCE(array_agg(e.id ORDER BY e.id)
                FILTER (WHERE r.id IS NULL OR r.state IN ('completed', 'cancelled', 'discarded')), '{}')::bigint[] AS ids
FROM project_export_jobs e
LEFT JOIN river_job r ON r.id = e.job_id
WHERE e.status IN ('queued', 'started') AND e.job_id IS NOT NULL;

-- name: StuckExportRecheck :many
-- export.stuck_jobs step 3 (the second read): of the (id, job_id) pairs (a
-- semi-join the planner drives with index lookups), the exports still queued
-- or started and still pointing at that River job, with
-- step 4's test: in_grace when the export has relation exports and was
-- created less than grace_seconds ago.
SELECT e.id, e.job_id::bigint AS job_id, e.status, e.created_at,
       (EXISTS (SELECT 1 FROM project_relation_exports re WHERE re.project_export_job_id = e.id)
        AND e.created_at > now() - make_interval(secs => sqlc.arg(grace_seconds)::float8))::boolean AS in_grace
FROM project_export_jobs e
WHERE e.status IN ('queued', 'started')
  AND (e.id, e.job_id) IN (SELECT unnest(sqlc.arg(ids)::bigint[]), unnest(sqlc.arg(job_ids)::bigint[]))
ORDER BY e.id;

-- name: StuckExportFail :many
-- export.stuck_jobs step 5: marks the (id, job_id) pairs failed, guarded
-- again so that an export that finished or was re-pointed since the second
-- read is left alone; their unfinished relation exports fail with them.
WITH failed AS (
    UPDATE project_export_jobs AS e
    SET status = 'failed',
        error = 'stuck: its River job finished or no longer exists while the export was ' || e.status,
        finished_at = now(),
        updated_at = now()
    FROM (SELECT unnest(sqlc.arg(ids)::bigint[]) AS id, unnest(sqlc.arg(job_ids)::bigint[]) AS job_id) AS p
    WHERE e.id = p.id AND e.job_id = p.job_id
      AND e.status IN ('queued', 'started')
    RETURNING e.id, e.job_id
), relations AS (
    UPDATE project_relation_exports AS re
    SET status = 'failed', error = 'stuck: the export failed', updated_at = now()
    WHERE re.project_export_job_id IN (SELECT f.id FROM failed f) AND re.status IN ('queued', 'started')
)
SELECT f.id, f.job_id::bigint AS job_id FROM failed f ORDER BY f.id;

-- name: StuckExportForceCustomPlans :exec
-- For the rest of export.stuck_jobs' transaction, plan each statement for
-- its actual arrays: a cached generic plan guesses 10 elements and probes
-- river_job once per id, which is slow when 100,000 exports are in progress.
SELECT set_config('plan_cache_mode', 'force_custom_plan', true);
