package jobtest

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/modules/demo"
)

// NoopThroughput empties river_job, pre-inserts n demo.sleep jobs of 0 ms,
// then times one River client with every sluice worker and middleware (200
// workers, a 1 ms fetch cooldown, unless configure changes them) working them
// all, from its start until the last completion event, and returns jobs/s.
func NoopThroughput(tb testing.TB, pool *pgxpool.Pool, n int, configure func(*river.Config)) float64 {
	tb.Helper()
	return NoopThroughputOn(tb, pool, n, 1, configure).JobsPerSecond
}

// NoopRun is what NoopThroughputOn measured.
type NoopRun struct {
	// JobsPerSecond is n over the time from the clients' start until the
	// last completion.
	JobsPerSecond float64
	// Parked counts the parkings of the run (each costs a job one more
	// fetch), summed over the clients' limiters.
	Parked float64
}

// NoopThroughputOn is NoopThroughput with the given number of clients, each
// with its own pool, deps and limiter, as separate worker processes would
// have: it counts the completion events of all of them (a parking emits no
// event).
func NoopThroughputOn(tb testing.TB, pool *pgxpool.Pool, n, clients int, configure func(*river.Config)) NoopRun {
	tb.Helper()
	params := make([]river.InsertManyParams, n)
	for i := range params {
		params[i] = river.InsertManyParams{Args: demo.SleepArgs{}}
	}
	return ThroughputOf(tb, pool, params, clients, configure)
}

// ThroughputOf is NoopThroughputOn with the jobs params (their workers,
// if not sluice's, added by configure to the clients' Workers): every job
// must complete on its first attempt.
func ThroughputOf(tb testing.TB, pool *pgxpool.Pool, params []river.InsertManyParams, clients int, configure func(*river.Config)) NoopRun {
	tb.Helper()
	ctx := context.Background()
	n := len(params)
	if _, err := pool.Exec(ctx, "TRUNCATE river_job"); err != nil {
		tb.Fatal(err)
	}
	inserter, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: pgkit.SchemasOf(pool).River})
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := inserter.InsertManyFast(ctx, params); err != nil {
		tb.Fatal(err)
	}
	// Every round starts from vacuumed tables: River's, and sluice's slot,
	// parking, waiting and limit rows (churned by limited rounds).
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE river_job, concurrency_limits, concurrency_executions,
		concurrency_parked_jobs, concurrency_waiters, concurrency_leases, concurrency_starts, concurrency_key_lines`); err != nil {
		tb.Fatal(err)
	}
	type started struct {
		client *river.Client[pgx.Tx]
		jobs   *app.Jobs
	}
	all := make([]started, clients)
	events := make(chan *river.Event, n+1000)
	for i := range all {
		clientPool := pool
		if clients > 1 {
			clientPool, err = pgxpool.NewWithConfig(ctx, pool.Config())
			if err != nil {
				tb.Fatal(err)
			}
			defer clientPool.Close()
		}
		// Each client is a worker process of its own, as in production:
		// its own worker ID (a grant to a job waiting in one worker is
		// claimed by that worker only).
		j, _ := NewJobsConfig(tb, clientPool, app.JobsConfig{WorkerID: fmt.Sprintf("test-%s-%d", tb.Name(), i)})
		cfg := &river.Config{
			FetchCooldown:     time.Millisecond,
			FetchPollInterval: 20 * time.Millisecond,
			Logger:            j.Env.Logger,
			Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 200}},
			Schema:            pgkit.SchemasOf(clientPool).River,
			TestOnly:          true,
			WorkerMiddleware:  j.Middleware(),
			Workers:           j.Workers,
		}
		if configure != nil {
			configure(cfg)
		}
		if clients > 1 {
			cfg.ID = fmt.Sprintf("%s-%d", cmp.Or(cfg.ID, "noop"), i)
		}
		driver, err := app.WorkDriver(clientPool, j.Limiter, cfg.Workers)
		if err != nil {
			tb.Fatal(err)
		}
		client, err := river.NewClient(driver, cfg)
		if err != nil {
			tb.Fatal(err)
		}
		j.SetClient(client)
		sub, cancel := client.SubscribeConfig(&river.SubscribeConfig{
			ChanSize: n + 1000,
			Kinds:    []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed},
		})
		defer cancel()
		go func() {
			for ev := range sub {
				events <- ev
			}
		}()
		all[i] = started{client: client, jobs: j}
	}

	start := time.Now()
	for _, c := range all {
		if err := c.client.Start(ctx); err != nil {
			tb.Fatal(err)
		}
	}
	timeout := time.After(5 * time.Minute)
	for done := 0; done < n; {
		select {
		case ev := <-events:
			if ev.Kind != river.EventKindJobCompleted {
				var last string
				if len(ev.Job.Errors) > 0 {
					last = ev.Job.Errors[len(ev.Job.Errors)-1].Error
				}
				tb.Fatalf("job %d: %s (attempt %d): %s", ev.Job.ID, ev.Kind, ev.Job.Attempt, last)
			}
			done++
		case <-timeout:
			tb.Fatalf("%d of %d jobs completed within 5 minutes", done, n)
		}
	}
	elapsed := time.Since(start)
	run := NoopRun{JobsPerSecond: float64(n) / elapsed.Seconds()}
	for _, c := range all {
		stopCtx, stop := context.WithTimeout(ctx, 30*time.Second)
		err := c.client.Stop(stopCtx)
		stop()
		if err != nil {
			tb.Fatal(err)
		}
		c.jobs.Limiter.Flush()
		run.Parked += float64(c.jobs.Limiter.ParkedTotal())
	}
	return run
}

// BenchWorkers is the default queue size of benchmark clients: large enough
// that no-op jobs are bound by the database, not by River's fetch cadence
// (a queue fetches at most MaxWorkers jobs per FetchCooldown).
const BenchWorkers = 1000

// BenchConfig configures a benchmark client as a worker is configured
// (its fetch cooldown and poll interval), with BenchWorkers workers.
func BenchConfig(c *river.Config) {
	c.Queues = map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: BenchWorkers}}
	c.FetchCooldown = app.DefaultFetchCooldown
	c.FetchPollInterval = app.DefaultFetchPollInterval
	c.TestOnly = false
}

// Median is the middle value of xs (the upper one for an even count).
func Median[T cmp.Ordered](xs []T) T {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
