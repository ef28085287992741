package sluice_test

import (
	"context"
	"testing"
	"testing/fstest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/modules/demo"
)

// TestMigrate: Migrate prepares an empty database for New, in the schemas
// the Config names, with the application's own migrations (in the
// connection's own search_path) and a schedule they declare for its kind;
// a second Migrate applies nothing, and a bad schema name is refused.
func TestMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	cfg := sluice.Config{
		DatabaseURL: testdb.NewEmpty(t),
		Logger:      jobtest.Logger(t),
		Workers:     greetWorkers(),
		Modules:     []sluice.Module{demo.Module()},
		Schema:      "jobs",
		Migrations: fstest.MapFS{
			"00001_greetings.sql": {Data: []byte(`-- +goose Up
CREATE TABLE greetings (id bigserial PRIMARY KEY, name text NOT NULL);
INSERT INTO jobs.schedules (name, cron, kind, args) VALUES ('greet.often', '@every 1h', 'greet', '{"name": "cron"}')
ON CONFLICT (name) DO UPDATE SET cron = EXCLUDED.cron, kind = EXCLUDED.kind, args = EXCLUDED.args;
-- +goose Down
DELETE FROM jobs.schedules WHERE name = 'greet.often';
DROP TABLE greetings;
`)},
		},
	}

	_, err := sluice.New(ctx, cfg)
	require.ErrorContains(t, err, "not up to date", "New needs a migrated database")

	steps, err := sluice.Migrate(ctx, cfg)
	require.NoError(t, err)
	components := map[string]int{}
	for _, s := range steps {
		components[s.Component]++
	}
	require.Positive(t, components["river"])
	require.Positive(t, components["sluice"])
	require.Equal(t, 1, components["app"])
	require.Zero(t, components["cibuilds"], "a module that is off brings no tables")

	steps, err = sluice.Migrate(ctx, cfg)
	require.NoError(t, err)
	require.Empty(t, steps, "a second Migrate applies nothing")

	pool, err := pgkit.OpenSchemas(ctx, cfg.DatabaseURL, pgkit.Schemas{Sluice: "jobs"}, 10*time.Second)
	require.NoError(t, err)
	defer pool.Close()
	where := func(table string) string {
		var schema string
		require.NoError(t, pool.QueryRow(ctx, `SELECT schemaname FROM pg_tables WHERE tablename = $1`, table).Scan(&schema))
		return schema
	}
	require.Equal(t, "public", where("greetings"), "the application's migrations run with the connection's own search_path")
	require.Equal(t, "jobs", where("schedules"))
	require.Equal(t, "jobs", where("goose_db_version_app"))
	require.Equal(t, "public", where("river_job"))
	require.Zero(t, jobtest.Count(t, pool, `SELECT count(*) FROM pg_tables WHERE tablename = 'ci_builds'`))
	require.Equal(t, 1, jobtest.Count(t, pool, `SELECT count(*) FROM schedules WHERE name = 'greet.often' AND kind = 'greet'`))

	w, err := sluice.New(ctx, cfg)
	require.NoError(t, err)
	require.NoError(t, w.Stop(ctx))

	bad := cfg
	bad.Schema = "Bad-Name"
	_, err = sluice.Migrate(ctx, bad)
	require.ErrorContains(t, err, `invalid schema name "Bad-Name"`)
}
