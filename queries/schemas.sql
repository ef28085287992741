-- name: LocateRiverSchema :one
-- Where River's tables are for a connection with the application's own
-- search_path, as River without a Schema option would find them: the first
-- schema of the search_path that holds river_migration; when none does yet
-- (River not migrated), the first existing schema of the search_path
-- (River's migrations would create its tables there). sluice's own schema
-- is never River's: it is skipped even when the search_path names it (a
-- role named like it, or search_path = sluice, public for old queries).
SELECT COALESCE(
    (SELECT s.name::text
     FROM unnest(current_schemas(false)) WITH ORDINALITY AS s(name, ord)
     WHERE s.name <> sqlc.arg(sluice_schema)::text
       AND to_regclass(format('%I.river_migration', s.name)) IS NOT NULL
     ORDER BY s.ord LIMIT 1),
    (SELECT s.name::text
     FROM unnest(current_schemas(false)) WITH ORDINALITY AS s(name, ord)
     WHERE s.name <> sqlc.arg(sluice_schema)::text
     ORDER BY s.ord LIMIT 1),
    'public')::text AS schema;
