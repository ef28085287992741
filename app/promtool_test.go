package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/modules/demo"
	"github.com/sluice-dev/sluice/modules/taskcancel"
	"github.com/sluice-dev/sluice/settings"
)

// docsDir holds the alerting rules and the dashboard.
const docsDir = "../docs"

// promtool returns promtool's path, or skips the test saying how to get it.
func promtool(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not found: `make promtool` installs it (Debian's prometheus package) and runs these tests")
	}
	return path
}

// TestAlertRules: the shipped alerting rules load (promtool check rules) and
// fire as their unit tests say (promtool test rules).
func TestAlertRules(t *testing.T) {
	t.Parallel()
	bin := promtool(t)
	for _, args := range [][]string{
		{"check", "rules", "alerts.yml"},
		{"test", "rules", "alerts_test.yml"},
	} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = docsDir
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "promtool %v:\n%s", args, out)
	}
}

// TestLiveScrapePassesPromtool: a worker's /metrics, scraped after jobs ran
// and parked, a schedule fell behind and a cancelled job kept running, passes
// promtool check metrics (names, units, help, types), and every sluice_ name
// the alerting rules and the dashboard use is one the worker exports.
func TestLiveScrapePassesPromtool(t *testing.T) {
	t.Parallel()
	bin := promtool(t)
	ctx := context.Background()
	url := testdb.New(t)
	pool := openPool(t, url)
	jobtest.SetLimit(t, pool, "demo.sleep", 1)
	jobtest.InsertParked(t, pool, "demo.sleep", `{"ms": 1}`)
	_, err := pool.Exec(ctx, `INSERT INTO schedules (name, cron, kind, next_run_at) VALUES ('late', '@hourly', 'demo.sleep', now() - interval '1 hour')`)
	require.NoError(t, err)

	require.NoError(t, settings.New(pool).Set(ctx, taskcancel.SettingTaskCancellationDurationMillis, 0))

	// The job that ignores its cancellation must not hold up the stop.
	w, _ := startWorker(t, app.Config{Modules: jobtest.Modules(), DatabaseURL: url, MetricsInterval: time.Second,
		ShutdownTimeout: 100 * time.Millisecond, HardStopGrace: 100 * time.Millisecond})
	id := insert(t, url, demo.SleepArgs{MS: 1})
	waitState(t, url, id, "completed")
	// A job still running after its cancellation, counted by the monitor.
	stubborn := insert(t, url, demo.SleepArgs{MS: 600_000, IgnoreCancel: true})
	waitState(t, url, stubborn, "running")
	_, err = w.Client().JobCancel(ctx, stubborn)
	require.NoError(t, err)
	waitState(t, url, insert(t, url, taskcancel.TaskCancellationMonitorArgs{}), "completed")

	var body []byte
	require.Eventually(t, func() bool {
		body = get(t, "http://"+w.HTTPAddr()+"/metrics")
		return bytes.Contains(body, []byte("sluice_cluster_exporter 1")) &&
			bytes.Contains(body, []byte("sluice_parked_jobs{")) &&
			bytes.Contains(body, []byte("sluice_cancelled_still_running{"))
	}, 30*time.Second, 100*time.Millisecond, "the only worker exports the cluster-wide gauges")

	cmd := exec.Command(bin, "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "promtool check metrics:\n%s", out)
	require.Empty(t, string(bytes.TrimSpace(out)), "promtool check metrics reports problems")

	exported := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^# TYPE (\S+) (\S+)$`).FindAllSubmatch(body, -1) {
		name := string(m[1])
		exported[name] = true
		if string(m[2]) == "histogram" {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				exported[name+suffix] = true
			}
		}
	}
	used := map[string]bool{}
	for _, file := range []string{"alerts.yml", "grafana-dashboard.json"} {
		text, err := os.ReadFile(filepath.Join(docsDir, file))
		require.NoError(t, err)
		if filepath.Ext(file) == ".json" {
			require.True(t, json.Valid(text), "%s is not valid JSON", file)
		}
		for _, name := range regexp.MustCompile(`\bsluice_[a-z_]+\b`).FindAll(text, -1) {
			used[string(name)] = true
		}
	}
	// Names that are SQL objects, not metrics, in the annotations.
	for _, sqlName := range []string{"sluice_worker_status", "sluice_schedule_status", "sluice_schedule_overdue_after",
		"sluice_concurrency_overview", "sluice_task_cancellation_stats"} {
		delete(used, sqlName)
	}
	require.NotEmpty(t, used)
	for name := range used {
		require.True(t, exported[name], "docs use %s, which the worker does not export", name)
	}
}

// get returns the body of a GET.
func get(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return body
}
