-- Per-key concurrency limits and rate limits (limiter/internal/ledger).
-- Every statement here runs in a ledger transaction that holds the kind's
-- lock (LedgerLockKinds), so they all see and change a kind's keys one
-- transaction at a time across every worker.

-- name: DeleteReservedStarts :exec
-- Drops the starts reserved for granted jobs of kind, whose rate is gone.
DELETE FROM concurrency_starts WHERE kind = sqlc.arg(kind) AND reserved;

-- name: DeleteStaleStarts :many
-- Frees the starts of kind that no window counts any more: those older
-- than keep_ms, and reservations whose job is gone, parked again or
-- cancelled, or not fetched within reserved_ttl_ms. A reservation whose job
-- finished without its worker logging the start is kept as its start; one
-- whose job is running is the job's still (fetched, it claims it when it
-- is decided or starts: as DeleteStaleConcurrencyExecutions keeps a
-- reserved slot).
WITH ran AS (
    UPDATE concurrency_starts s
    SET reserved = false
    WHERE s.kind = sqlc.arg(kind) AND s.reserved
      AND EXISTS (SELECT 1 FROM river_job j
                  WHERE j.id = s.job_id AND j.state IN ('completed', 'retryable', 'discarded'))
    RETURNING s.job_id
)
DELETE FROM concurrency_starts s
WHERE s.kind = sqlc.arg(kind)
  AND ((NOT s.reserved AND s.started_at < now() - make_interval(secs => sqlc.arg(keep_ms)::bigint / 1000.0))
       OR (s.reserved AND s.job_id NOT IN (SELECT r.job_id FROM ran r)
           AND NOT EXISTS (SELECT 1 FROM river_job j
                           WHERE j.id = s.job_id
                             AND (j.state = 'running'
                                  OR (j.state = 'available'
                                      AND s.started_at > now() - make_interval(secs => sqlc.arg(reserved_ttl_ms)::bigint / 1000.0))))))
RETURNING s.job_id;
