package migrations_test

import (
	"context"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/migrations"
	"github.com/sluice-dev/sluice/modules"
)

// TestUpBesideAppTablesOfTheSameName migrates a database whose application
// already has tables named as sluice's (public.settings, public.schedules):
// sluice's land in its own schema, the application's stay untouched.
func TestUpBesideAppTablesOfTheSameName(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url, pool := openEmpty(t)
	plain := plainPool(t, url)
	_, err := plain.Exec(ctx, `
		CREATE TABLE settings (name text PRIMARY KEY, value text NOT NULL);
		INSERT INTO settings VALUES ('theme', 'dark'), ('lang', 'fr');
		CREATE TABLE schedules (id serial PRIMARY KEY, room text NOT NULL, at timestamptz NOT NULL);
		INSERT INTO schedules (room, at) VALUES ('A', '2026-01-01T10:00:00Z'), ('B', '2026-01-02T11:00:00Z');`)
	require.NoError(t, err)
	before := testdb.Checksum(t, plain, "public.settings", "public.schedules")

	_, err = migrations.Up(ctx, pool, stock)
	require.NoError(t, err)
	require.NoError(t, migrations.Check(ctx, pool, stock))

	require.Equal(t, before, testdb.Checksum(t, plain, "public.settings", "public.schedules"))
	require.Equal(t, []string{"name", "value"}, queryStrings(t, plain,
		"SELECT column_name::text FROM information_schema.columns WHERE table_schema = 'public' AND table_name = 'settings'"))
	require.True(t, exists(t, pool, "sluice.settings"))
	require.True(t, exists(t, pool, "sluice.schedules"))
	// sluice's own rows went to its tables, which its pool finds first.
	require.Positive(t, countRows(t, pool, "SELECT count(*) FROM sluice.settings WHERE key LIKE 'scheduler.%'"))
	require.Positive(t, countRows(t, pool, "SELECT count(*) FROM schedules WHERE name = 'task_cancellation.monitor'"))
	// The application's session still finds its own.
	require.Equal(t, 2, countRows(t, plain, "SELECT count(*) FROM settings WHERE name IN ('theme', 'lang')"))
}

// appFS is an application's goose migrations, versioned by timestamp as
// goose's CLI names them.
func appFS() fstest.MapFS {
	return fstest.MapFS{
		"20240101000000_widgets.sql": {Data: []byte(`-- +goose Up
CREATE TABLE widgets (id bigserial PRIMARY KEY, name text NOT NULL);
INSERT INTO widgets (name) VALUES ('first');
-- +goose Down
DROP TABLE widgets;
`)},
		"20240201000000_gadgets.sql": {Data: []byte(`-- +goose Up
CREATE TABLE gadgets (id bigserial PRIMARY KEY, widget_id bigint REFERENCES widgets (id));
-- +goose Down
DROP TABLE gadgets;
`)},
	}
}

func withApp(app fs.FS) migrations.Options {
	return migrations.Options{Modules: modules.All(), App: app}
}

// TestAppMigrations applies the application's migrations after sluice's,
// in a version table of their own, with the connection's own search_path.
func TestAppMigrations(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url, pool := openEmpty(t)
	opts := withApp(appFS())

	steps, err := migrations.Up(ctx, pool, opts)
	require.NoError(t, err)
	var app []string
	for i, s := range steps {
		if s.Component == migrations.ComponentApp {
			app = append(app, s.Name)
			continue
		}
		require.Empty(t, app, "step %d (%s %s) after the application's", i, s.Component, s.Name)
	}
	require.Equal(t, []string{"20240101000000_widgets.sql", "20240201000000_gadgets.sql"}, app)
	require.Equal(t, []int64{0, 20240101000000, 20240201000000}, versions(t, pool, "sluice.goose_db_version_app"))
	require.NotContains(t, versions(t, pool, "sluice.goose_db_version"), int64(20240101000000))

	// The application's tables land in its own schema (public), not sluice's.
	require.True(t, exists(t, pool, "public.widgets"))
	require.True(t, exists(t, pool, "public.gadgets"))
	require.False(t, exists(t, pool, "sluice.widgets"))
	require.False(t, exists(t, pool, "sluice.gadgets"))
	require.Equal(t, 1, countRows(t, plainPool(t, url), "SELECT count(*) FROM widgets"))

	require.NoError(t, migrations.Check(ctx, pool, opts))
	statuses, err := migrations.Status(ctx, pool, opts)
	require.NoError(t, err)
	var listed []string
	for _, s := range statuses {
		if s.Component == migrations.ComponentApp {
			require.True(t, s.Applied, s.Name)
			require.NotNil(t, s.AppliedAt)
			listed = append(listed, s.Name)
		}
	}
	require.Equal(t, []string{"20240101000000_widgets.sql", "20240201000000_gadgets.sql"}, listed)

	steps, err = migrations.Up(ctx, pool, opts)
	require.NoError(t, err)
	require.Empty(t, steps)
}

// TestAppMigrationFails: a failing application migration is rolled back
// whole, the error names its file, and the ones before it stay applied.
func TestAppMigrationFails(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	_, pool := openEmpty(t)
	app := fstest.MapFS{
		"00001_widgets.sql": appFS()["20240101000000_widgets.sql"],
		"00002_bad.sql": {Data: []byte(`-- +goose Up
CREATE TABLE half_done (id int);
INSERT INTO no_such_table VALUES (1);
-- +goose Down
DROP TABLE half_done;
`)},
	}
	opts := withApp(app)

	_, err := migrations.Up(ctx, pool, opts)
	require.Error(t, err)
	require.Contains(t, err.Error(), "00002_bad.sql")
	require.Contains(t, err.Error(), "app")
	require.Contains(t, err.Error(), "no_such_table")

	require.False(t, exists(t, pool, "public.half_done"), "nothing of the failed file is applied")
	require.False(t, exists(t, pool, "sluice.half_done"))
	require.True(t, exists(t, pool, "public.widgets"))
	require.Equal(t, []int64{0, 1}, versions(t, pool, "sluice.goose_db_version_app"))
	// sluice's own migrations, applied before, stay too.
	require.NoError(t, migrations.Check(ctx, pool, stock))

	err = migrations.Check(ctx, pool, opts)
	require.ErrorIs(t, err, migrations.ErrNotMigrated)
	require.Contains(t, err.Error(), "00002_bad.sql")
}

// TestAppMigrationsThenLaterSluiceMigration: a sluice release that adds a
// core migration after the application applied its own (of higher
// versions) applies it: the sets never interleave, so goose sees no
// out-of-order migration, and the application's versions stay as they are.
func TestAppMigrationsThenLaterSluiceMigration(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	_, pool := openEmpty(t)
	opts := withApp(appFS())
	_, err := migrations.Up(ctx, pool, opts)
	require.NoError(t, err)
	appVersions := testdb.Checksum(t, pool, "sluice.goose_db_version_app")

	// The next release: sluice's core migrations plus one.
	core := fstest.MapFS{}
	entries, err := fs.ReadDir(migrations.FS, ".")
	require.NoError(t, err)
	last := 0
	for _, e := range entries {
		data, err := fs.ReadFile(migrations.FS, e.Name())
		require.NoError(t, err)
		core[e.Name()] = &fstest.MapFile{Data: data}
		if v, err := strconv.Atoi(strings.SplitN(e.Name(), "_", 2)[0]); err == nil && v > last {
			last = v
		}
	}
	laterName := fmt.Sprintf("%05d_later.sql", last+1)
	core[laterName] = &fstest.MapFile{Data: []byte(`-- +goose Up
CREATE TABLE later (id int);
-- +goose Down
DROP TABLE later;
`)}
	later := migrations.WithCore(opts, core)
	require.ErrorIs(t, migrations.Check(ctx, pool, later), migrations.ErrNotMigrated)

	steps, err := migrations.Up(ctx, pool, later)
	require.NoError(t, err)
	require.Len(t, steps, 1)
	require.Equal(t, migrations.ComponentSluice, steps[0].Component)
	require.Equal(t, laterName, steps[0].Name)
	require.True(t, exists(t, pool, "sluice.later"), "a core migration runs in sluice's schema")
	require.Equal(t, appVersions, testdb.Checksum(t, pool, "sluice.goose_db_version_app"))
	require.NoError(t, migrations.Check(ctx, pool, later))
}

// TestAppMigrationsOwnSearchPath: with a search_path in the connection
// string, the application's migrations run with it (and River's tables go
// where it puts them), sluice's objects still in sluice's schema.
func TestAppMigrationsOwnSearchPath(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.NewEmpty(t)
	_, err := plainPool(t, url).Exec(ctx, "CREATE SCHEMA shop")
	require.NoError(t, err)
	pool, err := pgkit.Open(ctx, testdb.WithParam(url, "search_path", "shop"), 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.Equal(t, pgkit.Schemas{Sluice: "sluice", River: "shop"}, pgkit.SchemasOf(pool))

	opts := withApp(appFS())
	_, err = migrations.Up(ctx, pool, opts)
	require.NoError(t, err)
	require.NoError(t, migrations.Check(ctx, pool, opts))
	require.True(t, exists(t, pool, "shop.widgets"))
	require.True(t, exists(t, pool, "shop.river_job"))
	require.True(t, exists(t, pool, "sluice.settings"))
	require.Empty(t, relations(t, pool, "public"))
}
