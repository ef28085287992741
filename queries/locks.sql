-- Advisory locks. A lock key is hashtextextended(name, 0), so an operator can
-- find or take the lock of a maintenance kind by name in SQL.

-- name: TryAdvisoryLock :one
-- Takes the session-level advisory lock of name without waiting.
SELECT pg_try_advisory_lock(hashtextextended(sqlc.arg(name)::text, 0)) AS acquired;

-- name: AdvisoryLock :exec
-- Takes the session-level advisory lock of name, waiting for it.
SELECT pg_advisory_lock(hashtextextended(sqlc.arg(name)::text, 0));

-- name: AdvisoryUnlock :one
-- Releases the session-level advisory lock of name held by this session.
SELECT pg_advisory_unlock(hashtextextended(sqlc.arg(name)::text, 0)) AS released;

-- name: AdvisoryLockHolders :many
-- Sessions holding the session-level advisory lock of name in this database,
-- for log lines and operators: a bigint key shows in pg_locks as classid
-- (high 32 bits) and objid (low 32 bits) with objsubid = 1.
SELECT l.pid, COALESCE(a.application_name, '')::text AS application_name
FROM pg_catalog.pg_locks l
LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory'
  AND l.granted
  AND l.objsubid = 1
  AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = current_database())
  AND ((l.classid::bigint << 32) | l.objid::bigint) = hashtextextended(sqlc.arg(name)::text, 0);
