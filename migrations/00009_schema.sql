-- sluice's objects live in a schema of their own (sluice by default; see
-- `sluice migrate up --schema`), with sluice's goose version table: `migrate
-- up` creates the schema and runs every migration with it first on the
-- search_path, River's schema second. An install of the layout before this
-- migration (everything in public, goose_db_version shared) is moved into
-- the schema by `migrate up` before this migration runs.
--
-- This migration pins the search_path of every function of sluice's core to
-- the one it runs with ("<sluice schema>", "<River's schema>"): the trigger
-- functions on river_job run in every River client's session, whatever its
-- own search_path, and a caller's search_path must never swap in another
-- object of the same name.

-- +goose Up
ALTER FUNCTION sluice_schedules_before_update() SET search_path FROM CURRENT;
ALTER FUNCTION sluice_schedules_notify() SET search_path FROM CURRENT;
ALTER FUNCTION sluice_schedule_overdue_after() SET search_path FROM CURRENT;
ALTER FUNCTION concurrency_limits_init_counts() SET search_path FROM CURRENT;
ALTER FUNCTION sluice_worker_fence() SET search_path FROM CURRENT;
ALTER FUNCTION sluice_terminate_backends(text, bigint) SET search_path FROM CURRENT;
ALTER FUNCTION sluice_park_in_place() SET search_path FROM CURRENT;
ALTER FUNCTION sluice_unpark() SET search_path FROM CURRENT;

-- +goose Down
ALTER FUNCTION sluice_schedules_before_update() RESET search_path;
ALTER FUNCTION sluice_schedules_notify() RESET search_path;
ALTER FUNCTION sluice_schedule_overdue_after() RESET search_path;
ALTER FUNCTION concurrency_limits_init_counts() RESET search_path;
ALTER FUNCTION sluice_worker_fence() RESET search_path;
ALTER FUNCTION sluice_terminate_backends(text, bigint) RESET search_path;
ALTER FUNCTION sluice_park_in_place() RESET search_path;
ALTER FUNCTION sluice_unpark() RESET search_path;
