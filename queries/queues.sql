-- Queues: what `sluice queues list` shows and what `sluice health` checks.
-- Pausing and resuming go through River's client (QueuePause, QueueResume).

-- name: QueueList :many
-- Every queue River knows (river_queue: served recently), holding a job not
-- yet finished, or served by a live worker: its jobs per state not yet
-- finished (finished ones are left out: River keeps them a day, discarded
-- ones a week, and counting them would scan them all), how long its oldest
-- available job has waited (0: none waits), since when it is paused (NULL:
-- it is not), and the live workers that serve it with the jobs each works
-- at once ({"worker id": N}; a worker from before queues were recorded
-- serves default and maintenance, N 0: not recorded).
WITH counts AS (
    SELECT j.queue,
           count(*) FILTER (WHERE j.state = 'available') AS available,
           count(*) FILTER (WHERE j.state = 'pending') AS pending,
           count(*) FILTER (WHERE j.state = 'running') AS running,
           count(*) FILTER (WHERE j.state = 'retryable') AS retryable,
           count(*) FILTER (WHERE j.state = 'scheduled') AS scheduled,
           min(j.scheduled_at) FILTER (WHERE j.state = 'available') AS oldest_available_at
    FROM river_job j
    WHERE j.state IN ('available', 'pending', 'running', 'retryable', 'scheduled')
    GROUP BY j.queue
),
served AS (
    SELECT q.queue,
           jsonb_object_agg(w.id, CASE WHEN jsonb_typeof(q.size) = 'number' THEN q.size ELSE '0'::jsonb END) AS served_by
    FROM worker_status s
    JOIN sluice_workers w ON w.id = s.id
    CROSS JOIN LATERAL jsonb_each(COALESCE(w.queues, '{"default": null, "maintenance": null}'::jsonb)) AS q(queue, size)
    WHERE s.live
    GROUP BY q.queue
),
queues AS (
    SELECT name AS queue FROM river_queue
    UNION
    SELECT queue FROM counts
    UNION
    SELECT queue FROM served
)
SELECT q.queue::text AS queue,
       COALESCE(c.available, 0)::bigint AS available,
       COALESCE(c.pending, 0)::bigint AS pending,
       COALESCE(c.running, 0)::bigint AS running,
       COALESCE(c.retryable, 0)::bigint AS retryable,
       COALESCE(c.scheduled, 0)::bigint AS scheduled,
       COALESCE(GREATEST(extract(epoch FROM now() - c.oldest_available_at), 0), 0)::float8 AS oldest_available_seconds,
       rq.paused_at,
       COALESCE(s.served_by, '{}'::jsonb)::jsonb AS served_by
FROM queues q
LEFT JOIN counts c ON c.queue = q.queue
LEFT JOIN river_queue rq ON rq.name = q.queue
LEFT JOIN served s ON s.queue = q.queue
ORDER BY 1;

-- name: UnservedQueues :many
-- Queues with available jobs that no live worker serves (sluice health):
-- how many wait and how long the oldest has. A queue is served by a live
-- sluice worker that recorded it, or by any River client whose producer
-- reported it in river_queue within reported_within_seconds (River reports
-- every 10 minutes by default: a queue added to a running client, or served
-- by a plain River client). Queues whose name matches skip_like (the
-- private queues of `sluice run`, worked by the process that inserted
-- their one job) are left out.
WITH served AS (
    SELECT DISTINCT q.queue
    FROM worker_status s
    JOIN sluice_workers w ON w.id = s.id
    CROSS JOIN LATERAL jsonb_object_keys(COALESCE(w.queues, '{"default": null, "maintenance": null}'::jsonb)) AS q(queue)
    WHERE s.live
    UNION
    SELECT rq.name FROM river_queue rq
    WHERE rq.updated_at > now() - make_interval(secs => sqlc.arg(reported_within_seconds)::float8)
)
SELECT j.queue::text AS queue,
       count(*)::bigint AS available,
       GREATEST(extract(epoch FROM now() - min(j.scheduled_at)), 0)::float8 AS oldest_available_seconds
FROM river_job j
WHERE j.state = 'available'
  AND j.queue NOT LIKE sqlc.arg(skip_like)::text
  AND j.queue NOT IN (SELECT queue FROM served)
GROUP BY j.queue
ORDER BY j.queue;

-- name: PausedQueues :many
-- Queues paused (River's QueuePause) longer than paused_after_seconds ago
-- (sluice health): since when, and how many available jobs they hold.
SELECT q.name::text AS queue,
       q.paused_at::timestamptz AS paused_at,
       extract(epoch FROM now() - q.paused_at)::float8 AS paused_seconds,
       (SELECT count(*) FROM river_job j WHERE j.queue = q.name AND j.state = 'available')::bigint AS available
FROM river_queue q
WHERE q.paused_at IS NOT NULL
  AND q.paused_at < now() - make_interval(secs => sqlc.arg(paused_after_seconds)::float8)
ORDER BY q.paused_at, q.name;
