-- The cluster-wide gauges of package metrics (Cluster), read by one worker
-- at a time, every --metrics-interval.

-- name: MetricsLeader :one
-- River's elected leader (the exporter of the cluster-wide gauges), or ''
-- when no leadership is current.
SELECT COALESCE((SELECT leader_id FROM river_leader WHERE expires_at > now() ORDER BY elected_at DESC LIMIT 1), '')::text AS leader_id;

-- name: MetricsQueueJobs :many
-- Jobs still to finish per queue and state, every queue River knows (from
-- river_queue, or from a job) with every such state, zeros included.
-- Finished states (completed, cancelled, discarded) are not counted: River
-- keeps those rows a day (discarded ones a week) by default, and counting
-- them would scan them all; sluice_jobs_total counts the outcomes.
WITH states AS (SELECT unnest(ARRAY['available', 'pending', 'running', 'retryable', 'scheduled']::text[]) AS state),
counts AS (
    SELECT j.queue, j.state::text AS state, count(*) AS jobs
    FROM river_job j
    WHERE j.state IN ('available', 'pending', 'running', 'retryable', 'scheduled')
    GROUP BY j.queue, j.state
),
queues AS (
    SELECT name AS queue FROM river_queue
    UNION
    SELECT queue FROM counts
)
SELECT q.queue::text AS queue, s.state::text AS state, COALESCE(c.jobs, 0)::bigint AS jobs
FROM queues q CROSS JOIN states s
LEFT JOIN counts c ON c.queue = q.queue AND c.state = s.state
ORDER BY 1, 2;

-- name: MetricsQueueOldestAvailable :many
-- Per queue, how long its oldest available job has waited (0 when none
-- waits).
WITH oldest AS (
    SELECT queue, min(scheduled_at) AS at FROM river_job WHERE state = 'available' GROUP BY queue
),
queues AS (
    SELECT name AS queue FROM river_queue
    UNION
    SELECT queue FROM oldest
)
SELECT q.queue::text AS queue,
       COALESCE(GREATEST(extract(epoch FROM now() - o.at), 0), 0)::float8 AS age_seconds
FROM queues q LEFT JOIN oldest o ON o.queue = q.queue
ORDER BY 1;

-- name: MetricsConcurrency :many
-- Per kind with a limit or slots or parked jobs: its limit (0: none), slots
-- in use (slot rows and leased slots), parked jobs and the oldest's wait,
-- the partition keys with waiting jobs, and the starts in its rate window.
SELECT kind::text AS kind,
       COALESCE(max_concurrency, 0)::integer AS max_concurrency,
       admitted::bigint AS slots_in_use,
       parked::bigint AS parked,
       COALESCE(extract(epoch FROM oldest_parked_age), 0)::float8 AS oldest_parked_age_seconds,
       parked_keys::bigint AS parked_keys,
       (rate_max IS NOT NULL)::boolean AS rate_limited,
       starts_in_window::bigint AS starts_in_window
FROM concurrency_overview
ORDER BY 1;

-- name: MetricsWorkers :many
-- Workers per status (live, late, dead), zeros included.
WITH statuses AS (SELECT unnest(ARRAY['live', 'late', 'dead']::text[]) AS status)
SELECT s.status::text AS status, count(w.id)::bigint AS workers
FROM statuses s LEFT JOIN worker_status w ON w.status = s.status
GROUP BY s.status
ORDER BY 1;

-- name: MetricsSchedules :many
-- Schedules per health (ok, retrying, overdue, pending, disabled, failed),
-- zeros included.
WITH healths AS (SELECT unnest(ARRAY['ok', 'retrying', 'overdue', 'pending', 'disabled', 'failed']::text[]) AS health)
SELECT h.health::text AS status, count(s.id)::bigint AS schedules
FROM healths h LEFT JOIN schedule_status s ON s.health = h.health
GROUP BY h.health
ORDER BY 1;
