package taskcancel_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/modules/taskcancel"
)

// TestTaskCancellationCollector: the Prometheus metrics are the database's
// numbers at scrape time; a failed read is reported by stats_up 0 and does
// not fail the scrape.
func TestTaskCancellationCollector(t *testing.T) {
	t.Parallel()

	pool := testdb.NewPool(t)
	env := newCancelEnv(t, pool)
	setSetting(t, pool, taskcancel.SettingTaskCancellationDurationMillis, 0)
	reg := prometheus.NewRegistry()
	reg.MustRegister(taskcancel.NewTaskCancellationCollector(pool, jobtest.Logger(t)))

	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP sluice_task_cancellation_stats_up 1 if the task cancellation stats were read from the database at this scrape, else 0.
# TYPE sluice_task_cancellation_stats_up gauge
sluice_task_cancellation_stats_up 1
`)))

	ids := env.startHeld(t, 3)
	env.cancel(t, ids[:2]...)
	env.monitor(t)
	env.complete(t, ids[0])
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP sluice_task_cancellation_count_post_cancel_total Jobs counted by task_cancellation.monitor for running too long after their cancellation, per kind (cumulative, cluster-wide).
# TYPE sluice_task_cancellation_count_post_cancel_total counter
sluice_task_cancellation_count_post_cancel_total{kind="test.hold"} 2
# HELP sluice_task_cancellation_current_count_post_cancel Jobs running now at least task_cancellation.duration_millis after their cancellation, per kind.
# TYPE sluice_task_cancellation_current_count_post_cancel gauge
sluice_task_cancellation_current_count_post_cancel{kind="test.hold"} 1
# HELP sluice_task_cancellation_stats_up 1 if the task cancellation stats were read from the database at this scrape, else 0.
# TYPE sluice_task_cancellation_stats_up gauge
sluice_task_cancellation_stats_up 1
`)))

	// A database that cannot be read.
	closed, err := db.Open(context.Background(), testdb.New(t), 10*time.Second)
	require.NoError(t, err)
	closed.Close()
	broken := prometheus.NewRegistry()
	broken.MustRegister(taskcancel.NewTaskCancellationCollector(closed, nil))
	require.NoError(t, testutil.GatherAndCompare(broken, strings.NewReader(`
# HELP sluice_task_cancellation_stats_up 1 if the task cancellation stats were read from the database at this scrape, else 0.
# TYPE sluice_task_cancellation_stats_up gauge
sluice_task_cancellation_stats_up 0
`)))
}
