package limiter_test

import (
	"context"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/riverqueue/river"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
)

// benchConfig configures benchmark clients like a worker, with
// jobtest.BenchWorkers workers.
var benchConfig = jobtest.BenchConfig

// BenchmarkConcurrencyLimitOverhead compares the throughput of no-op jobs of
// a kind with a limit they never reach (1,000,000 > the 1000 workers) with
// the same jobs without a limit row, alternating in one run (5 rounds,
// medians). Target (P2): ratio ≥ 0.90.
func BenchmarkConcurrencyLimitOverhead(b *testing.B) {
	const n = 20000
	pool := testdb.NewPool(b)
	ctx := context.Background()
	q := db.New(pool)
	for range b.N {
		var limited, unlimited []float64
		for range 5 {
			if _, err := q.ClearConcurrencyLimit(ctx, "demo.sleep"); err != nil {
				b.Fatal(err)
			}
			unlimited = append(unlimited, jobtest.NoopThroughput(b, pool, n, benchConfig))
			if _, err := q.SetConcurrencyLimit(ctx, db.SetConcurrencyLimitParams{Kind: "demo.sleep", MaxConcurrency: 1_000_000}); err != nil {
				b.Fatal(err)
			}
			limited = append(limited, jobtest.NoopThroughput(b, pool, n, benchConfig))
		}
		lim, unl := jobtest.Median(limited), jobtest.Median(unlimited)
		b.Logf("limited jobs/s %v, unlimited jobs/s %v", limited, unlimited)
		b.ReportMetric(lim, "limited-jobs/s")
		b.ReportMetric(unl, "baseline-jobs/s")
		b.ReportMetric(lim/unl, "ratio")
		b.ReportMetric(0.90, "target")
	}
}

// BenchmarkConcurrencyLimitBinding (P9) works 20,000 no-op jobs through a
// limit of 8 on two workers (two clients, each with its own pool and
// limiter), against the same jobs on the same two workers with no limit,
// alternating in one run (3 rounds, medians). Target: ratio ≥ 0.30. It also
// reports how many times a job was fetched on average (1 + parkings per
// job: a parked job is fetched once more when resumed).
func BenchmarkConcurrencyLimitBinding(b *testing.B) {
	const n, limit = 20000, 8
	pool := testdb.NewPool(b)
	ctx := context.Background()
	q := db.New(pool)
	for range b.N {
		var limited, unlimited, fetches []float64
		for range 3 {
			if _, err := q.ClearConcurrencyLimit(ctx, "demo.sleep"); err != nil {
				b.Fatal(err)
			}
			unlimited = append(unlimited, jobtest.NoopThroughputOn(b, pool, n, 2, benchConfig).JobsPerSecond)
			if _, err := q.SetConcurrencyLimit(ctx, db.SetConcurrencyLimitParams{Kind: "demo.sleep", MaxConcurrency: limit}); err != nil {
				b.Fatal(err)
			}
			run := jobtest.NoopThroughputOn(b, pool, n, 2, benchConfig)
			limited = append(limited, run.JobsPerSecond)
			fetches = append(fetches, 1+run.Parked/n)
		}
		lim, unl := jobtest.Median(limited), jobtest.Median(unlimited)
		b.Logf("limit %d: jobs/s %v, fetches per job %v; no limit: jobs/s %v", limit, limited, fetches, unlimited)
		b.ReportMetric(lim, "limited-jobs/s")
		b.ReportMetric(unl, "baseline-jobs/s")
		b.ReportMetric(lim/unl, "ratio")
		b.ReportMetric(0.30, "target")
		b.ReportMetric(jobtest.Median(fetches), "fetches/job")
	}
}

// timedWorker records when each job starts and ends.
type timedArgs struct {
	MS int `json:"ms"`
}

func (timedArgs) Kind() string { return "bench.timed" }

type timedWorker struct {
	river.WorkerDefaults[timedArgs]
	mu     sync.Mutex
	starts []time.Time
	ends   []time.Time
}

func (w *timedWorker) Work(ctx context.Context, job *river.Job[timedArgs]) error {
	w.mu.Lock()
	w.starts = append(w.starts, time.Now())
	w.mu.Unlock()
	time.Sleep(time.Duration(job.Args.MS) * time.Millisecond)
	w.mu.Lock()
	w.ends = append(w.ends, time.Now())
	w.mu.Unlock()
	return nil
}

// BenchmarkConcurrencyLimitParked runs 400 jobs of 50 ms through a limit of
// 4: throughput / ideal (4 per 50 ms; target ≥ 0.9) and the p50 latency from
// a slot being released to the next parked job starting (target < 50 ms).
func BenchmarkConcurrencyLimitParked(b *testing.B) {
	const n, limit, ms = 400, 4, 50
	ctx := context.Background()
	for range b.N {
		pool := testdb.NewPool(b)
		if _, err := db.New(pool).SetConcurrencyLimit(ctx, db.SetConcurrencyLimitParams{Kind: "bench.timed", MaxConcurrency: limit}); err != nil {
			b.Fatal(err)
		}
		worker := &timedWorker{}
		deps, _ := jobtest.NewJobs(b, pool)
		client := jobtest.Start(b, pool, deps, jobtest.Config{Configure: func(c *river.Config) {
			benchConfig(c)
			river.AddWorker(c.Workers, worker)
		}})
		params := make([]river.InsertManyParams, n)
		for i := range params {
			params[i] = river.InsertManyParams{Args: timedArgs{MS: ms}}
		}
		start := time.Now()
		if _, err := client.InsertMany(ctx, params); err != nil {
			b.Fatal(err)
		}
		for {
			worker.mu.Lock()
			done := len(worker.ends)
			worker.mu.Unlock()
			if done == n {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		elapsed := time.Since(start)
		ideal := time.Duration(n/limit*ms) * time.Millisecond

		worker.mu.Lock()
		starts := append([]time.Time(nil), worker.starts...)
		ends := append([]time.Time(nil), worker.ends...)
		worker.mu.Unlock()
		sort.Slice(starts, func(i, j int) bool { return starts[i].Before(starts[j]) })
		sort.Slice(ends, func(i, j int) bool { return ends[i].Before(ends[j]) })
		// The k-th slot release lets the (k+limit)-th job start.
		var lat []float64
		for k := 0; k+limit < len(starts); k++ {
			lat = append(lat, float64(starts[k+limit].Sub(ends[k]).Microseconds())/1000)
		}
		sort.Float64s(lat)
		b.ReportMetric(elapsed.Seconds()*1000, "ms/run")
		b.ReportMetric(float64(ideal.Milliseconds()), "ideal-ms/run")
		b.ReportMetric(ideal.Seconds()/elapsed.Seconds(), "ratio")
		b.ReportMetric(0.9, "target")
		b.ReportMetric(lat[len(lat)/2], "p50-release-to-start-ms")
		b.ReportMetric(lat[len(lat)*99/100], "p99-release-to-start-ms")
	}
}
