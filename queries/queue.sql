-- name: QueueOverview :many
-- Jobs per kind and state (queue_overview); oldest_available_seconds
-- is 0 when the kind has no available job.
SELECT kind, state, jobs,
       COALESCE(extract(epoch FROM oldest_available_age), 0)::float8 AS oldest_available_seconds
FROM queue_overview
ORDER BY kind, state;
