-- The stuck-build sweeps (ci.drop_*_builds). Each sweep pages through the
-- builds of its status in (created_at, project_id, id) order with a keyset:
-- the after_* arguments are the key of the last build of the previous batch
-- (NULL for the first batch), so a build that was neither dropped nor doomed
-- is never selected again by the same run. Each select matches its status's
-- partial index (ci_builds_<status>_sweep_idx in 00003_ci_builds.sql), so it is
-- an index range scan, never a scan of the table.

-- name: SelectStuckCancelingBuilds :many
-- Builds in canceling whose created_at and updated_at are both before cutoff.
SELECT * FROM ci_builds
WHERE status = 'canceling'
  AND created_at < sqlc.arg(cutoff)::timestamptz
  AND updated_at < sqlc.arg(cutoff)::timestamptz
  AND (created_at, project_id, id) > (
        COALESCE(sqlc.narg(after_created_at)::timestamptz, '-infinity'::timestamptz),
        COALESCE(sqlc.narg(after_project_id)::bigint, -9223372036854775808),
        COALESCE(sqlc.narg(after_id)::bigint, -9223372036854775808))
ORDER BY created_at, project_id, id
LIMIT sqlc.arg(batch_size);

-- name: SelectStuckRunningBuilds :many
-- Builds in running whose updated_at is before cutoff.
SELECT * FROM ci_builds
WHERE status = 'running'
  AND updated_at < sqlc.arg(cutoff)::timestamptz
  AND (created_at, project_id, id) > (
        COALESCE(sqlc.narg(after_created_at)::timestamptz, '-infinity'::timestamptz),
        COALESCE(sqlc.narg(after_project_id)::bigint, -9223372036854775808),
        COALESCE(sqlc.narg(after_id)::bigint, -9223372036854775808))
ORDER BY created_at, project_id, id
LIMIT sqlc.arg(batch_size);

-- name: SelectStuckScheduledBuilds :many
-- Builds in scheduled whose scheduled_at is before cutoff.
SELECT * FROM ci_builds
WHERE status = 'scheduled'
  AND scheduled_at < sqlc.arg(cutoff)::timestamptz
  AND (created_at, project_id, id) > (
        COALESCE(sqlc.narg(after_created_at)::timestamptz, '-infinity'::timestamptz),
        COALESCE(sqlc.narg(after_project_id)::bigint, -9223372036854775808),
        COALESCE(sqlc.narg(after_id)::bigint, -9223372036854775808))
ORDER BY created_at, project_id, id
LIMIT sqlc.arg(batch_size);

-- name: SelectStuckPendingBuilds :many
-- Builds in pending whose created_at and updated_at are both before cutoff.
SELECT * FROM ci_builds
WHERE status = 'pending'
  AND created_at < sqlc.arg(cutoff)::timestamptz
  AND updated_at < sqlc.arg(cutoff)::timestamptz
  AND (created_at, project_id, id) > (
        COALESCE(sqlc.narg(after_created_at)::timestamptz, '-infinity'::timestamptz),
        COALESCE(sqlc.narg(after_project_id)::bigint, -9223372036854775808),
        COALESCE(sqlc.narg(after_id)::bigint, -9223372036854775808))
ORDER BY created_at, project_id, id
LIMIT sqlc.arg(batch_size);

-- name: DropStuckBuilds :many
-- Fails the builds ids[i] whose lock_version is still lock_versions[i] and
-- that are still stuck: still in status, and before the cutoff on every
-- column whose *_before argument is not NULL. Optimistic locking: a build
-- that anybody changed since it was read (lock_version moved) or that is no
-- longer stuck is not updated and not returned. One statement, so one
-- transaction: if the database rejects any row (constraint, trigger, …) none
-- is updated and the caller goes through the builds one by one.
UPDATE ci_builds AS b
SET status = 'failed',
    failure_reason = sqlc.arg(failure_reason)::text,
    finished_at = COALESCE(b.finished_at, now()),
    updated_at = now(),
    lock_version = b.lock_version + 1
FROM (SELECT unnest(sqlc.arg(ids)::bigint[]) AS id,
             unnest(sqlc.arg(lock_versions)::integer[]) AS lock_version) AS v
WHERE b.id = v.id
  AND b.lock_version = v.lock_version
  AND b.status = sqlc.arg(status)::text
  AND (sqlc.narg(created_before)::timestamptz IS NULL OR b.created_at < sqlc.narg(created_before)::timestamptz)
  AND (sqlc.narg(updated_before)::timestamptz IS NULL OR b.updated_at < sqlc.narg(updated_before)::timestamptz)
  AND (sqlc.narg(scheduled_before)::timestamptz IS NULL OR b.scheduled_at < sqlc.narg(scheduled_before)::timestamptz)
RETURNING b.id;

-- name: GetCIBuild :one
-- The current row of a build (the reload after an optimistic-lock conflict).
SELECT * FROM ci_builds WHERE id = sqlc.arg(id);

-- name: DoomCIBuild :execrows
-- The fallback when the database rejected the drop of a build: mark it
-- failed with data_integrity_failure, writing as little as possible (no
-- optimistic-lock check, no stuck check beyond the status). lock_version
-- still moves so other optimistic writers notice, wrapping at the integer
-- maximum instead of overflowing. A build that left status meanwhile is left
-- alone.
UPDATE ci_builds
SET status = 'failed',
    failure_reason = 'data_integrity_failure',
    finished_at = COALESCE(finished_at, now()),
    updated_at = now(),
    lock_version = CASE WHEN lock_version < 2147483647 THEN lock_version + 1 ELSE 0 END
WHERE id = sqlc.arg(id) AND status = sqlc.arg(status)::text;

-- name: BypassTriggersForTransaction :exec
-- Makes the rest of the current transaction skip ordinary triggers and rules
-- (session_replication_role = replica, transaction-local). Only a superuser or
-- a role granted SET on session_replication_role may do this; the doom
-- fallback uses it when a plain doom was rejected too.
SELECT set_config('session_replication_role', 'replica', true);

-- name: DatabaseNow :one
-- The database's clock: the sweeps compute their cutoffs from it, so the
-- clocks of the worker machines do not matter.
SELECT now()::timestamptz AS now;

-- name: CurrentSynchronousCommit :one
-- This session's synchronous_commit, to restore after a sweep.
SELECT current_setting('synchronous_commit')::text AS synchronous_commit;

-- name: SetSynchronousCommit :exec
-- Sets synchronous_commit for the rest of this session. A sweep turns it off
-- on its connection: its per-batch and per-build commits then do not each
-- wait for the WAL flush; the synchronous commit of the run's journal row
-- flushes them all (WAL is flushed in order), and a server crash before that
-- loses at most the last drops of a run that is not recorded as finished,
-- which the next run redoes.
SELECT set_config('synchronous_commit', sqlc.arg(value)::text, false);
