-- Setting and clearing limits (the CLI, and the limits declared in Go that
-- every worker writes at start): limiter/config.go. Each change runs in one
-- transaction that locks the kind's limit row first, like admission.

-- name: SetLimitSource :exec
-- The source the transaction's limit changes get: 'sql' or 'config'
-- (trigger concurrency_limits_sources).
SELECT set_config('sluice.limit_source', sqlc.arg(source)::text, true);

-- name: EnsureLimitRow :exec
-- A limit row for kind, without any limit yet (the row every admission of
-- the kind locks), locked: inserted, or the existing row locked by the
-- no-op update (which fires no trigger: it sets no limit column). DO
-- NOTHING would leave it unlocked, and a release that removes an empty
-- row could remove it before the caller locks it.
INSERT INTO concurrency_limits (kind, max_concurrency) VALUES (sqlc.arg(kind), 0)
ON CONFLICT (kind) DO UPDATE SET kind = concurrency_limits.kind;

-- name: LimitConfig :one
-- Kind's limits and their sources (the row locked by the caller).
SELECT kind, max_concurrency, max_source, partition_fields, key_max, key_source,
       rate_max, COALESCE((extract(epoch FROM rate_period) * 1000)::bigint, 0)::bigint AS rate_period_ms,
       rate_per_key, rate_source
FROM concurrency_limits
WHERE kind = sqlc.arg(kind);

-- name: SetLimitConfig :exec
-- Writes every limit of kind with its source (NULL: no limit; rate_period_ms
-- 0: no rate). Sources named here are kept as they are (the trigger
-- concurrency_limits_sources only fills in those a statement leaves alone).
UPDATE concurrency_limits
SET max_concurrency = sqlc.arg(max_concurrency),
    max_source = sqlc.narg(max_source),
    partition_fields = sqlc.narg(partition_fields)::text[],
    key_max = sqlc.narg(key_max),
    key_source = sqlc.narg(key_source),
    rate_max = sqlc.narg(rate_max),
    rate_period = CASE WHEN sqlc.arg(rate_period_ms)::bigint > 0
                       THEN make_interval(secs => sqlc.arg(rate_period_ms)::bigint / 1000.0) END,
    rate_per_key = sqlc.arg(rate_per_key),
    rate_source = sqlc.narg(rate_source),
    updated_at = now()
WHERE kind = sqlc.arg(kind);

-- name: DeleteEmptyLimit :execrows
-- Removes kind's limit row when it holds no limit any more (and no SQL
-- override) and nothing of the kind is held or waits: no slot, lease,
-- parked or waiting job. A row without limits that still has some stays
-- (workers treat the kind as unlimited) until the safety net finds it
-- empty.
DELETE FROM concurrency_limits l
WHERE l.kind = sqlc.arg(kind) AND l.max_concurrency = 0 AND l.key_max IS NULL AND l.rate_max IS NULL
  AND l.max_source IS NULL
  AND NOT EXISTS (SELECT 1 FROM concurrency_executions e WHERE e.kind = l.kind)
  AND NOT EXISTS (SELECT 1 FROM concurrency_leases cl WHERE cl.kind = l.kind AND cl.slots > 0)
  AND NOT EXISTS (SELECT 1 FROM concurrency_parked_jobs p WHERE p.kind = l.kind)
  AND NOT EXISTS (SELECT 1 FROM concurrency_waiters w WHERE w.kind = l.kind);

-- name: DeleteLimitLeases :exec
-- Removes the leases of kind (its per-kind limit went, or it got a per-key
-- or rate limit: every job of it goes through admission now).
DELETE FROM concurrency_leases cl WHERE cl.kind = sqlc.arg(kind);

-- name: UpsertLimitDeclaration :exec
-- Records the limits declared in Go for kind (rate_period_ms 0: no rate).
INSERT INTO concurrency_limit_declarations
    (kind, max_concurrency, partition_fields, key_max, rate_max, rate_period, rate_per_key, declared_by, updated_at)
VALUES (sqlc.arg(kind), sqlc.narg(max_concurrency), sqlc.narg(partition_fields)::text[], sqlc.narg(key_max),
        sqlc.narg(rate_max),
        CASE WHEN sqlc.arg(rate_period_ms)::bigint > 0 THEN make_interval(secs => sqlc.arg(rate_period_ms)::bigint / 1000.0) END,
        sqlc.arg(rate_per_key), sqlc.narg(declared_by), now())
ON CONFLICT (kind) DO UPDATE
SET max_concurrency = EXCLUDED.max_concurrency, partition_fields = EXCLUDED.partition_fields,
    key_max = EXCLUDED.key_max, rate_max = EXCLUDED.rate_max, rate_period = EXCLUDED.rate_period,
    rate_per_key = EXCLUDED.rate_per_key, declared_by = EXCLUDED.declared_by, updated_at = now();

-- name: DeleteLimitDeclaration :execrows
-- Forgets the limits declared for kind (a program that no longer declares
-- any).
DELETE FROM concurrency_limit_declarations WHERE kind = sqlc.arg(kind);

-- name: LimitDeclaration :one
-- The limits declared in Go for kind.
SELECT kind, max_concurrency, partition_fields, key_max, rate_max,
       COALESCE((extract(epoch FROM rate_period) * 1000)::bigint, 0)::bigint AS rate_period_ms,
       rate_per_key
FROM concurrency_limit_declarations
WHERE kind = sqlc.arg(kind);

-- name: ListLimits :many
-- Every kind with a limit, slots or parked jobs, its limits with their
-- sources, and what they hold (concurrency_overview): slots taken,
-- parked jobs, and its running jobs, those that work and those that wait
-- in their worker for a slot.
SELECT o.kind::text AS kind,
       COALESCE(o.max_concurrency, 0)::integer AS max_concurrency, l.max_source,
       l.partition_fields, l.key_max, l.key_source,
       l.rate_max, COALESCE((extract(epoch FROM l.rate_period) * 1000)::bigint, 0)::bigint AS rate_period_ms,
       COALESCE(l.rate_per_key, false)::boolean AS rate_per_key, l.rate_source,
       o.admitted::bigint AS admitted, o.parked::bigint AS parked,
       COALESCE(extract(epoch FROM o.oldest_parked_age), 0)::float8 AS oldest_parked_seconds,
       o.parked_keys::bigint AS parked_keys, o.starts_in_window::bigint AS starts_in_window,
       o.running::bigint AS running, o.working::bigint AS working, o.waiting::bigint AS waiting
FROM concurrency_overview o
LEFT JOIN concurrency_limits l ON l.kind = o.kind
ORDER BY o.kind;

-- name: ListConcurrencyKeys :many
-- concurrency_keys of kind ('': every kind), busiest keys first.
SELECT kind::text AS kind, key::text AS key, max_per_key, rate_max,
       COALESCE((extract(epoch FROM rate_period) * 1000)::bigint, 0)::bigint AS rate_period_ms,
       slots_in_use::bigint AS slots_in_use, parked::bigint AS parked,
       COALESCE(extract(epoch FROM oldest_parked_age), 0)::float8 AS oldest_parked_seconds,
       starts_in_window::bigint AS starts_in_window
FROM concurrency_keys
WHERE sqlc.arg(kind)::text = '' OR kind = sqlc.arg(kind)::text
ORDER BY kind, parked DESC, slots_in_use DESC, key
LIMIT sqlc.arg(max_rows);

-- name: DeleteReservedSlots :exec
-- Drops the slots reserved for granted jobs of kind not started yet, whose
-- limits are all gone: nothing holds the jobs any more, and they run
-- without a slot when fetched.
DELETE FROM concurrency_executions WHERE kind = sqlc.arg(kind) AND reserved;

-- name: ListenLimits :exec
-- Subscribes this session to the changes of limits: a trigger on
-- concurrency_limits (sluice_limits_notify) notifies sluice_limits with
-- the kind whenever a kind's limits change.
LISTEN sluice_limits;

-- name: ListenReservations :exec
-- Subscribes this session to the reservations whose job went: a trigger on
-- river_job (sluice_reservation_gone) notifies sluice_reservations with
-- the kind when a job granted a slot or a start it had not claimed yet is
-- deleted or cancelled.
LISTEN sluice_reservations;
