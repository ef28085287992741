-- sluice_workers: one row per running worker (heartbeat).

-- name: RegisterWorker :execrows
-- Registers the worker at start, with the queues it serves. A row with the
-- same id (a process that reused the id) is left alone and nothing is
-- inserted: the caller waits for it to be reaped or takes it over once it is
-- dead.
INSERT INTO sluice_workers (id, incarnation, host, pid, heartbeat_interval, dead_after, backend_name, poll_interval, queues)
VALUES (sqlc.arg(id), sqlc.arg(incarnation), sqlc.arg(host), sqlc.arg(pid), sqlc.arg(heartbeat_interval),
        sqlc.arg(dead_after), sqlc.narg(backend_name), sqlc.narg(poll_interval), sqlc.narg(queues))
ON CONFLICT (id) DO NOTHING;

-- name: HeartbeatWorker :execrows
-- Refreshes the worker's heartbeat. No row: the worker was declared dead and
-- reaped (or its row was deleted by hand); it must stop working under its id.
UPDATE sluice_workers
SET heartbeat_at = now(),
    heartbeat_interval = sqlc.arg(heartbeat_interval),
    dead_after = sqlc.arg(dead_after),
    dispatcher_tick_at = sqlc.narg(dispatcher_tick_at),
    poll_interval = sqlc.narg(poll_interval)
WHERE id = sqlc.arg(id) AND incarnation = sqlc.arg(incarnation);

-- name: DeleteWorker :exec
-- A clean shutdown removes the worker's row.
DELETE FROM sluice_workers WHERE id = sqlc.arg(id) AND incarnation = sqlc.arg(incarnation);

-- name: WorkerRegistered :many
-- The worker's row, if it is still registered: checked on every new
-- connection of a registered worker. FOR KEY SHARE waits for a reaper that is
-- reaping the row, so a worker being reaped cannot open a connection that
-- outlives the reap.
SELECT id FROM sluice_workers
WHERE id = sqlc.arg(id) AND incarnation = sqlc.arg(incarnation)
FOR KEY SHARE;

-- name: GetWorkerLiveness :one
-- A worker row and whether it is dead (heartbeat older than its dead_after),
-- by the database's clock.
SELECT id, incarnation, host, pid, heartbeat_at, dead_after, backend_name,
       (heartbeat_at < now() - dead_after)::boolean AS dead,
       extract(epoch FROM now() - heartbeat_at)::float8 AS heartbeat_age_seconds
FROM sluice_workers
WHERE id = sqlc.arg(id);

-- name: WorkerHealth :one
-- Counts for health checks (liveness as in worker_status), the
-- latest dispatcher tick of a live worker, and the latest tick of any
-- worker with a row, whatever its status (a dead worker's, not reaped
-- yet): which worker, on which host, its status and heartbeat's age.
SELECT
    c.live,
    c.stale,
    c.dead,
    c.dispatchers_fresh,
    c.dispatchers_stale,
    t.dispatcher_tick_at AS last_tick_at,
    COALESCE(a.id, '')::text AS any_tick_worker,
    COALESCE(a.host, '')::text AS any_tick_host,
    COALESCE(a.status, '')::text AS any_tick_status,
    a.dispatcher_tick_at AS any_tick_at,
    COALESCE(extract(epoch FROM a.heartbeat_age), 0)::float8 AS any_tick_heartbeat_age_seconds,
    now()::timestamptz AS db_now
FROM (
    SELECT
        count(*) FILTER (WHERE w.live) AS live,
        count(*) FILTER (WHERE NOT w.live) AS stale,
        count(*) FILTER (WHERE w.dead) AS dead,
        count(*) FILTER (WHERE w.live AND w.dispatcher_fresh) AS dispatchers_fresh,
        count(*) FILTER (WHERE w.live AND w.poll_interval IS NOT NULL AND NOT w.dispatcher_fresh) AS dispatchers_stale
    FROM worker_status w
) AS c
LEFT JOIN LATERAL (
    SELECT l.dispatcher_tick_at FROM worker_status l
    WHERE l.live AND l.dispatcher_tick_at IS NOT NULL
    ORDER BY l.dispatcher_tick_at DESC
    LIMIT 1
) AS t ON true
LEFT JOIN LATERAL (
    SELECT l.id, l.host, l.status, l.dispatcher_tick_at, l.heartbeat_age FROM worker_status l
    WHERE l.dispatcher_tick_at IS NOT NULL
    ORDER BY l.dispatcher_tick_at DESC
    LIMIT 1
) AS a ON true;

-- name: WorkerStatusList :many
-- Every worker with its liveness and running jobs (worker_status),
-- dead ones first.
SELECT id, host, pid, status, heartbeat_at,
       extract(epoch FROM heartbeat_age)::float8 AS heartbeat_age_seconds,
       extract(epoch FROM dead_after)::float8 AS dead_after_seconds,
       running_jobs
FROM worker_status
ORDER BY dead DESC, heartbeat_at, id
LIMIT sqlc.arg(max_rows);

-- name: StaleDispatchers :many
-- Live workers whose dispatcher has not ticked recently, with how long ago
-- it last ticked (-1: never) and how long the worker has run, oldest tick
-- first.
SELECT id, host,
       extract(epoch FROM now() - started_at)::float8 AS started_age_seconds,
       COALESCE(extract(epoch FROM dispatcher_tick_age)::float8, -1)::float8 AS tick_age_seconds
FROM worker_status
WHERE live AND poll_interval IS NOT NULL AND NOT dispatcher_fresh
ORDER BY dispatcher_tick_at NULLS FIRST, id
LIMIT sqlc.arg(max_rows);

-- name: WorkerStatusPage :many
-- Every worker as worker_status shows it, for the web pages: dead
-- ones first, with the heartbeat's age and interval, the dispatcher's last
-- tick (age -1: never, or no dispatcher) and the jobs it runs.
SELECT id, host, pid, status, started_at, heartbeat_at,
       extract(epoch FROM heartbeat_age)::float8 AS heartbeat_age_seconds,
       extract(epoch FROM heartbeat_interval)::float8 AS heartbeat_interval_seconds,
       extract(epoch FROM dead_after)::float8 AS dead_after_seconds,
       (poll_interval IS NOT NULL)::boolean AS dispatcher,
       dispatcher_fresh::boolean AS dispatcher_fresh,
       COALESCE(extract(epoch FROM dispatcher_tick_age)::float8, -1)::float8 AS dispatcher_tick_age_seconds,
       running_jobs
FROM worker_status
ORDER BY dead DESC, id
LIMIT sqlc.arg(max_rows);

-- name: AliveWorkers :many
-- The workers not yet dead (heartbeat younger than their dead_after), for
-- `migrate down`, which refuses to roll back under them, at whatever version
-- the schema is: it names only the columns sluice_workers has had since it
-- came (00002), and reads dead_after (00007 on) from the row as it is. A row
-- without it is alive while its heartbeat is younger than three heartbeat
-- intervals, the rule of the versions before dead_after.
SELECT w.id, w.host, w.pid FROM sluice_workers w
WHERE w.heartbeat_at > now() - COALESCE((to_jsonb(w) ->> 'dead_after')::interval, 3 * w.heartbeat_interval)
ORDER BY w.id;
