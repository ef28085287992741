-- Pins the search_path of the module's functions to the one `migrate up`
-- runs with ("<sluice schema>", "<River's schema>"): its trigger functions
-- on river_job run in every River client's session, whatever its own
-- search_path.

-- +goose Up
ALTER FUNCTION sluice_task_cancellation_attempted_at(jsonb) SET search_path FROM CURRENT;
ALTER FUNCTION sluice_task_cancellation_track() SET search_path FROM CURRENT;
ALTER FUNCTION sluice_task_cancellation_untrack() SET search_path FROM CURRENT;
ALTER FUNCTION sluice_task_cancellation_threshold() SET search_path FROM CURRENT;
ALTER FUNCTION sluice_task_cancellation_kinds() SET search_path FROM CURRENT;

-- +goose Down
ALTER FUNCTION sluice_task_cancellation_attempted_at(jsonb) RESET search_path;
ALTER FUNCTION sluice_task_cancellation_track() RESET search_path;
ALTER FUNCTION sluice_task_cancellation_untrack() RESET search_path;
ALTER FUNCTION sluice_task_cancellation_threshold() RESET search_path;
ALTER FUNCTION sluice_task_cancellation_kinds() RESET search_path;
