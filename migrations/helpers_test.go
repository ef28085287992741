package migrations_test

import (
	"context"
	"sort"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// plainPool opens a pool on url with the connection string's own
// search_path (the server's default), not sluice's: a session of the
// application, of River's CLI or of psql.
func plainPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// queryStrings runs sql, which selects one text column, and returns its values
// sorted.
func queryStrings(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), sql, args...)
	require.NoError(t, err)
	defer rows.Close()
	out := []string{}
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	sort.Strings(out)
	return out
}

// relations lists the relations of schema as "<relkind> <name>".
func relations(t *testing.T, pool *pgxpool.Pool, schema string) []string {
	t.Helper()
	return queryStrings(t, pool, `
		SELECT c.relkind::text || ' ' || c.relname FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1`, schema)
}

// functions lists the functions of schema with their arguments.
func functions(t *testing.T, pool *pgxpool.Pool, schema string) []string {
	t.Helper()
	return queryStrings(t, pool, `
		SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')' FROM pg_proc p
		JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1`, schema)
}

// types lists the types of schema besides those of its relations and the
// arrays of types.
func types(t *testing.T, pool *pgxpool.Pool, schema string) []string {
	t.Helper()
	return queryStrings(t, pool, `
		SELECT ty.typname FROM pg_type ty
		JOIN pg_namespace n ON n.oid = ty.typnamespace
		WHERE n.nspname = $1 AND ty.typtype <> 'c' AND ty.typelem = 0`, schema)
}

// catalog describes every object of schema, and every trigger that calls
// one of its functions, in enough detail to tell two installs apart: the
// relations and their comments, columns, indexes and constraints, the
// views' definitions, the functions with their bodies and settings
// (search_path), and the triggers.
func catalog(t *testing.T, pool *pgxpool.Pool, schema string) []string {
	t.Helper()
	var out []string
	for _, sql := range []string{
		`SELECT 'relation ' || c.relkind::text || ' ' || c.relname || ' ' || COALESCE(obj_description(c.oid, 'pg_class'), '')
		 FROM pg_class c WHERE c.relnamespace = to_regnamespace($1)`,
		`SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
		        || ' notnull=' || a.attnotnull || ' identity=' || a.attidentity::text
		        || ' default=' || COALESCE(pg_get_expr(d.adbin, d.adrelid), '')
		 FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
		 LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		 WHERE c.relnamespace = to_regnamespace($1) AND c.relkind IN ('r', 'v') AND a.attnum > 0 AND NOT a.attisdropped`,
		`SELECT 'index ' || pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		 WHERE c.relnamespace = to_regnamespace($1)`,
		`SELECT 'constraint ' || conrelid::regclass::text || ' ' || conname || ' ' || pg_get_constraintdef(oid)
		 FROM pg_constraint WHERE connamespace = to_regnamespace($1)`,
		`SELECT 'view ' || c.relname || ' ' || pg_get_viewdef(c.oid)
		 FROM pg_class c WHERE c.relnamespace = to_regnamespace($1) AND c.relkind = 'v'`,
		`SELECT 'function ' || p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ') '
		        || COALESCE(array_to_string(p.proconfig, ','), '') || ' ' || md5(p.prosrc)
		 FROM pg_proc p WHERE p.pronamespace = to_regnamespace($1)`,
		`SELECT 'trigger ' || pg_get_triggerdef(tg.oid) FROM pg_trigger tg
		 JOIN pg_class c ON c.oid = tg.tgrelid JOIN pg_proc p ON p.oid = tg.tgfoid
		 WHERE NOT tg.tgisinternal
		   AND (c.relnamespace = to_regnamespace($1) OR p.pronamespace = to_regnamespace($1))`,
	} {
		out = append(out, queryStrings(t, pool, sql, schema)...)
	}
	sort.Strings(out)
	return out
}

// rowSums fingerprints the rows of each table (schema-qualified), by table
// name without its schema, so that a table moved to another schema compares
// equal to itself.
func rowSums(t *testing.T, pool *pgxpool.Pool, schema string, tables ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, table := range tables {
		// The columns a table had in the old layout: later migrations add
		// columns, whose defaults are not the rows' content.
		query := "SELECT * FROM " + schema + "." + table
		if cols, ok := legacyColumns[table]; ok {
			query = "SELECT " + cols + " FROM " + schema + "." + table
		}
		out[table] = querySum(t, pool, query)
	}
	return out
}

// legacyColumns are the columns of the old layout's tables that later
// migrations extended.
var legacyColumns = map[string]string{
	"concurrency_limits":      "kind, max_concurrency, admitted, updated_at, has_parked",
	"concurrency_parked_jobs": "job_id, kind, parked_at, reason, worker_id",
	"concurrency_executions":  "job_id, kind, worker_id, reserved, admitted_at",
}

// querySum is the count and a checksum of the rows query returns, as
// rowSums computes them for a table.
func querySum(t *testing.T, pool *pgxpool.Pool, query string) string {
	t.Helper()
	var sum string
	require.NoError(t, pool.QueryRow(context.Background(), `
		SELECT count(*) || ':' || COALESCE(md5(string_agg(t::text, '|' ORDER BY t::text)), '')
		FROM (`+query+`) t`).Scan(&sum), query)
	return sum
}

// versions returns the applied versions a goose version table records, in
// the order they were applied.
func versions(t *testing.T, pool *pgxpool.Pool, table string) []int64 {
	t.Helper()
	var out []int64
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT COALESCE(array_agg(version_id ORDER BY id), '{}') FROM "+table+" WHERE is_applied").Scan(&out), table)
	return out
}

// exists reports whether the relation name (schema-qualified) exists.
func exists(t *testing.T, pool *pgxpool.Pool, name string) bool {
	t.Helper()
	var ok bool
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL", name).Scan(&ok))
	return ok
}
