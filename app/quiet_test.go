package app_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
)

// TestIdleWorkerQuiet: an idle stock worker's own periodic jobs (the
// cancellation monitor, every 5 s by default; the limiter's safety net,
// every minute) leave one completed job each, not one per run: here both
// run every second, and after several runs each kind has one completed job
// left. With the defaults an idle worker so leaves at most 4 jobs of
// sluice's kinds in any 5 minutes (those two, and at most two of the
// hourly CI-build sweeps).
func TestIdleWorkerQuiet(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.New(t)
	pool := openPool(t, url)
	_, err := pool.Exec(ctx, `UPDATE schedules SET cron = '@every 1s'
		WHERE name IN ('task_cancellation.monitor', 'concurrency_limit.resume')`)
	require.NoError(t, err)
	_, stop := startWorker(t, app.Config{Modules: jobtest.Modules(), DatabaseURL: url, SchedulePollInterval: 100 * time.Millisecond})
	runs := func() (monitor, resume int64) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT
			(SELECT run_count FROM schedules WHERE name = 'task_cancellation.monitor'),
			(SELECT run_count FROM schedules WHERE name = 'concurrency_limit.resume')`).Scan(&monitor, &resume))
		return monitor, resume
	}
	require.Eventually(t, func() bool { m, r := runs(); return m >= 4 && r >= 4 }, 30*time.Second, 100*time.Millisecond)
	err, _ = stop()
	require.NoError(t, err)

	rows, err := pool.Query(ctx, `SELECT kind, state::text, count(*) FROM river_job
		WHERE kind IN ('task_cancellation.monitor', 'concurrency_limit.resume') GROUP BY kind, state ORDER BY kind, state`)
	require.NoError(t, err)
	left := map[string]int{}
	for rows.Next() {
		var kind, state string
		var n int
		require.NoError(t, rows.Scan(&kind, &state, &n))
		left[kind+" "+state] = n
	}
	require.NoError(t, rows.Err())
	m, r := runs()
	for _, kind := range []string{"task_cancellation.monitor", "concurrency_limit.resume"} {
		require.Equal(t, 1, left[kind+" completed"], "%s after %d monitor runs and %d resume runs: %v", kind, m, r, left)
		// one more dispatched before the stop may be waiting for its turn
		require.LessOrEqual(t, left[kind+" available"]+left[kind+" running"], 1, "%v", left)
	}
}
