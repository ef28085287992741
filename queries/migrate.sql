-- name: LegacyLayout :one
-- Whether the database holds sluice's layout from before it had a schema of
-- its own, not moved yet: sluice's objects and goose_db_version in
-- legacy_schema (where the connection's search_path put them, River's
-- schema) — sluice_queue_overview, a name only sluice uses, exists from its
-- first migration on — and no settings table in schema yet. `migrate up`
-- then moves them (migrations/bootstrap/legacy.sql).
SELECT
    to_regclass(format('%I.sluice_queue_overview', sqlc.arg(legacy_schema)::text)) IS NOT NULL
    AND to_regclass(format('%I.goose_db_version', sqlc.arg(legacy_schema)::text)) IS NOT NULL
    AND to_regclass(format('%I.settings', sqlc.arg(schema)::text)) IS NULL
    AS legacy;

-- name: TableExists :one
-- Whether the (schema-qualified) table exists: a goose version table is
-- read only where it exists, so that status and checks write nothing.
SELECT (to_regclass(sqlc.arg(name)::text) IS NOT NULL)::boolean AS exists;

-- name: SchemaExists :one
-- Whether the schema exists (sluice's, before `migrate up` created it).
SELECT (to_regnamespace(sqlc.arg(schema)::text) IS NOT NULL)::boolean AS exists;

-- name: RiverSchemaVersion :one
-- The newest version of River's main migration line applied (0: none).
SELECT COALESCE(max(version), 0)::bigint AS version FROM river_migration WHERE line = 'main';
