package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/migrations"
)

// TestUpOtherSchemas migrates into a sluice schema and a River schema of
// the operator's choosing: nothing lands in public.
func TestUpOtherSchemas(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.NewEmpty(t)
	plain := plainPool(t, url)
	publicBefore := relations(t, plain, "public")

	// River's schema does not exist yet: migrate up creates it.
	pool, err := pgkit.OpenSchemas(ctx, url, pgkit.Schemas{Sluice: "jobs_x", River: "river_x"}, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = migrations.Up(ctx, pool, stock)
	require.NoError(t, err)
	require.NoError(t, migrations.Check(ctx, pool, stock))

	// The same objects as a fresh install's, in the other schemas.
	fresh := testdb.NewPool(t)
	require.Equal(t, relations(t, fresh, "sluice"), relations(t, pool, "jobs_x"))
	require.Equal(t, functions(t, fresh, "sluice"), functions(t, pool, "jobs_x"))
	require.Equal(t, relations(t, fresh, "public"), relations(t, pool, "river_x"))
	require.Equal(t, functions(t, fresh, "public"), functions(t, pool, "river_x"))
	require.Equal(t, publicBefore, relations(t, pool, "public"))
	require.Empty(t, functions(t, pool, "public"))
	require.Empty(t, types(t, pool, "public"))
	require.Empty(t, queryStrings(t, pool, "SELECT nspname::text FROM pg_namespace WHERE nspname = 'sluice'"))
	for _, p := range queryStrings(t, pool, `
		SELECT COALESCE((SELECT c FROM unnest(proconfig) AS c WHERE c LIKE 'search_path=%'), '')
		FROM pg_proc WHERE pronamespace = 'jobs_x'::regnamespace`) {
		require.Equal(t, `search_path="jobs_x", "river_x"`, p)
	}

	// The triggers on river_x.river_job find jobs_x's tables from any session.
	parked := jobtest.InsertParked(t, pool, "demo.sleep", `{"ms": 1}`)
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "UPDATE river_x.river_job SET state = 'available' WHERE id = $1", parked)
	require.NoError(t, err)
	require.Zero(t, countRows(t, pool, "SELECT count(*) FROM jobs_x.concurrency_parked_jobs"))

	steps, err := migrations.Up(ctx, pool, stock)
	require.NoError(t, err)
	require.Empty(t, steps)
}

func TestInvalidSchemaNames(t *testing.T) {
	t.Parallel()

	for _, name := range []string{"Bad-Name", "pg_x", "pg_catalog", "1abc", "jobs x", `a"b`, "", "averyveryveryveryveryveryveryveryveryveryveryveryveryverylongname"} {
		require.Error(t, pgkit.ValidateSchema(name), "%q", name)
	}
	for _, name := range []string{"sluice", "jobs_x", "_private", "s1"} {
		require.NoError(t, pgkit.ValidateSchema(name), "%q", name)
	}
	for _, name := range []string{"bad-name", "1abc", "a b", ""} {
		require.Error(t, pgkit.ValidateRiverSchema(name), "%q", name)
	}

	ctx := context.Background()
	url := testdb.NewEmpty(t)
	for _, s := range []pgkit.Schemas{{Sluice: "Bad-Name"}, {Sluice: "pg_x"}, {Sluice: "jobs_x", River: "river-x"}} {
		pool, err := pgkit.OpenSchemas(ctx, url, s, 10*time.Second)
		require.Error(t, err, "%+v", s)
		require.Nil(t, pool)
	}
	require.Empty(t, queryStrings(t, plainPool(t, url), `
		SELECT nspname::text FROM pg_namespace WHERE nspname NOT LIKE 'pg\_%' AND nspname NOT IN ('public', 'information_schema')`))
}

// TestRiverSchemaNeverSluices: with no River schema given, River's is
// where its tables are for the connection's own search_path, never
// sluice's schema, even when that search_path names sluice's schema first
// (as SET search_path TO sluice, public does for old queries) or a role is
// named like it; and sluice's schema may not be River's.
func TestRiverSchemaNeverSluices(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	pool, err := pgkit.Open(ctx, testdb.WithParam(url, "search_path", "sluice,public"), 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.Equal(t, pgkit.Schemas{Sluice: "sluice", River: "public"}, pgkit.SchemasOf(pool))
	steps, err := migrations.Up(ctx, pool, stock)
	require.NoError(t, err)
	require.Empty(t, steps, "River is found where it is: nothing installed again")
	require.Zero(t, jobtest.Count(t, pool, `SELECT count(*) FROM pg_tables WHERE schemaname = 'sluice' AND tablename LIKE 'river%'`))

	_, err = pgkit.OpenSchemas(ctx, url, pgkit.Schemas{Sluice: "public"}, 10*time.Second)
	require.ErrorContains(t, err, `sluice's schema and River's are both "public"`)
	_, err = pgkit.OpenSchemas(ctx, url, pgkit.Schemas{Sluice: "jobs", River: "jobs"}, 10*time.Second)
	require.ErrorContains(t, err, "need a schema of their own")
}
