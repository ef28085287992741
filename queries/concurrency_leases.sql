-- Slot leases: the fast path of concurrency limits. A worker takes slots of
-- a kind in bulk (GrantLease), runs its jobs of the kind within them, hands
-- a freed slot to its next waiting job in memory, and gives back what it no
-- longer needs (ReturnLease). Every statement that changes a lease locks the
-- kind's limit row first, as admission does, and keeps its admitted count
-- equal to the slot rows plus the leased slots.

-- name: LeaseState :one
-- The state of kind as a lease holder sees it, without locking: the limit,
-- the slots taken, whether jobs are parked or slots reserved, the slots
-- this worker's lease holds, and how many other workers hold slots of the
-- kind or asked for some within the last wanted_window_ms (they share the
-- limit fairly).
SELECT l.max_concurrency, l.admitted, l.has_parked,
       (l.partition_fields IS NOT NULL OR l.rate_max IS NOT NULL)::boolean AS keyed,
       COALESCE((SELECT cl.slots FROM concurrency_leases cl
                 WHERE cl.kind = l.kind AND cl.worker_id = sqlc.arg(worker_id)::text), 0)::integer AS own,
       EXISTS (SELECT 1 FROM concurrency_executions e WHERE e.kind = l.kind AND e.reserved) AS has_reserved,
       (SELECT count(*) FROM concurrency_leases cl
        WHERE cl.kind = l.kind AND cl.worker_id <> sqlc.arg(worker_id)::text
          AND (cl.slots > 0 OR cl.wanted_at > now() - make_interval(secs => sqlc.arg(wanted_window_ms)::bigint / 1000.0)))::integer AS others
FROM concurrency_limits l
WHERE l.kind = sqlc.arg(kind);

-- name: ReturnLease :one
-- Gives back up to n slots of kind leased to worker_id (no more than it
-- holds: a lease the reaper already freed gives back nothing) and returns
-- how many went back and the kind's state after, so that the caller can
-- resume parked jobs into them.
WITH lim AS (
    SELECT l.kind FROM concurrency_limits l
    WHERE l.kind = sqlc.arg(kind)
    FOR UPDATE
),
old AS (
    SELECT cl.slots FROM concurrency_leases cl, lim
    WHERE cl.kind = lim.kind AND cl.worker_id = sqlc.arg(worker_id)::text
    FOR UPDATE OF cl
),
back AS (
    UPDATE concurrency_leases cl
    SET slots = cl.slots - LEAST(sqlc.arg(n)::integer, old.slots), renewed_at = now()
    FROM old
    WHERE cl.kind = sqlc.arg(kind) AND cl.worker_id = sqlc.arg(worker_id)::text
    RETURNING LEAST(sqlc.arg(n)::integer, old.slots) AS n
),
counted AS (
    UPDATE concurrency_limits l
    SET admitted = GREATEST(l.admitted - back.n, 0)
    FROM back
    WHERE l.kind = sqlc.arg(kind)
    RETURNING l.max_concurrency, l.admitted, l.has_parked
)
SELECT COALESCE((SELECT back.n FROM back), 0)::integer AS returned,
       COALESCE((SELECT c.max_concurrency FROM counted c), 0)::integer AS max_concurrency,
       COALESCE((SELECT c.admitted FROM counted c), 0)::integer AS admitted,
       COALESCE((SELECT c.has_parked FROM counted c), false)::boolean AS has_parked;

-- name: RenewLease :one
-- Marks the lease of worker_id on kind as alive and returns the slots it
-- holds (0 when the row is gone: the lease expired or the limit was
-- removed), which the worker checks against its own count.
WITH renewed AS (
    UPDATE concurrency_leases
    SET renewed_at = now()
    WHERE worker_id = sqlc.arg(worker_id)::text AND kind = sqlc.arg(kind)
    RETURNING slots
)
SELECT COALESCE((SELECT slots FROM renewed), 0)::integer AS slots;

-- name: DeleteStaleLeases :many
-- Frees the leases of kind not renewed within ttl_ms whose holder has no
-- sluice_workers row (a process gone without a liveness row to reap); a
-- registered worker's leases are the reaper's, once it is dead, which also
-- fences it. Returns the slots freed. Run under the kind's limit row lock,
-- before RecountConcurrency.
DELETE FROM concurrency_leases cl
WHERE cl.kind = sqlc.arg(kind)
  AND cl.renewed_at < now() - make_interval(secs => sqlc.arg(ttl_ms)::bigint / 1000.0)
  AND NOT EXISTS (SELECT 1 FROM sluice_workers w WHERE w.id = cl.worker_id)
RETURNING cl.worker_id, cl.slots;

-- name: DeleteWorkerLeases :many
-- Frees every lease of a dead worker (the reaper, under the kinds' limit
-- row locks) and returns the slots freed per kind.
DELETE FROM concurrency_leases cl
WHERE cl.worker_id = sqlc.arg(worker_id)::text
RETURNING cl.kind, cl.slots;
