package app_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
)

func openPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgkit.Open(context.Background(), url, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func getHealth(t *testing.T, w *app.Worker) (int, app.HealthReport) {
	t.Helper()
	resp, err := http.Get("http://" + w.HTTPAddr() + "/health")
	require.NoError(t, err)
	defer resp.Body.Close()
	var report app.HealthReport
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&report))
	return resp.StatusCode, report
}

// TestWorkerRunsScheduler: a worker dispatches schedules (their jobs are
// worked), keeps its sluice_workers row fresh, reports /health and the
// scheduler metrics, and removes its row on a clean stop.
func TestWorkerRunsScheduler(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	pool := openPool(t, url)
	_, err := pool.Exec(ctx, `INSERT INTO schedules (name, cron, kind, args) VALUES ('canary', '@every 1s', 'demo.sleep', '{"ms": 1}')`)
	require.NoError(t, err)

	w, stop := startWorker(t, app.Config{Modules: jobtest.Modules(), DatabaseURL: url, HeartbeatInterval: 200 * time.Millisecond, SchedulePollInterval: 50 * time.Millisecond})

	// The row appears at start, with the worker's id (its River client ID).
	var host string
	var pid int
	require.NoError(t, pool.QueryRow(ctx, `SELECT host, pid FROM sluice_workers WHERE id = $1`, w.ID()).Scan(&host, &pid))
	require.NotEmpty(t, host)
	require.NotZero(t, pid)
	require.Equal(t, w.ID(), w.Client().ID())

	// Schedules are dispatched and their jobs worked.
	require.Eventually(t, func() bool {
		var completed int
		require.NoError(t, pool.QueryRow(ctx, `
			SELECT count(*) FROM river_job WHERE metadata->>'schedule' = 'canary' AND state = 'completed'`).Scan(&completed))
		return completed >= 2
	}, 30*time.Second, 20*time.Millisecond)

	// The heartbeat carries the dispatcher's ticks.
	require.Eventually(t, func() bool {
		var live, fresh bool
		var tick *time.Time
		require.NoError(t, pool.QueryRow(ctx, `
			SELECT live, dispatcher_fresh, dispatcher_tick_at FROM sluice_worker_status WHERE id = $1`, w.ID()).Scan(&live, &fresh, &tick))
		return live && fresh && tick != nil
	}, 30*time.Second, 20*time.Millisecond)

	code, report := getHealth(t, w)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, app.HealthOK, report.Status, "%+v", report.Checks)
	require.EqualValues(t, 1, report.LiveWorkers)
	require.NotNil(t, report.DispatcherLastTickAgeSeconds)

	resp, err := http.Get("http://" + w.HTTPAddr() + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	for _, want := range []string{
		`sluice_schedule_dispatched_total `,
		`sluice_schedule_dispatch_lag_seconds_bucket`,
		`sluice_schedule_tick_duration_seconds_bucket`,
	} {
		require.Contains(t, string(body), want)
	}

	// A failed schedule makes the health WARNING (HTTP 200 still).
	_, err = pool.Exec(ctx, `UPDATE schedules SET status = 'failed', last_error = 'test' WHERE name = 'canary'`)
	require.NoError(t, err)
	code, report = getHealth(t, w)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, app.HealthWarning, report.Status)
	require.Equal(t, []string{"canary"}, report.FailedNames)

	err, _ = stop()
	require.NoError(t, err)
	var rows int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM sluice_workers`).Scan(&rows))
	require.Zero(t, rows, "a clean stop removes the worker's row")
}

func TestHealth(t *testing.T) {
	t.Parallel()

	ctx := context.Background()

	t.Run("unreachable database is CRITICAL", func(t *testing.T) {
		t.Parallel()
		report, err := app.CheckHealth(ctx, "postgres://bob:s3cretpw@127.0.0.1:1/x?connect_timeout=2", pgkit.Schemas{})
		require.NoError(t, err)
		require.Equal(t, app.HealthCritical, report.Status)
		require.Equal(t, 2, report.ExitCode())
		require.False(t, report.DatabaseReachable)
		require.NotContains(t, report.Summary(), "s3cretpw")
		require.Contains(t, report.Summary(), "database: unreachable")
	})

	t.Run("malformed URL is an error", func(t *testing.T) {
		t.Parallel()
		_, err := app.CheckHealth(ctx, "postgres://x:1:2:3", pgkit.Schemas{})
		require.Error(t, err)
	})

	t.Run("no worker is CRITICAL", func(t *testing.T) {
		t.Parallel()
		report, err := app.CheckHealth(ctx, testdb.New(t), pgkit.Schemas{})
		require.NoError(t, err)
		require.Equal(t, app.HealthCritical, report.Status)
		require.True(t, report.DatabaseReachable)
		require.Contains(t, report.Summary(), "workers: no live worker")
	})

	t.Run("states by hand", func(t *testing.T) {
		t.Parallel()
		url := testdb.New(t)
		pool := openPool(t, url)
		exec := func(sql string) {
			t.Helper()
			_, err := pool.Exec(ctx, sql)
			require.NoError(t, err)
		}
		check := func(want string) *app.HealthReport {
			t.Helper()
			report, err := app.CheckHealth(ctx, url, pgkit.Schemas{})
			require.NoError(t, err)
			require.Equal(t, want, report.Status, "%+v", report.Checks)
			return report
		}
		// A live worker whose dispatcher ticked a moment ago: OK.
		exec(`INSERT INTO sluice_workers (id, host, pid, heartbeat_interval, dispatcher_tick_at, poll_interval)
		      VALUES ('w1', 'h', 1, '5s', now(), '1s')`)
		check(app.HealthOK)
		// A late worker (missed heartbeats, not dead yet): reported, still OK.
		exec(`INSERT INTO sluice_workers (id, host, pid, started_at, heartbeat_at, heartbeat_interval, poll_interval)
		      VALUES ('late', 'h', 2, now() - interval '1 hour', now() - interval '20 seconds', '5s', '1s')`)
		r := check(app.HealthOK)
		require.EqualValues(t, 1, r.StaleWorkers)
		require.Zero(t, r.DeadWorkers)
		// A dead worker's row no reaper has reaped (older than its
		// dead_after, 30s by default): WARNING, listed with its running jobs.
		exec(`INSERT INTO sluice_workers (id, host, pid, started_at, heartbeat_at, heartbeat_interval, poll_interval)
		      VALUES ('dead', 'h', 4, now() - interval '1 hour', now() - interval '1 hour', '5s', '1s')`)
		r = check(app.HealthWarning)
		require.EqualValues(t, 2, r.StaleWorkers)
		require.EqualValues(t, 1, r.DeadWorkers)
		require.Contains(t, r.Summary(), "dead_workers: 1 dead, not reaped yet")
		require.Contains(t, r.Summary(), "dead (heartbeat 3600s ago, 0 running jobs)")
		require.Equal(t, "dead", r.Workers[0].ID, "dead workers come first")
		require.Equal(t, "dead", r.Workers[0].Status)
		exec(`DELETE FROM sluice_workers WHERE id IN ('dead', 'late')`)
		check(app.HealthOK)
		// An overdue schedule: WARNING.
		exec(`INSERT INTO schedules (name, cron, kind, next_run_at) VALUES ('late', '* * * * *', 'demo.sleep', now() - interval '1 minute')`)
		r = check(app.HealthWarning)
		require.Equal(t, []string{"late"}, r.OverdueNames)
		require.Equal(t, 1, r.ExitCode())
		var health string
		require.NoError(t, pool.QueryRow(ctx, `SELECT health FROM sluice_schedule_status WHERE name = 'late'`).Scan(&health))
		require.Equal(t, "overdue", health)
		exec(`UPDATE schedules SET next_run_at = now() + interval '1 minute'`)
		check(app.HealthOK)
		// A second live worker whose dispatcher stopped ticking: WARNING.
		exec(`INSERT INTO sluice_workers (id, host, pid, started_at, heartbeat_interval, dispatcher_tick_at, poll_interval)
		      VALUES ('w2', 'h', 3, now() - interval '1 hour', '5s', now() - interval '10 minutes', '1s')`)
		r = check(app.HealthWarning)
		require.Regexp(t, `dispatchers have not ticked recently: w2 on h \(last tick 6\d\ds ago\)`, r.Summary())
		// ... and the first one too: CRITICAL.
		exec(`UPDATE sluice_workers SET dispatcher_tick_at = now() - interval '10 minutes', started_at = now() - interval '1 hour' WHERE id = 'w1'`)
		r = check(app.HealthCritical)
		require.Contains(t, r.Summary(), "dispatcher: no live dispatcher has ticked recently: ")
		require.Contains(t, r.Summary(), "w1 on ")
		require.Contains(t, r.Summary(), "w2 on h (last tick")
		// A dispatcher that never ticked names its worker and how long it
		// has been up.
		exec(`UPDATE sluice_workers SET dispatcher_tick_at = NULL WHERE id = 'w2'`)
		r = check(app.HealthCritical)
		require.Regexp(t, `w2 on h \(never ticked, worker up 36\d\ds\)`, r.Summary())
		require.True(t, strings.HasPrefix(r.Summary(), "CRITICAL: "))
		// The only dispatcher's worker was killed (dead, not reaped yet):
		// named, with its last tick, a second before its last heartbeat.
		exec(`DELETE FROM sluice_workers`)
		exec(`INSERT INTO sluice_workers (id, host, pid, started_at, heartbeat_at, heartbeat_interval, dispatcher_tick_at, poll_interval)
		      VALUES ('gone', 'h9', 5, now() - interval '1 hour', now() - interval '40 seconds', '5s', now() - interval '41 seconds', '1s')`)
		r = check(app.HealthCritical)
		require.Regexp(t, `dispatcher: no live dispatcher has ticked recently: the last tick was 41\.\ds ago by gone on h9, which is dead \(heartbeat 40s ago\)`,
			r.Summary())
		// No worker row at all: said so, not "never".
		exec(`DELETE FROM sluice_workers`)
		r = check(app.HealthCritical)
		require.Contains(t, r.Summary(), "dispatcher: no live dispatcher has ticked recently, and no worker row records a tick")
	})
}
