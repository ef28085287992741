-- name: DeleteRiverQueue :exec
-- Removes the private queue a `sluice run` worked its job in.
DELETE FROM river_queue WHERE name = sqlc.arg(name);
