package e2e_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/sluice-dev/sluice/internal/proc"
	"github.com/sluice-dev/sluice/internal/testdb"
)

// BenchmarkNoopTracing measures what tracing costs a `sluice worker`
// process working the no-op workload of BenchmarkNoopSluiceWorker (P1):
// tracing off (the default; P1 itself is measured with it off) and on,
// the jobs inserted inside a span (each carries its trace context) and the
// worker exporting every work span over OTLP/HTTP to a collector in the
// benchmark's process that accepts and discards them. Figures: jobs/s
// with tracing off and on, the best of noopRounds each, alternating; ratio
// = on ÷ off (the share of the throughput tracing keeps); spans/s
// received by the collector. No target: the cost is reported.
func BenchmarkNoopTracing(b *testing.B) {
	url := testdb.New(b)
	pool := openBenchPool(b, url)
	var received atomic.Int64
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		received.Add(n)
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	defer collector.Close()
	env := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + collector.URL, "OTEL_SERVICE_NAME=bench"}
	for range b.N {
		var off, on []float64
		for r := range noopRounds {
			if r%2 == 0 {
				off = append(off, tracedNoop(b, pool, url, nil))
				on = append(on, tracedNoop(b, pool, url, env))
			} else {
				on = append(on, tracedNoop(b, pool, url, env))
				off = append(off, tracedNoop(b, pool, url, nil))
			}
		}
		b.Logf("jobs/s per round: tracing off %.0f, on %.0f; %d bytes of spans received", off, on, received.Load())
		b.ReportMetric(maxOf(off), "jobs/s")
		b.ReportMetric(maxOf(on), "traced-jobs/s")
		b.ReportMetric(maxOf(on)/maxOf(off), "ratio")
	}
}

// tracedNoop works noopJobs no-op jobs with a worker whose environment
// adds env (nil: tracing off, the jobs inserted without a trace) and
// returns jobs/s.
func tracedNoop(b *testing.B, pool *pgxpool.Pool, url string, env []string) float64 {
	b.Helper()
	resetRiverJobs(b, pool)
	if env == nil {
		insertNoops(b, pool, noopJobs)
	} else {
		// Spans made, none exported: the inserts only carry their context.
		tp := sdktrace.NewTracerProvider()
		defer tp.Shutdown(context.Background()) //nolint:errcheck
		ctx, span := tp.Tracer("bench").Start(context.Background(), "insert noops")
		insertNoopsTraced(ctx, b, pool, tp, noopJobs)
		span.End()
	}
	w := proc.StartWorkerEnv(b, url, fmt.Sprintf("bench-trace-%t", env != nil), env,
		"--default-workers", fmt.Sprint(noopConcurrency), "--log-level", "warn")
	waitCompleted(b, pool)
	w.Signal(b, syscall.SIGTERM)
	if code := w.Wait(b, time.Minute); code != 0 {
		b.Fatalf("worker exited %d:\n%s", code, w.Log())
	}
	return dbRate(b, pool)
}
