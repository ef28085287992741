-- Moves an install of the layout before sluice had a schema of its own
-- (every sluice object beside River's tables in /* TEMPLATE: legacy */, and
-- sluice's migrations 1 to 8 recorded in its goose_db_version) into
-- /* TEMPLATE: schema */, every row kept. Run by `migrate up`, in one
-- transaction, under the migration lock, when the legacy layout is found
-- and the schema's own version table does not exist yet.
--
-- Tables move with their indexes, constraints, sequences and triggers;
-- views and triggers keep pointing at the same objects (Postgres binds them
-- by identity, not by name). The trigger functions' search_path is pinned
-- to the new layout here (migration 00009 pins it again, FROM CURRENT), so
-- the triggers on river_job find the moved tables from any session.
--
-- The versions move to the version tables of the new layout: 3 (ci_builds)
-- becomes version 1 of the cibuilds module, 4 (project exports) version 1
-- of exports, 6 (task cancellation) version 1 of taskcancel; 1, 2, 5, 7 and
-- 8 stay sluice's. Rows of other versions in the old table (an
-- application's own goose migrations that shared it) stay where they are;
-- the old table is dropped when nothing else is left in it.

CREATE SCHEMA IF NOT EXISTS /* TEMPLATE: schema */;

ALTER TABLE IF EXISTS /* TEMPLATE: legacy */.settings SET SCHEMA /* TEMPLATE: schema */;
ALTER TABLE IF EXISTS /* TEMPLATE: legacy */.maintenance_runs SET SCHEMA /* TEMPLATE: schema */;
ALTER TABLE IF EXISTS /* TEMPLATE: legacy */.schedules SET SCHEMA /* TEMPLATE: schema */;
ALTER TABLE IF EXISTS /* TEMPLATE: legacy */.sluice_workers SET SCHEMA /* TEMPLATE: schema */;
ALTER TABLE IF EXISTS /* TEMPLATE: legacy */.concurrency_limits SET SCHEMA /* TEMPLATE: schema */;
ALTER TABLE IF EXISTS /* TEMPLATE: legacy */.concurrency_parked_jobs SET SCHEMA /* TEMPLATE: schema */;
ALTER TABLE IF EXISTS /* TEMPLATE: legacy */.concurrency_executions SET SCHEMA /* TEMPLATE: schema */;
ALTER TABLE IF EXISTS /* TEMPLATE: legacy */.concurrency_leases SET SCHEMA /* TEMPLATE: schema */;
ALTER TABLE IF EXISTS /* TEMPLATE: legacy */.ci_builds SET SCHEMA /* TEMPLATE: schema */;
ALTER TABLE IF EXISTS /* TEMPLATE: legacy */.project_export_jobs SET SCHEMA /* TEMPLATE: schema */;
ALTER TABLE IF EXISTS /* TEMPLATE: legacy */.project_relation_exports SET SCHEMA /* TEMPLATE: schema */;
ALTER TABLE IF EXISTS /* TEMPLATE: legacy */.task_cancellation_tracker SET SCHEMA /* TEMPLATE: schema */;
ALTER TABLE IF EXISTS /* TEMPLATE: legacy */.task_cancellation_counters SET SCHEMA /* TEMPLATE: schema */;

ALTER VIEW IF EXISTS /* TEMPLATE: legacy */.sluice_queue_overview SET SCHEMA /* TEMPLATE: schema */;
ALTER VIEW IF EXISTS /* TEMPLATE: legacy */.sluice_worker_status SET SCHEMA /* TEMPLATE: schema */;
ALTER VIEW IF EXISTS /* TEMPLATE: legacy */.sluice_schedule_status SET SCHEMA /* TEMPLATE: schema */;
ALTER VIEW IF EXISTS /* TEMPLATE: legacy */.sluice_concurrency_overview SET SCHEMA /* TEMPLATE: schema */;
ALTER VIEW IF EXISTS /* TEMPLATE: legacy */.sluice_parked_jobs SET SCHEMA /* TEMPLATE: schema */;
ALTER VIEW IF EXISTS /* TEMPLATE: legacy */.sluice_task_cancellation_stats SET SCHEMA /* TEMPLATE: schema */;

ALTER FUNCTION IF EXISTS /* TEMPLATE: legacy */.sluice_schedules_before_update() SET SCHEMA /* TEMPLATE: schema */;
ALTER FUNCTION IF EXISTS /* TEMPLATE: legacy */.sluice_schedules_notify() SET SCHEMA /* TEMPLATE: schema */;
ALTER FUNCTION IF EXISTS /* TEMPLATE: legacy */.sluice_schedule_overdue_after() SET SCHEMA /* TEMPLATE: schema */;
ALTER FUNCTION IF EXISTS /* TEMPLATE: legacy */.concurrency_limits_init_counts() SET SCHEMA /* TEMPLATE: schema */;
ALTER FUNCTION IF EXISTS /* TEMPLATE: legacy */.sluice_worker_fence() SET SCHEMA /* TEMPLATE: schema */;
ALTER FUNCTION IF EXISTS /* TEMPLATE: legacy */.sluice_terminate_backends(text, bigint) SET SCHEMA /* TEMPLATE: schema */;
ALTER FUNCTION IF EXISTS /* TEMPLATE: legacy */.sluice_park_in_place() SET SCHEMA /* TEMPLATE: schema */;
ALTER FUNCTION IF EXISTS /* TEMPLATE: legacy */.sluice_unpark() SET SCHEMA /* TEMPLATE: schema */;
ALTER FUNCTION IF EXISTS /* TEMPLATE: legacy */.sluice_task_cancellation_attempted_at(jsonb) SET SCHEMA /* TEMPLATE: schema */;
ALTER FUNCTION IF EXISTS /* TEMPLATE: legacy */.sluice_task_cancellation_track() SET SCHEMA /* TEMPLATE: schema */;
ALTER FUNCTION IF EXISTS /* TEMPLATE: legacy */.sluice_task_cancellation_untrack() SET SCHEMA /* TEMPLATE: schema */;
ALTER FUNCTION IF EXISTS /* TEMPLATE: legacy */.sluice_task_cancellation_threshold() SET SCHEMA /* TEMPLATE: schema */;
ALTER FUNCTION IF EXISTS /* TEMPLATE: legacy */.sluice_task_cancellation_kinds() SET SCHEMA /* TEMPLATE: schema */;

ALTER FUNCTION IF EXISTS /* TEMPLATE: schema */.sluice_schedules_before_update() SET search_path = /* TEMPLATE: search_path */;
ALTER FUNCTION IF EXISTS /* TEMPLATE: schema */.sluice_schedules_notify() SET search_path = /* TEMPLATE: search_path */;
ALTER FUNCTION IF EXISTS /* TEMPLATE: schema */.sluice_schedule_overdue_after() SET search_path = /* TEMPLATE: search_path */;
ALTER FUNCTION IF EXISTS /* TEMPLATE: schema */.concurrency_limits_init_counts() SET search_path = /* TEMPLATE: search_path */;
ALTER FUNCTION IF EXISTS /* TEMPLATE: schema */.sluice_worker_fence() SET search_path = /* TEMPLATE: search_path */;
ALTER FUNCTION IF EXISTS /* TEMPLATE: schema */.sluice_terminate_backends(text, bigint) SET search_path = /* TEMPLATE: search_path */;
ALTER FUNCTION IF EXISTS /* TEMPLATE: schema */.sluice_park_in_place() SET search_path = /* TEMPLATE: search_path */;
ALTER FUNCTION IF EXISTS /* TEMPLATE: schema */.sluice_unpark() SET search_path = /* TEMPLATE: search_path */;
ALTER FUNCTION IF EXISTS /* TEMPLATE: schema */.sluice_task_cancellation_attempted_at(jsonb) SET search_path = /* TEMPLATE: search_path */;
ALTER FUNCTION IF EXISTS /* TEMPLATE: schema */.sluice_task_cancellation_track() SET search_path = /* TEMPLATE: search_path */;
ALTER FUNCTION IF EXISTS /* TEMPLATE: schema */.sluice_task_cancellation_untrack() SET search_path = /* TEMPLATE: search_path */;
ALTER FUNCTION IF EXISTS /* TEMPLATE: schema */.sluice_task_cancellation_threshold() SET search_path = /* TEMPLATE: search_path */;
ALTER FUNCTION IF EXISTS /* TEMPLATE: schema */.sluice_task_cancellation_kinds() SET search_path = /* TEMPLATE: search_path */;

-- The version tables of the new layout, as goose creates them, with the
-- moved versions (and goose's version-0 row), in their original order.
CREATE TABLE /* TEMPLATE: schema */.goose_db_version (
    id integer PRIMARY KEY GENERATED BY DEFAULT AS IDENTITY,
    version_id bigint NOT NULL,
    is_applied boolean NOT NULL,
    tstamp timestamp NOT NULL DEFAULT now()
);
INSERT INTO /* TEMPLATE: schema */.goose_db_version (version_id, is_applied, tstamp)
SELECT version_id, is_applied, tstamp FROM /* TEMPLATE: legacy */.goose_db_version
WHERE version_id IN (0, 1, 2, 5, 7, 8) ORDER BY id;

CREATE TABLE /* TEMPLATE: schema */.goose_db_version_cibuilds (LIKE /* TEMPLATE: schema */.goose_db_version INCLUDING ALL);
INSERT INTO /* TEMPLATE: schema */.goose_db_version_cibuilds (version_id, is_applied, tstamp)
SELECT CASE version_id WHEN 3 THEN 1 ELSE 0 END, is_applied, tstamp FROM /* TEMPLATE: legacy */.goose_db_version
WHERE version_id IN (0, 3) ORDER BY id;

CREATE TABLE /* TEMPLATE: schema */.goose_db_version_exports (LIKE /* TEMPLATE: schema */.goose_db_version INCLUDING ALL);
INSERT INTO /* TEMPLATE: schema */.goose_db_version_exports (version_id, is_applied, tstamp)
SELECT CASE version_id WHEN 4 THEN 1 ELSE 0 END, is_applied, tstamp FROM /* TEMPLATE: legacy */.goose_db_version
WHERE version_id IN (0, 4) ORDER BY id;

CREATE TABLE /* TEMPLATE: schema */.goose_db_version_taskcancel (LIKE /* TEMPLATE: schema */.goose_db_version INCLUDING ALL);
INSERT INTO /* TEMPLATE: schema */.goose_db_version_taskcancel (version_id, is_applied, tstamp)
SELECT CASE version_id WHEN 6 THEN 1 ELSE 0 END, is_applied, tstamp FROM /* TEMPLATE: legacy */.goose_db_version
WHERE version_id IN (0, 6) ORDER BY id;

DELETE FROM /* TEMPLATE: legacy */.goose_db_version WHERE version_id BETWEEN 1 AND 8;
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM /* TEMPLATE: legacy */.goose_db_version WHERE version_id <> 0) THEN
        DROP TABLE /* TEMPLATE: legacy */.goose_db_version;
    END IF;
END
$$;
