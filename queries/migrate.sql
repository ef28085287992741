-- name: LegacyLayout :one
-- Whether the database holds sluice's layout from before it had a schema of
-- its own: sluice's tables and goose_db_version in legacy_schema (where the
-- connection's search_path put them, River's schema), and no version table
-- in schema yet. `migrate up` then moves them (migrations/bootstrap/legacy.sql).
SELECT
    to_regclass(format('%I.goose_db_version', sqlc.arg(schema)::text)) IS NULL
    AND to_regclass(format('%I.sluice_workers', sqlc.arg(legacy_schema)::text)) IS NOT NULL
    AND to_regclass(format('%I.goose_db_version', sqlc.arg(legacy_schema)::text)) IS NOT NULL
    AS legacy;

-- name: SchemaExists :one
-- Whether the schema exists (sluice's, before `migrate up` created it).
SELECT (to_regnamespace(sqlc.arg(schema)::text) IS NOT NULL)::boolean AS exists;
