-- Slot leases: the fast path of a per-kind limit alone. A worker takes
-- slots of a kind in bulk (LedgerLease), runs its jobs of the kind within
-- them, hands a freed slot to its next waiting job in memory, and gives
-- back what it no longer needs (LedgerReturnLease). Every statement that
-- changes a lease runs in a ledger transaction holding the kind's lock,
-- as admission does, and keeps the admitted count equal to the slot rows
-- plus the leased slots.

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
