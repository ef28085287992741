package migrations_test

// testdata/legacy holds sluice's migrations from before it had a schema of
// its own, byte for byte as at commit 37cecbc (`git show
// 37cecbc:migrations/0000N_*.sql`, N = 1..8): the layout that
// migrations/bootstrap/legacy.sql upgrades. Do not edit them.

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/migrations"
)

// legacyTables are the tables of sluice's old layout, all in River's schema.
var legacyTables = []string{
	"settings", "maintenance_runs", "schedules", "sluice_workers",
	"concurrency_limits", "concurrency_parked_jobs", "concurrency_executions", "concurrency_leases",
	"ci_builds", "project_export_jobs", "project_relation_exports",
	"task_cancellation_tracker", "task_cancellation_counters",
}

// installLegacy migrates the empty database at url as sluice did before it
// had a schema of its own: River's migrations, then the old goose files up
// to version, with goose's default version table, all where the
// connection's default search_path puts them (public). It returns a pool
// with that search_path.
func installLegacy(t *testing.T, url string, version int64) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	plain := plainPool(t, url)
	migrator, err := rivermigrate.New(riverpgxv5.New(plain), nil)
	require.NoError(t, err)
	_, err = migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	require.NoError(t, err)

	sqlDB := stdlib.OpenDBFromPool(plain)
	defer sqlDB.Close()
	provider, err := goose.NewProvider(goose.DialectPostgres, sqlDB, os.DirFS("testdata/legacy"),
		goose.WithDisableGlobalRegistry(true))
	require.NoError(t, err)
	results, err := provider.UpTo(ctx, version)
	require.NoError(t, err)
	require.Len(t, results, int(version))
	require.True(t, exists(t, plain, "public.goose_db_version"))
	require.True(t, exists(t, plain, "public.sluice_queue_overview"))
	return plain
}

// TestUpgradeLegacyLayout upgrades an install of the old layout, with rows
// in every table, and finds it as a fresh install would be, every row kept,
// its triggers working from any session.
func TestUpgradeLegacyLayout(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.NewEmpty(t)
	plain := installLegacy(t, url, 8)

	// Rows as the old version wrote them.
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := plain.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	exec(`INSERT INTO schedules (name, cron, timezone, kind, args, next_run_at, run_count)
	      VALUES ('legacy.nightly', '0 3 * * *', 'Europe/Paris', 'demo.sleep', '{"ms": 5}', '2030-01-01T02:00:00Z', 12)`)
	exec(`INSERT INTO concurrency_limits (kind, max_concurrency) VALUES ('legacy.kind', 3)`)
	parked := jobtest.InsertParked(t, plain, "legacy.kind", `{"n": 1}`)
	exec(`UPDATE concurrency_limits SET has_parked = true WHERE kind = 'legacy.kind'`)
	exec(`INSERT INTO maintenance_runs (kind, status, finished_at, affected, details)
	      VALUES ('ci.drop_stuck_builds', 'succeeded', now(), 7, '{"batches": 1}')`)
	exec(`UPDATE settings SET value = '"9s"', updated_at = now() WHERE key = 'scheduler.retry_backoff_base'`)
	exec(`INSERT INTO ci_builds (project_id, pipeline_id, name, stage, status) VALUES (42, 7, 'rspec', 'test', 'running')`)
	var exportID int64
	require.NoError(t, plain.QueryRow(ctx, `
		INSERT INTO project_export_jobs (project_id, job_id, status, parallel) VALUES (42, 424242, 'started', true)
		RETURNING id`).Scan(&exportID))
	exec(`INSERT INTO project_relation_exports (project_export_job_id, relation) VALUES ($1, 'issues')`, exportID)
	exec(`INSERT INTO task_cancellation_counters (kind, total_count_post_cancel) VALUES ('legacy.kind', 5)`)
	exec(`INSERT INTO sluice_workers (id, host, pid, heartbeat_interval, incarnation)
	      VALUES ('w-legacy', 'host-a', 123, '5s', 'inc-1')`)
	// A running job whose cancellation was requested: the old triggers track it.
	cancelled := jobtest.InsertRunning(t, plain, "legacy.kind", `{}`, 1, 5, []string{"w-legacy"}, `{}`, "running")
	exec(`UPDATE river_job SET metadata = metadata || '{"cancel_attempted_at": "2026-01-01T00:00:00Z"}' WHERE id = $1`, cancelled)
	require.Equal(t, 1, jobtest.Count(t, plain, "SELECT count(*) FROM task_cancellation_tracker WHERE job_id = $1", cancelled))

	before := rowSums(t, plain, "public", append(legacyTables, "river_job", "river_queue")...)
	legacyVersions := versions(t, plain, "public.goose_db_version")
	require.Equal(t, []int64{0, 1, 2, 3, 4, 5, 6, 7, 8}, legacyVersions)

	// The new binary's `migrate up`, with the stock modules.
	pool, err := pgkit.Open(ctx, url, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	steps, err := migrations.Up(ctx, pool, stock)
	require.NoError(t, err)
	var applied []string
	for _, s := range steps {
		applied = append(applied, s.Component+" "+s.Name)
	}
	require.Equal(t, []string{"sluice 00009_schema.sql", "sluice 00010_keyed_limits.sql", "sluice 00011_worker_queues.sql", "sluice 00012_limiter_line.sql",
		"sluice 00013_declared_schedules.sql", "sluice 00014_parking_metadata.sql", "sluice 00015_view_names.sql",
		"sluice 00016_limit_changes_notify.sql", "sluice 00017_limiter_ledger.sql", "sluice 00018_enqueue_policies.sql", "sluice 00019_key_line_arrival.sql",
		"sluice 00020_concurrency_fetches.sql", "sluice 00021_step_back_quiet.sql", "sluice 00022_grant_while_parking.sql", "sluice 00023_reservation_gone_notify.sql", "sluice 00024_enqueue_policy_fewer_reads.sql",
		"sluice 00025_granted_due_since_insert.sql", "sluice 00026_stale_slot_grace.sql", "sluice 00027_enqueue_policy_index_plans.sql", "sluice 00028_key_turn_order.sql",
		"taskcancel 00002_pin_search_path.sql", "taskcancel 00003_view_name.sql"}, applied,
		"the moved versions count as applied; only what came after the old layout runs")

	// Every row kept, now in schema sluice.
	after := rowSums(t, pool, "sluice", legacyTables...)
	for k, v := range rowSums(t, pool, "public", "river_job", "river_queue") {
		after[k] = v
	}
	// What came after the old layout adds: 00011 a setting, and a column
	// of sluice_workers (NULL on the rows kept); 00013 the columns of
	// schedules' insert options (NULL) and their source (sql).
	after["schedules"] = querySum(t, pool, `SELECT id, name, cron, timezone, kind, args, queue, enabled, status, misfire,
		next_run_at, last_run_at, last_job_id, run_count, failure_count, max_retries, last_error, created_at, updated_at,
		retry_due_at, last_dispatched_at FROM sluice.schedules
		WHERE priority IS NULL AND max_attempts IS NULL AND tags IS NULL AND source = 'sql'`)
	after["settings"] = querySum(t, pool, `SELECT * FROM sluice.settings WHERE key <> 'health.queue_paused_after'`)
	after["sluice_workers"] = querySum(t, pool, `SELECT id, host, pid, started_at, heartbeat_at, heartbeat_interval,
		dispatcher_tick_at, poll_interval, dead_after, incarnation, backend_name FROM sluice.sluice_workers WHERE queues IS NULL`)
	require.Equal(t, before, after)
	var cron, tz string
	require.NoError(t, pool.QueryRow(ctx, `SELECT cron, timezone FROM schedules WHERE name = 'legacy.nightly'`).Scan(&cron, &tz))
	require.Equal(t, "0 3 * * *", cron)
	require.Equal(t, "Europe/Paris", tz)
	backoff, err := db.New(pool).GetSetting(ctx, "scheduler.retry_backoff_base")
	require.NoError(t, err)
	require.JSONEq(t, `"9s"`, string(backoff))
	require.Equal(t, 1, jobtest.Count(t, pool, "SELECT count(*) FROM sluice.sluice_parked_jobs WHERE job_id = $1", parked))
	require.Equal(t, 1, jobtest.Count(t, pool, "SELECT count(*) FROM sluice.sluice_concurrency_overview WHERE kind = 'legacy.kind' AND parked = 1"))

	// public holds River's objects only, as in a fresh install, and the
	// old version table, kept with its rows: an old binary that runs
	// `migrate up` during a rolling deploy finds nothing to apply.
	fresh, err := pgkit.Open(ctx, testdb.New(t), 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(fresh.Close)
	require.True(t, exists(t, pool, "public.goose_db_version"))
	require.Equal(t, 9, jobtest.Count(t, pool, "SELECT count(*) FROM public.goose_db_version WHERE version_id BETWEEN 0 AND 8"))
	for _, table := range legacyTables {
		require.False(t, exists(t, pool, "public."+table), table)
	}
	require.Equal(t, withOldVersionTable(relations(t, fresh, "public")), relations(t, pool, "public"))
	require.Equal(t, functions(t, fresh, "public"), functions(t, pool, "public"))
	require.Equal(t, types(t, fresh, "public"), types(t, pool, "public"))
	require.NotContains(t, relations(t, pool, "public"), "v sluice_queue_overview")

	// Schema sluice as a fresh install has it.
	require.Equal(t, catalog(t, fresh, "sluice"), catalog(t, pool, "sluice"))

	// Migrated: every set applied, each version table with its versions.
	require.NoError(t, migrations.Check(ctx, pool, stock))
	statuses, err := migrations.Status(ctx, pool, stock)
	require.NoError(t, err)
	components := map[string]int{}
	for _, s := range statuses {
		require.True(t, s.Applied, "%s %s", s.Component, s.Name)
		components[s.Component]++
	}
	for _, c := range []string{"river", "sluice", "cibuilds", "exports", "taskcancel"} {
		require.Positive(t, components[c], "%s in %v", c, components)
	}
	require.Equal(t, []int64{0, 1, 2, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28}, versions(t, pool, "sluice.goose_db_version"))
	require.Equal(t, []int64{0, 1}, versions(t, pool, "sluice.goose_db_version_cibuilds"))
	require.Equal(t, []int64{0, 1}, versions(t, pool, "sluice.goose_db_version_exports"))
	require.Equal(t, []int64{0, 1, 2, 3}, versions(t, pool, "sluice.goose_db_version_taskcancel"))

	steps, err = migrations.Up(ctx, pool, stock)
	require.NoError(t, err)
	require.Empty(t, steps, "a second up applies nothing")

	// The triggers on river_job fire in every River client's session,
	// whatever its search_path: theirs is pinned to sluice's schema.
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var searchPath string
	require.NoError(t, conn.QueryRow(ctx, "SHOW search_path").Scan(&searchPath))
	require.NotContains(t, searchPath, "sluice")
	_, err = conn.Exec(ctx, "UPDATE river_job SET state = 'available' WHERE id = $1", parked)
	require.NoError(t, err)
	require.Zero(t, jobtest.Count(t, pool, "SELECT count(*) FROM sluice.concurrency_parked_jobs WHERE job_id = $1", parked),
		"sluice_unpark removed the parking record")
	_, err = conn.Exec(ctx, "UPDATE river_job SET state = 'cancelled', finalized_at = now() WHERE id = $1", cancelled)
	require.NoError(t, err)
	require.Zero(t, jobtest.Count(t, pool, "SELECT count(*) FROM sluice.task_cancellation_tracker WHERE job_id = $1", cancelled),
		"sluice_task_cancellation_untrack forgot the job")
	_, err = conn.Exec(ctx, "UPDATE sluice.schedules SET cron = '0 4 * * *' WHERE name = 'legacy.nightly'")
	require.NoError(t, err)
	require.Equal(t, 1, jobtest.Count(t, pool, "SELECT count(*) FROM sluice.schedules WHERE name = 'legacy.nightly' AND next_run_at IS NULL"),
		"sluice_schedules_before_update reset next_run_at")
	_, err = conn.Exec(ctx, "INSERT INTO sluice.concurrency_limits (kind, max_concurrency) VALUES ('other.kind', 1)")
	require.NoError(t, err, "concurrency_limits_init_counts finds its tables")
}

// TestUpgradeLegacyLayoutOlderVersions upgrades installs of the old layout
// that stopped at an earlier version: what they lack (tables, functions,
// module versions) is left to the migrations of the new layout, and the
// result is a fresh install's.
func TestUpgradeLegacyLayoutOlderVersions(t *testing.T) {
	t.Parallel()

	fresh := testdb.NewPool(t)
	for _, version := range []int64{1, 2, 3, 5, 6, 7} {
		t.Run(fmt.Sprint(version), func(t *testing.T) {
			t.Parallel()

			ctx := context.Background()
			url := testdb.NewEmpty(t)
			installLegacy(t, url, version)
			pool, err := pgkit.Open(ctx, url, 10*time.Second)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			_, err = migrations.Up(ctx, pool, stock)
			require.NoError(t, err)
			require.NoError(t, migrations.Check(ctx, pool, stock))
			require.Equal(t, catalog(t, fresh, "sluice"), catalog(t, pool, "sluice"))
			require.Equal(t, withOldVersionTable(relations(t, fresh, "public")), relations(t, pool, "public"))
			require.Equal(t, functions(t, fresh, "public"), functions(t, pool, "public"))
		})
	}
}

// withOldVersionTable adds to a fresh install's relations of public those of
// the old goose_db_version, which an upgrade keeps.
func withOldVersionTable(rels []string) []string {
	out := append(slices.Clone(rels), "S goose_db_version_id_seq", "i goose_db_version_pkey", "r goose_db_version")
	slices.Sort(out)
	return out
}

// TestStatusWritesNothing: migrate status and the workers' check only read.
// On an install of the old layout whose sluice schema a DBA created ahead
// (for grants), they create no version table, so the upgrade still finds
// the old layout and moves it.
func TestStatusWritesNothing(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.NewEmpty(t)
	plain := installLegacy(t, url, 8)
	_, err := plain.Exec(ctx, "CREATE SCHEMA sluice")
	require.NoError(t, err)
	_, err = plain.Exec(ctx, "INSERT INTO concurrency_limits (kind, max_concurrency) VALUES ('kept', 3)")
	require.NoError(t, err)
	pool, err := pgkit.Open(ctx, url, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	statuses, err := migrations.Status(ctx, pool, stock)
	require.NoError(t, err)
	require.NotEmpty(t, statuses)
	require.ErrorIs(t, migrations.Check(ctx, pool, stock), migrations.ErrNotMigrated)
	one := int64(1)
	_, err = migrations.Down(ctx, pool, stock, migrations.DownOpts{Component: "cibuilds", To: &one})
	require.NoError(t, err)
	require.Zero(t, jobtest.Count(t, pool, "SELECT count(*) FROM pg_class WHERE relnamespace = 'sluice'::regnamespace"),
		"nothing was created in sluice's schema")

	_, err = migrations.Up(ctx, pool, stock)
	require.NoError(t, err)
	require.Equal(t, 3, jobtest.Count(t, pool, "SELECT max_concurrency FROM sluice.concurrency_limits WHERE kind = 'kept'"))
	require.False(t, exists(t, pool, "public.concurrency_limits"))
}
