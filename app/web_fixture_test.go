package app_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/modules/cibuilds"
	"github.com/sluice-dev/sluice/modules/demo"
	"github.com/sluice-dev/sluice/modules/taskcancel"
	"github.com/sluice-dev/sluice/scheduler"
	"github.com/sluice-dev/sluice/settings"
)

// opsFixture is what startOpsWorker put in the database, through the paths
// an operator's actions take, for the web pages to show.
type opsFixture struct {
	w    *app.Worker
	pool *pgxpool.Pool
	// cancelled is a demo.sleep job running on, though cancelled (it
	// ignores its context): tracked and counted by the monitor, and
	// holding the only slot of demo.sleep.
	cancelled int64
	// parked are demo.sleep jobs parked behind it (limit 1).
	parked []int64
	// scheduleJob is the last job of the schedule web.monitor.
	scheduleJob int64
	// maintenanceJob ran ci.drop_canceling_builds (succeeded); lockedJob
	// ran ci.drop_running_builds while its lock was held (skipped_locked).
	maintenanceJob, lockedJob int64
}

// Names and values the pages must show.
const (
	goodSchedule = "web.monitor"
	badSchedule  = "web.unknown"
	badKind      = "web.no_such_kind"
)

// startOpsWorker starts a worker with cfg (the stock program, on its own
// database) and gives every page something real to show: schedules (one
// dispatched, one failed), a limit with parked jobs, a job counted by the
// cancellation monitor, maintenance runs (succeeded, skipped_locked), and
// the worker itself.
func startOpsWorker(t *testing.T, cfg app.Config) *opsFixture {
	t.Helper()
	ctx := context.Background()
	url := testdb.New(t)
	pool, err := pgkit.Open(ctx, url, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	// Limited before the worker starts, so that it knows the limit at once.
	jobtest.SetLimit(t, pool, "demo.sleep", 1)
	// The CI-build sweeps' own schedules (ci.drop_running_builds at the top
	// of every hour, …) would add runs the maintenance page must not show.
	_, err = pool.Exec(ctx, `UPDATE schedules SET enabled = false WHERE kind LIKE 'ci.drop\_%'`)
	require.NoError(t, err)

	cfg.Modules = jobtest.Modules()
	cfg.DatabaseURL = url
	// Long enough that the running job gets its slot before it would give
	// up waiting, even on a loaded machine: with 10ms, a job on its way to
	// park was overtaken by the two inserted after it (they took the slot
	// leased meanwhile), and the pages showed them finished, not parked.
	cfg.ParkAfter = time.Second
	// The job that ignores its cancellation must not hold up the stop.
	cfg.ShutdownTimeout, cfg.HardStopGrace = 100*time.Millisecond, 100*time.Millisecond
	w, _ := startWorker(t, cfg)
	f := &opsFixture{w: w, pool: pool}

	// demo.sleep, limit 1: one runs (ignoring its cancellation), two park.
	f.cancelled = insert(t, url, demo.SleepArgs{MS: 600_000, IgnoreCancel: true})
	waitState(t, url, f.cancelled, "running")
	f.parked = []int64{insert(t, url, demo.SleepArgs{MS: 1}), insert(t, url, demo.SleepArgs{MS: 1})}
	jobtest.WaitParked(t, pool, f.parked...)

	// Cancelled while running: tracked, then counted by the monitor.
	require.NoError(t, settings.New(pool).Set(ctx, taskcancel.SettingTaskCancellationDurationMillis, 0))
	_, err = w.Client().JobCancel(ctx, f.cancelled)
	require.NoError(t, err)
	waitState(t, url, insert(t, url, taskcancel.TaskCancellationMonitorArgs{}), "completed")

	// A schedule added as `sluice schedule add` does, dispatched by the
	// worker; another, written with plain SQL for a kind nobody knows,
	// failed at its first dispatch (max_retries 0).
	registry, err := cfg.Program().Registry()
	require.NoError(t, err)
	_, err = scheduler.NewStore(pool, registry).Add(ctx, scheduler.Definition{
		Name: goodSchedule, Cron: "@every 1s", Kind: "task_cancellation.monitor", Misfire: "skip", MaxRetries: 3, Enabled: true,
	})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO schedules (name, cron, kind, max_retries) VALUES ($1, '@every 1s', $2, 0)`, badSchedule, badKind)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return pool.QueryRow(ctx, `SELECT last_job_id FROM schedules WHERE name = $1 AND last_job_id IS NOT NULL`, goodSchedule).Scan(&f.scheduleJob) == nil &&
			jobtest.Count(t, pool, `SELECT count(*) FROM schedules WHERE name = $1 AND status = 'failed'`, badSchedule) == 1
	}, 20*time.Second, 20*time.Millisecond)
	// The dispatcher moves on every second: stop it here, so that what the
	// pages show stays put.
	_, err = pool.Exec(ctx, `UPDATE schedules SET enabled = false WHERE name = $1`, goodSchedule)
	require.NoError(t, err)
	require.NoError(t, pool.QueryRow(ctx, `SELECT last_job_id FROM schedules WHERE name = $1`, goodSchedule).Scan(&f.scheduleJob))

	// Maintenance runs: one that succeeds, one that finds its kind's lock
	// held (as an operator pausing the kind would).
	f.maintenanceJob = insert(t, url, cibuilds.DropCancelingBuildsArgs{})
	waitState(t, url, f.maintenanceJob, "completed")
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended('ci.drop_running_builds', 0))`)
	require.NoError(t, err)
	f.lockedJob = insert(t, url, cibuilds.DropRunningBuildsArgs{})
	waitState(t, url, f.lockedJob, "completed")
	_, err = conn.Exec(ctx, `SELECT pg_advisory_unlock(hashtextextended('ci.drop_running_builds', 0))`)
	require.NoError(t, err)
	return f
}

// pageRows reads one page's tables: the cells' text, row by row (the
// header row included).
type pageRows func(t *testing.T, page string) [][]string

// checkPages asserts that every page shows the fixture, reading each
// through rows (over plain HTTP or in a browser).
func checkPages(t *testing.T, f *opsFixture, rows pageRows) {
	t.Helper()
	job := func(id int64) string { return fmt.Sprintf("#%d", id) }

	schedules := rows(t, "schedules")
	good := findRow(t, schedules, goodSchedule)
	require.Equal(t, []string{goodSchedule, "task_cancellation.monitor", "@every 1s (UTC)", "skip", "disabled"}, good[:5])
	require.True(t, strings.HasPrefix(good[7], job(f.scheduleJob)+" "), "last job: %q", good[7])
	require.NotEqual(t, "—", good[6], "last run")
	bad := findRow(t, schedules, badSchedule)
	require.Equal(t, "failed", bad[4])
	require.Equal(t, "1 / 0", bad[9])
	require.Contains(t, bad[10], badKind)
	findRow(t, schedules, "ci.drop_canceling_builds") // the migrations' own

	limits := rows(t, "limits")
	limit := findRow(t, limits, "demo.sleep")
	// Slots in use, working, waiting in workers, parked: the running job
	// works, the two others parked.
	require.Equal(t, []string{"demo.sleep", "1 (sql)", "—", "—", "1 / 1", "1", "0", "2"}, limit[:8])
	for _, id := range f.parked {
		parked := findRow(t, limits, job(id))
		require.Equal(t, []string{job(id), "demo.sleep", "—", "default", "pending"}, parked[:5])
		require.Contains(t, []string{"limit", "fifo"}, parked[5], "held by")
	}

	workers := rows(t, "workers")
	require.Equal(t, "live", findRow(t, workers, f.w.ID())[3])

	maintenance := rows(t, "maintenance")
	canceling := findRow(t, maintenance, "ci.drop_canceling_builds")
	require.Equal(t, "succeeded", canceling[1])
	require.Equal(t, job(f.maintenanceJob), canceling[6])
	running := findRow(t, maintenance, "ci.drop_running_builds")
	require.Equal(t, "skipped_locked", running[1])
	require.Equal(t, "never", running[5], "last success")
	require.Equal(t, job(f.lockedJob), running[6])

	cancellations := rows(t, "cancellations")
	require.Equal(t, []string{"demo.sleep", "1", "1"}, findRow(t, cancellations, "demo.sleep"))
	tracked := findRow(t, cancellations, job(f.cancelled))
	require.Equal(t, "demo.sleep", tracked[1])
	require.NotEqual(t, "not yet", tracked[3], "counted")
}

// findRow returns the first row whose first cell is first.
func findRow(t *testing.T, rows [][]string, first string) []string {
	t.Helper()
	for _, r := range rows {
		if len(r) > 0 && r[0] == first {
			return r
		}
	}
	require.Failf(t, "row not found", "no row starts with %q in %q", first, rows)
	return nil
}
