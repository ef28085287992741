package app_test

import (
	"context"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
)

// clusterFamilies are the cluster-wide gauges: read from the database,
// exported by one worker at a time.
var clusterFamilies = []string{
	"sluice_queue_jobs", "sluice_queue_oldest_available_age_seconds", "sluice_concurrency_limit",
	"sluice_concurrency_slots_in_use", "sluice_parked_jobs", "sluice_parked_oldest_age_seconds", "sluice_workers",
	"sluice_schedules", "sluice_schedules_overdue", "sluice_cancelled_still_running",
	"sluice_task_cancellation_count_post_cancel_total",
}

// scrape fetches and parses a worker's /metrics, by family name.
func scrape(t *testing.T, w *app.Worker) map[string]*dto.MetricFamily {
	t.Helper()
	families, err := jobtest.Scraper{URL: "http://" + w.HTTPAddr() + "/metrics"}.Gather()
	require.NoError(t, err)
	byName := make(map[string]*dto.MetricFamily, len(families))
	for _, f := range families {
		byName[f.GetName()] = f
	}
	return byName
}

// sumOf sums a family's values whose labels include want.
func sumOf(families map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	f, ok := families[name]
	if !ok {
		return 0
	}
	total := 0.0
series:
	for _, m := range f.GetMetric() {
		for k, v := range want {
			found := false
			for _, l := range m.GetLabel() {
				if l.GetName() == k && l.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue series
			}
		}
		switch {
		case m.GetGauge() != nil:
			total += m.GetGauge().GetValue()
		case m.GetCounter() != nil:
			total += m.GetCounter().GetValue()
		}
	}
	return total
}

// TestClusterGaugesExportedOnce: two workers scraped; the cluster-wide
// gauges come from exactly one of them (River's leader), so the sum over
// both equals the figure SQL gives; the per-process series (every kind's
// outcomes at 0, the heartbeat, the build info) come from both.
func TestClusterGaugesExportedOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.New(t)
	pool := openPool(t, url)
	jobtest.SetLimit(t, pool, "demo.sleep", 2)
	jobtest.InsertParked(t, pool, "demo.sleep", `{"ms": 1}`)
	jobtest.InsertParked(t, pool, "demo.sleep", `{"ms": 1}`)
	_, err := pool.Exec(ctx, `INSERT INTO river_job (kind, args, queue, state, scheduled_at, max_attempts)
		SELECT 'demo.sleep', '{"ms": 1}', 'unserved', 'available', now() - interval '1 minute', 1 FROM generate_series(1, 3)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO schedules (name, cron, kind, next_run_at) VALUES ('late', '@hourly', 'demo.sleep', now() - interval '1 hour')`)
	require.NoError(t, err)

	cfg := func(id string) app.Config {
		return app.Config{Modules: jobtest.Modules(), DatabaseURL: url, ID: id, MetricsInterval: time.Second}
	}
	a, _ := startWorker(t, cfg("metrics-a"))
	b, _ := startWorker(t, cfg("metrics-b"))

	var fa, fb map[string]*dto.MetricFamily
	require.Eventually(t, func() bool {
		fa, fb = scrape(t, a), scrape(t, b)
		return sumOf(fa, "sluice_workers", map[string]string{"status": "live"})+
			sumOf(fb, "sluice_workers", map[string]string{"status": "live"}) == 2
	}, 60*time.Second, 100*time.Millisecond, "one worker exports the cluster-wide gauges")
	exporters := 0
	for _, fs := range []map[string]*dto.MetricFamily{fa, fb} {
		if _, ok := fs["sluice_queue_jobs"]; ok {
			exporters++
		}
		require.Equal(t, 1.0, sumOf(fs, "sluice_build_info", nil))
		require.Positive(t, sumOf(fs, "sluice_worker_heartbeat_timestamp_seconds", nil))
		require.Contains(t, fs, "sluice_jobs_total")
		_, ok := fs["sluice_cluster_exporter"]
		require.True(t, ok)
	}
	require.Equal(t, 1, exporters, "exactly one worker exports the cluster-wide gauges")
	require.Equal(t, 1.0, sumOf(fa, "sluice_cluster_exporter", nil)+sumOf(fb, "sluice_cluster_exporter", nil))

	sum := func(name string, labels map[string]string) float64 {
		return sumOf(fa, name, labels) + sumOf(fb, name, labels)
	}
	sql := func(query string, args ...any) float64 {
		var v float64
		require.NoError(t, pool.QueryRow(ctx, query, args...).Scan(&v))
		return v
	}
	require.Equal(t, sql(`SELECT count(*) FROM river_job WHERE queue = 'unserved' AND state = 'available'`),
		sum("sluice_queue_jobs", map[string]string{"queue": "unserved", "state": "available"}))
	require.Equal(t, sql(`SELECT count(*) FROM river_job WHERE queue = 'default' AND state = 'pending'`),
		sum("sluice_queue_jobs", map[string]string{"queue": "default", "state": "pending"}))
	require.InDelta(t, sql(`SELECT extract(epoch FROM now() - min(scheduled_at)) FROM river_job WHERE queue = 'unserved'`),
		sum("sluice_queue_oldest_available_age_seconds", map[string]string{"queue": "unserved"}), 5)
	require.Equal(t, 2.0, sum("sluice_concurrency_limit", map[string]string{"kind": "demo.sleep"}))
	require.Equal(t, sql(`SELECT count(*) FROM concurrency_parked_jobs WHERE kind = 'demo.sleep'`),
		sum("sluice_parked_jobs", map[string]string{"kind": "demo.sleep"}))
	require.Equal(t, sql(`SELECT count(DISTINCT key) FROM concurrency_parked_jobs WHERE kind = 'demo.sleep'`),
		sum("sluice_parked_keys", map[string]string{"kind": "demo.sleep"}))
	require.Equal(t, sql(`SELECT count(*) FROM sluice_worker_status WHERE status = 'live'`),
		sum("sluice_workers", map[string]string{"status": "live"}))
	require.Equal(t, sql(`SELECT count(*) FROM sluice_schedule_status WHERE health = 'overdue'`),
		sum("sluice_schedules_overdue", nil))
	require.Equal(t, sql(`SELECT count(*) FROM sluice_schedule_status`), sum("sluice_schedules", nil))
	// Every family with labels has its series at 0 before the first event.
	for _, series := range []struct {
		name   string
		labels map[string]string
	}{
		{"sluice_jobs_total", map[string]string{"kind": "ci.drop_pending_builds", "queue": "maintenance", "outcome": "retryable"}},
		{"sluice_concurrency_parked_total", map[string]string{"kind": "demo.sleep"}},
		{"sluice_maintenance_runs_total", map[string]string{"kind": "ci.drop_pending_builds", "status": "failed"}},
		{"sluice_reaper_jobs_rescued_total", map[string]string{"kind": "demo.sleep", "state": "discarded"}},
		{"sluice_ci_builds_dropped_total", map[string]string{"kind": "ci.drop_pending_builds"}},
		{"sluice_project_exports_total", map[string]string{"status": "failed"}},
	} {
		require.True(t, hasSeries(fa, series.name, series.labels), "%s%v missing", series.name, series.labels)
		require.Zero(t, sumOf(fa, series.name, series.labels), "%s%v", series.name, series.labels)
	}
	for _, name := range clusterFamilies[:9] {
		require.Contains(t, merged(fa, fb), name)
	}
}

// hasSeries reports whether a family has a series whose labels include want.
func hasSeries(families map[string]*dto.MetricFamily, name string, want map[string]string) bool {
	f, ok := families[name]
	if !ok {
		return false
	}
series:
	for _, m := range f.GetMetric() {
		for k, v := range want {
			found := false
			for _, l := range m.GetLabel() {
				found = found || (l.GetName() == k && l.GetValue() == v)
			}
			if !found {
				continue series
			}
		}
		return true
	}
	return false
}

func merged(a, b map[string]*dto.MetricFamily) map[string]bool {
	out := map[string]bool{}
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}
