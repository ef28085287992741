package jobtest

import (
	"cmp"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/sluice-dev/sluice/jobs"
)

// NoopThroughput empties river_job, pre-inserts n demo.sleep jobs of 0 ms,
// then times one River client with every sluice worker and middleware (200
// workers, a 1 ms fetch cooldown, unless configure changes them) working them
// all, from its start until the last completion event, and returns jobs/s.
func NoopThroughput(tb testing.TB, pool *pgxpool.Pool, n int, configure func(*river.Config)) float64 {
	tb.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "TRUNCATE river_job"); err != nil {
		tb.Fatal(err)
	}
	params := make([]river.InsertManyParams, n)
	for i := range params {
		params[i] = river.InsertManyParams{Args: jobs.DemoSleepArgs{}}
	}
	inserter, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := inserter.InsertManyFast(ctx, params); err != nil {
		tb.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE river_job"); err != nil {
		tb.Fatal(err)
	}
	deps, _ := NewDeps(tb, pool)
	workers := river.NewWorkers()
	if err := jobs.AddWorkers(workers, deps); err != nil {
		tb.Fatal(err)
	}
	cfg := &river.Config{
		FetchCooldown:     time.Millisecond,
		FetchPollInterval: 20 * time.Millisecond,
		Logger:            deps.Logger,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 200}},
		TestOnly:          true,
		WorkerMiddleware:  jobs.Middleware(deps),
		Workers:           workers,
	}
	if configure != nil {
		configure(cfg)
	}
	client, err := river.NewClient(riverpgxv5.New(pool), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	events, cancel := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: n + 1000,
		Kinds:    []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed},
	})
	defer cancel()

	start := time.Now()
	if err := client.Start(ctx); err != nil {
		tb.Fatal(err)
	}
	timeout := time.After(5 * time.Minute)
	for done := 0; done < n; {
		select {
		case ev := <-events:
			if ev.Kind != river.EventKindJobCompleted {
				tb.Fatalf("job %d: %s", ev.Job.ID, ev.Kind)
			}
			done++
		case <-timeout:
			tb.Fatalf("%d of %d jobs completed within 5 minutes", done, n)
		}
	}
	elapsed := time.Since(start)
	stopCtx, stop := context.WithTimeout(ctx, 30*time.Second)
	defer stop()
	if err := client.Stop(stopCtx); err != nil {
		tb.Fatal(err)
	}
	return float64(n) / elapsed.Seconds()
}

// Median is the middle value of xs (the upper one for an even count).
func Median[T cmp.Ordered](xs []T) T {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
