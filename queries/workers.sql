-- sluice_workers: one row per running worker (heartbeat).

-- name: UpsertWorkerHeartbeat :exec
-- Registers the worker at start and refreshes its heartbeat; re-creates the
-- row if something deleted it while the worker was alive.
INSERT INTO sluice_workers (id, host, pid, heartbeat_interval, dispatcher_tick_at, poll_interval)
VALUES (sqlc.arg(id), sqlc.arg(host), sqlc.arg(pid), sqlc.arg(heartbeat_interval),
        sqlc.narg(dispatcher_tick_at), sqlc.narg(poll_interval))
ON CONFLICT (id) DO UPDATE
SET heartbeat_at = now(),
    heartbeat_interval = EXCLUDED.heartbeat_interval,
    dispatcher_tick_at = EXCLUDED.dispatcher_tick_at,
    poll_interval = EXCLUDED.poll_interval;

-- name: DeleteWorker :exec
-- A clean shutdown removes the worker's row.
DELETE FROM sluice_workers WHERE id = sqlc.arg(id);

-- name: WorkerHealth :one
-- Counts for health checks (liveness as in sluice_worker_status), and the
-- latest dispatcher tick of a live worker.
SELECT
    c.live,
    c.stale,
    c.dispatchers_fresh,
    c.dispatchers_stale,
    t.dispatcher_tick_at AS last_tick_at,
    now()::timestamptz AS db_now
FROM (
    SELECT
        count(*) FILTER (WHERE w.live) AS live,
        count(*) FILTER (WHERE NOT w.live) AS stale,
        count(*) FILTER (WHERE w.live AND w.dispatcher_fresh) AS dispatchers_fresh,
        count(*) FILTER (WHERE w.live AND w.poll_interval IS NOT NULL AND NOT w.dispatcher_fresh) AS dispatchers_stale
    FROM sluice_worker_status w
) AS c
LEFT JOIN LATERAL (
    SELECT l.dispatcher_tick_at FROM sluice_worker_status l
    WHERE l.live AND l.dispatcher_tick_at IS NOT NULL
    ORDER BY l.dispatcher_tick_at DESC
    LIMIT 1
) AS t ON true;
