package app_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/modules/demo"
	"github.com/sluice-dev/sluice/modules/taskcancel"
	"github.com/sluice-dev/sluice/settings"
)

// TestWorkerStats: /stats serves the stats document, with the
// task_cancellation section in OpenSearch's node-stats shape, and /metrics
// the task cancellation metrics, both read from the database.
func TestWorkerStats(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	pool, err := pgkit.Open(ctx, url, 10*time.Second)
	require.NoError(t, err)
	defer pool.Close()
	// The job that ignores its cancellation must not hold up the stop.
	w, _ := startWorker(t, app.Config{Modules: jobtest.Modules(), DatabaseURL: url, ShutdownTimeout: 100 * time.Millisecond, HardStopGrace: 100 * time.Millisecond, MetricsInterval: time.Second})
	base := "http://" + w.HTTPAddr()
	get := func(path string) (int, string) {
		resp, err := http.Get(base + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body)
	}

	code, body := get("/stats")
	require.Equal(t, http.StatusOK, code, body)
	var empty map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(body), &empty))
	require.JSONEq(t, `{}`, string(empty["task_cancellation"]))
	require.Equal(t, byte('{'), empty["queues"][0])

	// A job running long after its cancellation, counted by the monitor.
	id := insert(t, url, demo.SleepArgs{MS: 600_000, IgnoreCancel: true})
	waitState(t, url, id, "running")
	require.NoError(t, settings.New(pool).Set(ctx, taskcancel.SettingTaskCancellationDurationMillis, 0))
	_, err = w.Client().JobCancel(ctx, id)
	require.NoError(t, err)
	monitor := insert(t, url, taskcancel.TaskCancellationMonitorArgs{})
	waitState(t, url, monitor, "completed")

	code, body = get("/stats")
	require.Equal(t, http.StatusOK, code, body)
	var doc struct {
		Queues           map[string]app.QueueKindStats `json:"queues"`
		TaskCancellation map[string]map[string]int64   `json:"task_cancellation"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &doc))
	require.Equal(t, map[string]map[string]int64{
		"demo.sleep": {"current_count_post_cancel": 1, "total_count_post_cancel": 1},
	}, doc.TaskCancellation)
	require.EqualValues(t, 1, doc.Queues["demo.sleep"].Jobs["running"])
	require.GreaterOrEqual(t, doc.Queues["task_cancellation.monitor"].Jobs["completed"], int64(1))

	// The cluster-wide gauges: this worker is the only one, so River elects
	// it and it exports them after its next refresh.
	require.Eventually(t, func() bool {
		_, body = get("/metrics")
		return strings.Contains(body, `sluice_cancelled_still_running{kind="demo.sleep"} 1`) &&
			strings.Contains(body, `sluice_task_cancellation_count_post_cancel_total{kind="demo.sleep"} 1`)
	}, 10*time.Second, 50*time.Millisecond)
	require.Contains(t, body, "sluice_cluster_exporter 1")

	// A broken setting: /stats says so, with a 503, and /metrics still works
	// (a failed refresh is counted; the other figures stay).
	_, err = pool.Exec(ctx, `UPDATE settings SET value = '"10s"' WHERE key = 'task_cancellation.duration_millis'`)
	require.NoError(t, err)
	code, body = get("/stats")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "setting task_cancellation.duration_millis: want")
	require.Eventually(t, func() bool {
		code, body = get("/metrics")
		return code == http.StatusOK && strings.Contains(body, "sluice_cluster_refresh_errors_total ") &&
			!strings.Contains(body, "sluice_cluster_refresh_errors_total 0")
	}, 10*time.Second, 50*time.Millisecond)
	require.Contains(t, body, `sluice_queue_jobs{queue="default",state="running"}`)
}
