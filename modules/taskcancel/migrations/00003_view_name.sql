-- The module's view loses the sluice_ prefix, as sluice's own do
-- (00015_view_names): sluice.task_cancellation_stats. The old name stays
-- for one release, as a view over the new one.

-- +goose Up
ALTER VIEW sluice_task_cancellation_stats RENAME TO task_cancellation_stats;
CREATE VIEW sluice_task_cancellation_stats AS SELECT * FROM task_cancellation_stats;
COMMENT ON VIEW sluice_task_cancellation_stats IS 'Deprecated name of task_cancellation_stats; goes in the next release.';

-- +goose Down
DROP VIEW sluice_task_cancellation_stats;
ALTER VIEW task_cancellation_stats RENAME TO sluice_task_cancellation_stats;
