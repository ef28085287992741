-- sluice's views lose the sluice_ prefix: they live in schema sluice, so
-- `sluice.parked_jobs` reads as it should (not `sluice.sluice_parked_jobs`).
-- The old names stay for one release, as views over the new ones (their
-- columns as of this migration), and go in the next.

-- +goose Up
ALTER VIEW sluice_concurrency_keys RENAME TO concurrency_keys;
ALTER VIEW sluice_concurrency_overview RENAME TO concurrency_overview;
ALTER VIEW sluice_parked_jobs RENAME TO parked_jobs;
ALTER VIEW sluice_queue_overview RENAME TO queue_overview;
ALTER VIEW sluice_schedule_status RENAME TO schedule_status;
ALTER VIEW sluice_waiting_jobs RENAME TO waiting_jobs;
ALTER VIEW sluice_worker_status RENAME TO worker_status;

CREATE VIEW sluice_concurrency_keys AS SELECT * FROM concurrency_keys;
CREATE VIEW sluice_concurrency_overview AS SELECT * FROM concurrency_overview;
CREATE VIEW sluice_parked_jobs AS SELECT * FROM parked_jobs;
CREATE VIEW sluice_queue_overview AS SELECT * FROM queue_overview;
CREATE VIEW sluice_schedule_status AS SELECT * FROM schedule_status;
CREATE VIEW sluice_waiting_jobs AS SELECT * FROM waiting_jobs;
CREATE VIEW sluice_worker_status AS SELECT * FROM worker_status;

COMMENT ON VIEW sluice_concurrency_keys IS 'Deprecated name of concurrency_keys; goes in the next release.';
COMMENT ON VIEW sluice_concurrency_overview IS 'Deprecated name of concurrency_overview; goes in the next release.';
COMMENT ON VIEW sluice_parked_jobs IS 'Deprecated name of parked_jobs; goes in the next release.';
COMMENT ON VIEW sluice_queue_overview IS 'Deprecated name of queue_overview; goes in the next release.';
COMMENT ON VIEW sluice_schedule_status IS 'Deprecated name of schedule_status; goes in the next release.';
COMMENT ON VIEW sluice_waiting_jobs IS 'Deprecated name of waiting_jobs; goes in the next release.';
COMMENT ON VIEW sluice_worker_status IS 'Deprecated name of worker_status; goes in the next release.';

-- +goose Down
DROP VIEW sluice_concurrency_keys;
DROP VIEW sluice_concurrency_overview;
DROP VIEW sluice_parked_jobs;
DROP VIEW sluice_queue_overview;
DROP VIEW sluice_schedule_status;
DROP VIEW sluice_waiting_jobs;
DROP VIEW sluice_worker_status;

ALTER VIEW concurrency_keys RENAME TO sluice_concurrency_keys;
ALTER VIEW concurrency_overview RENAME TO sluice_concurrency_overview;
ALTER VIEW parked_jobs RENAME TO sluice_parked_jobs;
ALTER VIEW queue_overview RENAME TO sluice_queue_overview;
ALTER VIEW schedule_status RENAME TO sluice_schedule_status;
ALTER VIEW waiting_jobs RENAME TO sluice_waiting_jobs;
ALTER VIEW worker_status RENAME TO sluice_worker_status;
