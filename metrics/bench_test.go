package metrics_test

import (
	"testing"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/metrics"
)

// BenchmarkMetricsOverhead compares the throughput of no-op jobs through a
// worker's whole middleware (the limiter, then the job metrics) with the
// same client without the metrics middleware, alternating in one run (5
// rounds of 20,000 jobs each, 1000 workers, medians). The metrics issue
// allows its metrics to cost P1 at most 0.02: target ratio ≥ 0.98.
func BenchmarkMetricsOverhead(b *testing.B) {
	const n = 20_000
	pool := testdb.NewPool(b)
	for range b.N {
		var with, without []float64
		for range 5 {
			without = append(without, jobtest.NoopThroughput(b, pool, n, func(c *river.Config) {
				benchConfig(c)
				c.WorkerMiddleware = withoutMetrics(b, c.WorkerMiddleware)
			}))
			with = append(with, jobtest.NoopThroughput(b, pool, n, benchConfig))
		}
		w, wo := jobtest.Median(with), jobtest.Median(without)
		b.Logf("with metrics jobs/s %v, without %v", with, without)
		b.ReportMetric(w, "jobs/s")
		b.ReportMetric(wo, "baseline-jobs/s")
		b.ReportMetric(w/wo, "ratio")
		b.ReportMetric(0.98, "target")
	}
}

// benchConfig configures benchmark clients as a worker does, with 1000
// workers so that no-op jobs are bound by the database.
func benchConfig(c *river.Config) {
	c.Queues = map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 1000}}
	c.FetchCooldown = app.DefaultFetchCooldown
	c.FetchPollInterval = app.DefaultFetchPollInterval
	c.TestOnly = false
}

// withoutMetrics is mw without the job metrics middleware, which must be
// there.
func withoutMetrics(b *testing.B, mw []rivertype.WorkerMiddleware) []rivertype.WorkerMiddleware {
	out := make([]rivertype.WorkerMiddleware, 0, len(mw))
	for _, m := range mw {
		if _, ok := m.(*metrics.Middleware); !ok {
			out = append(out, m)
		}
	}
	if len(out) != len(mw)-1 {
		b.Fatalf("the worker middleware has %d metrics middlewares, want 1", len(mw)-len(out))
	}
	return out
}
