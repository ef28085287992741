-- name: GetSetting :one
-- Current value of a dynamic setting.
SELECT value FROM settings WHERE key = sqlc.arg(key);

-- name: UpsertSetting :exec
-- Sets a dynamic setting.
INSERT INTO settings (key, value)
VALUES (sqlc.arg(key), sqlc.arg(value))
ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, updated_at = now();

-- name: ListSettings :many
SELECT * FROM settings ORDER BY key;
