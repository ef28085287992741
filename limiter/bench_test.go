package limiter_test

import (
	"context"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/riverqueue/river"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/limiter"
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
	setter, err := limiter.New(limiter.Config{Pool: pool})
	if err != nil {
		b.Fatal(err)
	}
	for range b.N {
		var limited, unlimited []float64
		for range 5 {
			if _, err := setter.ClearLimits(ctx, "demo.sleep", limiter.Facets{}); err != nil {
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
	setter, err := limiter.New(limiter.Config{Pool: pool})
	if err != nil {
		b.Fatal(err)
	}
	for range b.N {
		var limited, unlimited, fetches []float64
		for range 3 {
			if _, err := setter.ClearLimits(ctx, "demo.sleep", limiter.Facets{}); err != nil {
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

// BenchmarkBreakerRaised (P12): a circuit breaker over 2,000 parked jobs
// of 10 ms is raised to 2, on two workers. The drain (from the raise to
// the last job's end) against the ideal, 2 jobs per 10 ms (target ≥ 0.90),
// and the parkings per job in all, the first one included (target ≤ 1.05):
// raising a breaker resumes only what the limit lets start, plus a small
// lookahead, not the whole line.
func BenchmarkBreakerRaised(b *testing.B) {
	const n, limit, ms = 2000, 2, 10
	const kind = "test.probe.p12"
	ctx := context.Background()
	for range b.N {
		url, pool, tracker := probeKind(b, "p12", -1)
		logParkings(b, pool)
		a := startProbeWorker(b, url, "p12-a", "p12", tracker, 0, nil)
		startProbeWorker(b, url, "p12-b", "p12", tracker, 0, nil)
		insertProbes(b, a, "p12", 0, n, ms)
		deadline := time.Now().Add(2 * time.Minute)
		for count(b, pool, `SELECT count(*) FROM concurrency_parked_jobs p JOIN river_job j ON j.id = p.job_id
			WHERE j.state = 'pending' AND p.kind = $1`, kind) < n {
			if time.Now().After(deadline) {
				b.Fatal("the jobs did not all park")
			}
			time.Sleep(20 * time.Millisecond)
		}
		var maxAvailable int
		stop, sampled := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(sampled)
			for {
				select {
				case <-stop:
					return
				case <-time.After(5 * time.Millisecond):
				}
				var c int
				if pool.QueryRow(ctx, "SELECT count(*) FROM river_job WHERE kind = $1 AND state = 'available'", kind).Scan(&c) == nil {
					maxAvailable = max(maxAvailable, c)
				}
			}
		}()
		lim, err := limiter.New(limiter.Config{Pool: pool})
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if err := lim.SetConcurrency(ctx, kind, limit); err != nil {
			b.Fatal(err)
		}
		for tracker.doneCount() < n {
			if time.Since(start) > 5*time.Minute {
				b.Fatal("the drain did not end")
			}
			time.Sleep(2 * time.Millisecond)
		}
		elapsed := time.Since(start)
		close(stop)
		<-sampled
		ideal := time.Duration(n/limit*ms) * time.Millisecond
		perJob := float64(parkings(b, pool, kind)) / n
		b.Logf("breaker raised to %d over %d parked jobs of %d ms: drained in %s (ideal %s), %.3f parkings per job, at most %d available at once",
			limit, n, ms, elapsed.Round(time.Millisecond), ideal, perJob, maxAvailable)
		b.Logf("from a job's end to the next start: %s", tracker.turnovers(start))
		b.ReportMetric(float64(elapsed.Milliseconds()), "drain-ms")
		b.ReportMetric(float64(ideal.Milliseconds()), "ideal-ms")
		b.ReportMetric(ideal.Seconds()/elapsed.Seconds(), "ratio")
		b.ReportMetric(0.90, "target")
		b.ReportMetric(perJob, "parkings/job")
		b.ReportMetric(float64(maxAvailable), "max-available")
	}
}

// BenchmarkParkedDrain (P15): 20,000 parked 0-ms jobs drained on one worker
// after a circuit breaker over them is lifted to a limit of 8, against the
// same jobs through a limit of 8 never parked (each timed from the moment
// the worker may start them to the last job's end; the jobs inserted
// before). Target: ratio ≥ 0.50.
func BenchmarkParkedDrain(b *testing.B) {
	const n, limit = 20000, 8
	ctx := context.Background()
	drain := func(kind string, limitFirst int32) time.Duration {
		url, pool, tracker := probeKind(b, kind, limitFirst)
		inserter, err := app.NewInsertClient(pool, nil)
		if err != nil {
			b.Fatal(err)
		}
		params := make([]river.InsertManyParams, n)
		for i := range params {
			params[i] = river.InsertManyParams{Args: probeArgs{Seq: i, K: kind}}
		}
		if _, err := inserter.InsertMany(ctx, params); err != nil {
			b.Fatal(err)
		}
		if limitFirst < 0 {
			startProbeWorker(b, url, kind+"-a", kind, tracker, 0, nil)
			deadline := time.Now().Add(5 * time.Minute)
			for count(b, pool, `SELECT count(*) FROM river_job WHERE kind = $1 AND state = 'pending'`, "test.probe."+kind) < n {
				if time.Now().After(deadline) {
					b.Fatal("the jobs did not all park")
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		start := time.Now()
		if limitFirst < 0 {
			lim, err := limiter.New(limiter.Config{Pool: pool})
			if err != nil {
				b.Fatal(err)
			}
			if err := lim.SetConcurrency(ctx, "test.probe."+kind, limit); err != nil {
				b.Fatal(err)
			}
		} else {
			startProbeWorker(b, url, kind+"-a", kind, tracker, 0, nil)
		}
		for tracker.doneCount() < n {
			if time.Since(start) > 10*time.Minute {
				b.Fatal("the drain did not end")
			}
			time.Sleep(2 * time.Millisecond)
		}
		return time.Since(start)
	}
	for range b.N {
		parked := drain("p15", -1)
		never := drain("p15n", limit)
		b.Logf("%d jobs of 0 ms through a limit of %d: drained after the breaker lifted in %s, never parked in %s",
			n, limit, parked.Round(time.Millisecond), never.Round(time.Millisecond))
		b.ReportMetric(float64(n)/parked.Seconds(), "drain-jobs/s")
		b.ReportMetric(float64(n)/never.Seconds(), "baseline-jobs/s")
		b.ReportMetric(never.Seconds()/parked.Seconds(), "ratio")
		b.ReportMetric(0.50, "target")
	}
}
