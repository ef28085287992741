-- The durable scheduler: the dispatcher's claim and bookkeeping, and the
-- CRUD behind `sluice schedule`. now: the caller's clock, NULL for the
-- database's now() (tests pass a controllable clock).

-- name: SchedulerPeek :one
-- The dispatcher's idle check, two index-only scans: the earliest
-- next_run_at of the dispatchable rows (schedules_due_idx, one entry) and
-- whether any row waits for its next_run_at to be computed
-- (schedules_uninitialised_idx).
SELECT
    now()::timestamptz AS db_now,
    d.next_run_at AS next_due,
    EXISTS (SELECT 1 FROM schedules u WHERE u.next_run_at IS NULL) AS uninitialised
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (
    SELECT s.next_run_at FROM schedules s
    WHERE s.enabled AND s.status = 'active' AND s.next_run_at IS NOT NULL
    ORDER BY s.next_run_at
    LIMIT 1
) AS d ON true;

-- name: ClaimUninitialisedSchedules :many
-- Rows whose next_run_at is NULL, locked for this transaction; rows another
-- dispatcher holds are skipped.
SELECT id, name, cron, timezone, failure_count, max_retries,
       COALESCE(sqlc.narg(now)::timestamptz, now())::timestamptz AS now
FROM schedules
WHERE next_run_at IS NULL
ORDER BY id
LIMIT sqlc.arg(max_rows)
FOR UPDATE SKIP LOCKED;

-- name: ClaimDueSchedules :many
-- Due rows in due order, locked for this transaction; rows another
-- dispatcher (or an operator's UPDATE) holds are skipped.
SELECT id, name, cron, timezone, kind, args, queue, priority, max_attempts, tags,
       misfire, next_run_at, retry_due_at, failure_count, max_retries,
       COALESCE(sqlc.narg(now)::timestamptz, now())::timestamptz AS now
FROM schedules
WHERE enabled AND status = 'active'
  AND next_run_at <= COALESCE(sqlc.narg(now)::timestamptz, now())
ORDER BY next_run_at
LIMIT sqlc.arg(max_rows)
FOR UPDATE SKIP LOCKED;

-- name: SetScheduleNextRuns :exec
-- Sets the computed next_run_at of claimed rows.
UPDATE schedules s
SET next_run_at = u.next_run_at
FROM (SELECT unnest(sqlc.arg(ids)::bigint[]) AS id,
             unnest(sqlc.arg(next_run_ats)::timestamptz[]) AS next_run_at) AS u
WHERE s.id = u.id;

-- name: RecordScheduleDispatches :exec
-- Records the dispatch of claimed rows: runs jobs were inserted (runs may be
-- 0 when the misfire policy skipped every due time), the last of them due at
-- last_run_at with job last_job_id; the cadence goes on at next_run_at. A
-- success ends any retry.
UPDATE schedules s
SET next_run_at = u.next_run_at,
    last_run_at = CASE WHEN u.runs > 0 THEN u.last_run_at ELSE s.last_run_at END,
    last_job_id = CASE WHEN u.runs > 0 THEN u.last_job_id ELSE s.last_job_id END,
    last_dispatched_at = CASE WHEN u.runs > 0 THEN clock_timestamp() ELSE s.last_dispatched_at END,
    run_count = s.run_count + u.runs,
    failure_count = 0,
    last_error = NULL,
    retry_due_at = NULL
FROM (SELECT unnest(sqlc.arg(ids)::bigint[]) AS id,
             unnest(sqlc.arg(next_run_ats)::timestamptz[]) AS next_run_at,
             unnest(sqlc.arg(last_run_ats)::timestamptz[]) AS last_run_at,
             unnest(sqlc.arg(last_job_ids)::bigint[]) AS last_job_id,
             unnest(sqlc.arg(runs)::bigint[]) AS runs) AS u
WHERE s.id = u.id;

-- name: RecordScheduleFailures :many
-- Records failed dispatches of claimed rows: failure_count+1, the error, the
-- due time being retried, next_run_at pushed out to retry_at; once
-- failure_count exceeds max_retries the row is failed and no longer
-- dispatched.
UPDATE schedules s
SET failure_count = s.failure_count + 1,
    last_error = u.error,
    retry_due_at = COALESCE(s.retry_due_at, s.next_run_at),
    next_run_at = u.retry_at,
    status = CASE WHEN s.failure_count + 1 > s.max_retries THEN 'failed' ELSE s.status END
FROM (SELECT unnest(sqlc.arg(ids)::bigint[]) AS id,
             unnest(sqlc.arg(errors)::text[]) AS error,
             unnest(sqlc.arg(retry_ats)::timestamptz[]) AS retry_at) AS u
WHERE s.id = u.id
RETURNING s.id, s.name, s.status, s.failure_count, s.max_retries;

-- name: DBNow :one
-- The database's clock.
SELECT now()::timestamptz AS now;

-- name: ListSchedules :many
SELECT * FROM schedules ORDER BY name;

-- name: GetSchedule :one
SELECT * FROM schedules WHERE name = sqlc.arg(name);

-- name: GetScheduleForUpdate :one
-- Locks the row for a CLI change (waits for a dispatcher holding it).
SELECT * FROM schedules WHERE name = sqlc.arg(name) FOR UPDATE;

-- name: InsertSchedule :one
INSERT INTO schedules (name, cron, timezone, kind, args, queue, enabled, misfire, max_retries, next_run_at)
VALUES (sqlc.arg(name), sqlc.arg(cron), sqlc.arg(timezone), sqlc.arg(kind), sqlc.arg(args),
        sqlc.narg(queue), sqlc.arg(enabled), sqlc.arg(misfire), sqlc.arg(max_retries), sqlc.narg(next_run_at))
RETURNING *;

-- name: UpdateSchedule :one
-- Rewrites the definition of a row locked by GetScheduleForUpdate.
-- next_run_at and retry_due_at are set by the caller (recomputed when the
-- cadence changed, else unchanged).
UPDATE schedules
SET cron = sqlc.arg(cron),
    timezone = sqlc.arg(timezone),
    kind = sqlc.arg(kind),
    args = sqlc.arg(args),
    queue = sqlc.narg(queue),
    enabled = sqlc.arg(enabled),
    misfire = sqlc.arg(misfire),
    max_retries = sqlc.arg(max_retries),
    next_run_at = sqlc.narg(next_run_at),
    retry_due_at = sqlc.narg(retry_due_at)
WHERE id = sqlc.arg(id)
RETURNING *;

-- name: EnableSchedule :one
-- Enables a row and makes a failed one active again, its cadence starting
-- afresh at next_run_at.
UPDATE schedules
SET enabled = true,
    status = 'active',
    failure_count = 0,
    last_error = NULL,
    retry_due_at = NULL,
    next_run_at = sqlc.arg(next_run_at)
WHERE id = sqlc.arg(id)
RETURNING *;

-- name: DisableSchedule :one
UPDATE schedules SET enabled = false WHERE id = sqlc.arg(id) RETURNING *;

-- name: DeleteSchedule :one
DELETE FROM schedules WHERE name = sqlc.arg(name) RETURNING id;

-- name: RecordScheduleTrigger :one
-- Records a manual run (sluice schedule trigger): the cadence (next_run_at)
-- and the retry state are left alone.
UPDATE schedules
SET last_run_at = sqlc.arg(due_at),
    last_job_id = sqlc.arg(job_id),
    last_dispatched_at = clock_timestamp(),
    run_count = run_count + 1
WHERE id = sqlc.arg(id)
RETURNING *;

-- name: ListenSchedules :exec
-- Subscribes this session to the notifications of schedule changes.
LISTEN sluice_schedules;

-- name: ScheduleHealth :one
-- Counts for health checks; the overdue threshold comes from
-- sluice_schedule_overdue_after() (5 dispatcher poll intervals, at least 5s).
WITH t AS (SELECT sluice_schedule_overdue_after()::interval AS overdue_after)
SELECT
    extract(epoch FROM t.overdue_after)::float8 AS overdue_after_seconds,
    (SELECT count(*) FROM schedules s
     WHERE s.enabled AND s.status = 'active' AND s.next_run_at < now() - t.overdue_after) AS overdue,
    (SELECT count(*) FROM schedules f WHERE f.status = 'failed' AND f.enabled) AS failed
FROM t;

-- name: OverdueScheduleNames :many
SELECT name FROM schedules
WHERE enabled AND status = 'active'
  AND next_run_at < now() - sluice_schedule_overdue_after()::interval
ORDER BY next_run_at
LIMIT sqlc.arg(max_rows);

-- name: FailedScheduleNames :many
SELECT name FROM schedules
WHERE status = 'failed' AND enabled
ORDER BY name
LIMIT sqlc.arg(max_rows);

-- name: ScheduleStatusList :many
-- Every schedule as schedule_status shows it (the web pages), by
-- name: health, how overdue (0 when not), the last job and its state.
SELECT id, name, kind, cron, timezone, misfire, enabled, status, health,
       next_run_at,
       COALESCE(extract(epoch FROM overdue_by), 0)::float8 AS overdue_seconds,
       last_run_at, last_dispatched_at, last_job_id, COALESCE(last_job_state, '')::text AS last_job_state,
       run_count, failure_count, max_retries, last_error
FROM schedule_status
ORDER BY name
LIMIT sqlc.arg(max_rows);

-- Schedules declared in Go (scheduler/declared_store.go): every worker
-- writes its program's at start, in one transaction that holds
-- schedule_declarations locked, so that two workers starting at once write
-- one after the other.

-- name: LockScheduleDeclarations :exec
-- Serialises the writers of declared schedules (workers starting, `schedule
-- reset`) for the rest of the transaction; readers are not blocked.
LOCK TABLE schedule_declarations IN SHARE ROW EXCLUSIVE MODE;

-- name: SetScheduleSource :exec
-- The source the transaction's schedule changes get: 'sql' or 'config'
-- (trigger schedules_source).
SELECT set_config('sluice.schedule_source', sqlc.arg(source)::text, true);

-- name: UpsertScheduleDeclaration :exec
-- Records a schedule as the program declares it.
INSERT INTO schedule_declarations
    (name, cron, timezone, kind, args, queue, priority, max_attempts, tags, misfire, enabled, declared_by, updated_at)
VALUES (sqlc.arg(name), sqlc.arg(cron), sqlc.arg(timezone), sqlc.arg(kind), sqlc.arg(args), sqlc.narg(queue),
        sqlc.narg(priority), sqlc.narg(max_attempts), sqlc.narg(tags)::text[], sqlc.arg(misfire), sqlc.arg(enabled),
        sqlc.narg(declared_by), now())
ON CONFLICT (name) DO UPDATE
SET cron = EXCLUDED.cron, timezone = EXCLUDED.timezone, kind = EXCLUDED.kind, args = EXCLUDED.args,
    queue = EXCLUDED.queue, priority = EXCLUDED.priority, max_attempts = EXCLUDED.max_attempts,
    tags = EXCLUDED.tags, misfire = EXCLUDED.misfire, enabled = EXCLUDED.enabled,
    declared_by = EXCLUDED.declared_by, updated_at = now();

-- name: DeleteStaleScheduleDeclarations :many
-- Forgets the declarations the program no longer makes (names: those it
-- makes), returning their names.
DELETE FROM schedule_declarations
WHERE NOT (name = ANY (sqlc.arg(names)::text[]))
RETURNING name;

-- name: DeleteDeclaredSchedules :many
-- Removes the schedules of names that still follow their declaration
-- (source config); one an operator changed stays. Returns those removed.
DELETE FROM schedules
WHERE name = ANY (sqlc.arg(names)::text[]) AND source = 'config'
RETURNING name;

-- name: WriteDeclaredSchedule :many
-- Writes the declaration of name into its schedules row: inserted when
-- there is none; rewritten when its definition differs and it still follows
-- its declaration (source config), or always with force (`schedule
-- reset`). A row an operator changed (source sql) is left alone unless
-- forced. Returns the row's name when it was written, with inserted true
-- for a new row.
INSERT INTO schedules AS s (name, cron, timezone, kind, args, queue, priority, max_attempts, tags, misfire, enabled)
SELECT d.name, d.cron, d.timezone, d.kind, d.args, d.queue, d.priority, d.max_attempts, d.tags, d.misfire, d.enabled
FROM schedule_declarations d
WHERE d.name = sqlc.arg(name)
ON CONFLICT (name) DO UPDATE
SET cron = EXCLUDED.cron, timezone = EXCLUDED.timezone, kind = EXCLUDED.kind, args = EXCLUDED.args,
    queue = EXCLUDED.queue, priority = EXCLUDED.priority, max_attempts = EXCLUDED.max_attempts,
    tags = EXCLUDED.tags, misfire = EXCLUDED.misfire, enabled = EXCLUDED.enabled,
    -- the trigger gives source only to a changed definition: a forced reset
    -- of an unchanged one names it here
    source = 'config'
WHERE (s.source = 'config' OR sqlc.arg(force)::boolean)
  AND ((s.cron, s.timezone, s.kind, s.args, s.queue, s.priority, s.max_attempts, s.tags, s.misfire, s.enabled, s.source)
       IS DISTINCT FROM
       (EXCLUDED.cron, EXCLUDED.timezone, EXCLUDED.kind, EXCLUDED.args, EXCLUDED.queue, EXCLUDED.priority,
        EXCLUDED.max_attempts, EXCLUDED.tags, EXCLUDED.misfire, EXCLUDED.enabled, 'config'))
RETURNING s.name, (s.xmax = 0)::boolean AS inserted;

-- name: ScheduleDeclared :one
-- Whether name is a declared schedule.
SELECT EXISTS (SELECT 1 FROM schedule_declarations WHERE name = sqlc.arg(name))::boolean AS declared;
