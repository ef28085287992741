package migrations_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/migrations"
)

// TestEveryMigrationDownAndUp walks every migration down one at a time, with
// data in the tables (a limit and a parked job, a schedule, a maintenance
// run, a CI build, an export, a tracked cancellation), then up again. No
// step fails, and the parked job is never lost: whatever form its parking
// takes on the way down (in place; then a record of its copy; then, with the
// limits' tables gone, a new available River job), it is still work to do.
func TestEveryMigrationDownAndUp(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	_, pool := openEmpty(t)
	_, err := migrations.Up(ctx, pool, stock)
	require.NoError(t, err)

	jobtest.SetLimit(t, pool, "demo.sleep", 1)
	jobtest.InsertParked(t, pool, "demo.sleep", `{"ms": 7}`)
	for _, sql := range []string{
		`INSERT INTO schedules (name, cron, kind) VALUES ('walk', '@hourly', 'demo.sleep')`,
		`INSERT INTO maintenance_runs (kind, status, finished_at) VALUES ('walk', 'succeeded', now())`,
		`INSERT INTO ci_builds (project_id, status) VALUES (1, 'running')`,
		`INSERT INTO project_export_jobs (project_id, status) VALUES (1, 'queued')`,
		`INSERT INTO task_cancellation_counters (kind, total_count_post_cancel) VALUES ('walk', 2)`,
	} {
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	waiting := func() int {
		t.Helper()
		// The job as River will work it (pending: parked in place), or as
		// the old parking kept it (a completed row and a record of it).
		n := jobtest.Count(t, pool, `SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND args->>'ms' = '7' AND finalized_at IS NULL`)
		if exists(t, pool, "sluice.concurrency_parked_jobs") && !hasColumn(t, pool, "concurrency_parked_jobs", "job_id") {
			n += jobtest.Count(t, pool, `SELECT count(*) FROM concurrency_parked_jobs WHERE args->>'ms' = '7'`)
		}
		return n
	}
	require.Equal(t, 1, waiting())

	// Down, one migration at a time: what builds on sluice's core first.
	for _, component := range []string{"taskcancel", "exports", "cibuilds", migrations.ComponentSluice} {
		for {
			steps, err := migrations.Down(ctx, pool, stock, migrations.DownOpts{Component: component})
			require.NoError(t, err, component)
			if len(steps) == 0 {
				break
			}
			require.Equal(t, 1, waiting(), "after %s %s down", steps[0].Component, steps[0].Name)
		}
	}
	require.Zero(t, jobtest.Count(t, pool, `SELECT count(*) FROM pg_class WHERE relnamespace = 'sluice'::regnamespace AND relname NOT LIKE 'goose%'`),
		"nothing of sluice's left but its version tables")

	_, err = migrations.Up(ctx, pool, stock)
	require.NoError(t, err)
	require.NoError(t, migrations.Check(ctx, pool, stock))
	require.Equal(t, 1, waiting(), "the job is still to be worked")
}

// hasColumn reports whether table (on the search_path) has column.
func hasColumn(t *testing.T, pool *pgxpool.Pool, table, column string) bool {
	t.Helper()
	return jobtest.Count(t, pool, `SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = $2 AND NOT attisdropped`, table, column) == 1
}
