package migrations_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/migrations"
)

// upWithApp migrates an empty database with the stock modules and the
// application's migrations.
func upWithApp(t *testing.T) (*pgxpool.Pool, migrations.Options) {
	t.Helper()
	_, pool := openEmpty(t)
	opts := withApp(appFS())
	_, err := migrations.Up(context.Background(), pool, opts)
	require.NoError(t, err)
	return pool, opts
}

// componentsOf returns the components of steps in order, each once per run
// of consecutive steps.
func componentsOf(steps []migrations.Step) []string {
	var out []string
	for _, s := range steps {
		if len(out) == 0 || out[len(out)-1] != s.Component {
			out = append(out, s.Component)
		}
	}
	return out
}

func TestDownAppOnly(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool, opts := upWithApp(t)
	sluiceVersions := testdb.Checksum(t, pool, "sluice.goose_db_version", "sluice.goose_db_version_cibuilds",
		"sluice.goose_db_version_exports", "sluice.goose_db_version_taskcancel")
	sluiceCatalog := catalog(t, pool, "sluice")

	zero := int64(0)
	steps, err := migrations.Down(ctx, pool, opts, migrations.DownOpts{Component: migrations.ComponentApp, To: &zero})
	require.NoError(t, err)
	require.Len(t, steps, 2)
	require.Equal(t, []string{migrations.ComponentApp}, componentsOf(steps))
	require.Equal(t, "20240201000000_gadgets.sql", steps[0].Name, "last applied first")

	require.False(t, exists(t, pool, "public.widgets"))
	require.False(t, exists(t, pool, "public.gadgets"))
	require.Equal(t, []int64{0}, versions(t, pool, "sluice.goose_db_version_app"))
	require.Equal(t, sluiceVersions, testdb.Checksum(t, pool, "sluice.goose_db_version", "sluice.goose_db_version_cibuilds",
		"sluice.goose_db_version_exports", "sluice.goose_db_version_taskcancel"))
	require.Equal(t, sluiceCatalog, catalog(t, pool, "sluice"))
	require.NoError(t, migrations.Check(ctx, pool, stock))
	require.ErrorIs(t, migrations.Check(ctx, pool, opts), migrations.ErrNotMigrated)

	// The application's migrations apply again.
	steps, err = migrations.Up(ctx, pool, opts)
	require.NoError(t, err)
	require.Equal(t, []string{migrations.ComponentApp}, componentsOf(steps))
	require.NoError(t, migrations.Check(ctx, pool, opts))
}

func TestDownToZero(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool, opts := upWithApp(t)

	zero := int64(0)
	steps, err := migrations.Down(ctx, pool, opts, migrations.DownOpts{To: &zero})
	require.NoError(t, err)
	// What builds on the core goes first, last applied first.
	require.Equal(t, []string{"app", "taskcancel", "exports", "cibuilds", "sluice"}, componentsOf(steps))
	require.Equal(t, "00001_foundation.sql", steps[len(steps)-1].Name)

	// Only the version tables are left of sluice's; River's tables stay,
	// without sluice's triggers.
	for _, r := range relations(t, pool, "sluice") {
		require.Contains(t, r, "goose_db_version", r)
	}
	require.Empty(t, functions(t, pool, "sluice"))
	require.True(t, exists(t, pool, "public.river_job"))
	require.False(t, exists(t, pool, "public.widgets"))
	require.Empty(t, queryStrings(t, pool,
		"SELECT tgname::text FROM pg_trigger WHERE tgrelid = 'public.river_job'::regclass AND NOT tgisinternal"))
	for _, table := range []string{"goose_db_version", "goose_db_version_cibuilds", "goose_db_version_exports",
		"goose_db_version_taskcancel", "goose_db_version_app"} {
		require.Equal(t, []int64{0}, versions(t, pool, "sluice."+table), table)
	}

	// Everything applies again.
	_, err = migrations.Up(ctx, pool, opts)
	require.NoError(t, err)
	require.NoError(t, migrations.Check(ctx, pool, opts))
}

func TestDownRemovesSchemas(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool, opts := upWithApp(t)

	zero := int64(0)
	steps, err := migrations.Down(ctx, pool, opts, migrations.DownOpts{To: &zero, River: true})
	require.NoError(t, err)
	require.Equal(t, []string{"app", "taskcancel", "exports", "cibuilds", "sluice", "river"}, componentsOf(steps))

	require.Empty(t, queryStrings(t, pool, "SELECT nspname::text FROM pg_namespace WHERE nspname = 'sluice'"))
	require.Empty(t, relations(t, pool, "public"))
	require.Empty(t, functions(t, pool, "public"))

	require.ErrorIs(t, migrations.Check(ctx, pool, opts), migrations.ErrNotMigrated)
	statuses, err := migrations.Status(ctx, pool, opts)
	require.NoError(t, err)
	for _, s := range statuses {
		require.False(t, s.Applied, "%s %s", s.Component, s.Name)
	}
}

// TestDownKeepsSchemaWithForeignObjects: a schema sluice that holds an
// object of someone else's stays, with that object; sluice's version tables
// go.
func TestDownKeepsSchemaWithForeignObjects(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool, opts := upWithApp(t)
	_, err := pool.Exec(ctx, `
		CREATE TABLE sluice.operator_notes (note text);
		INSERT INTO sluice.operator_notes VALUES ('keep me')`)
	require.NoError(t, err)

	zero := int64(0)
	_, err = migrations.Down(ctx, pool, opts, migrations.DownOpts{To: &zero, River: true})
	require.NoError(t, err)

	require.Equal(t, []string{"r operator_notes"}, relations(t, pool, "sluice"))
	require.Equal(t, 1, countRows(t, pool, "SELECT count(*) FROM sluice.operator_notes WHERE note = 'keep me'"))
	require.False(t, exists(t, pool, "public.river_job"))

	// Up again beside it.
	_, err = migrations.Up(ctx, pool, opts)
	require.NoError(t, err)
	require.NoError(t, migrations.Check(ctx, pool, opts))
	require.True(t, exists(t, pool, "sluice.operator_notes"))
}
