package jobs_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/jobs"
)

// BenchmarkTaskCancellationTriggerOverhead measures what the two river_job
// triggers of cancellation monitoring (sluice_task_cancellation_track and
// _untrack) cost River's throughput: rounds of pre-inserted no-op jobs
// (demo.sleep, ms 0) worked by one River client, in a database with the
// triggers and in one without them, alternating in the same run. It reports
// the best round of each side: jobs/s (with the triggers), baseline-jobs/s
// (without), ratio = jobs/s ÷ baseline-jobs/s, and target 0.95: the ratio
// must be above it (the triggers' WHEN clauses are all River pays; no
// trigger function runs for a job nobody cancels).
func BenchmarkTaskCancellationTriggerOverhead(b *testing.B) {
	const (
		jobsPerRound = 10_000
		rounds       = 7
	)
	withTriggers, withoutTriggers := triggerPools(b)

	var with, without []float64
	for range b.N {
		for r := range rounds {
			// Alternate which side goes first, so drift in the machine's
			// load does not favour one.
			if r%2 == 0 {
				with = append(with, noopThroughput(b, withTriggers, jobsPerRound))
				without = append(without, noopThroughput(b, withoutTriggers, jobsPerRound))
			} else {
				without = append(without, noopThroughput(b, withoutTriggers, jobsPerRound))
				with = append(with, noopThroughput(b, withTriggers, jobsPerRound))
			}
		}
	}
	// Other load on the machine only ever slows a round down: the best round
	// of each side is the least disturbed estimate.
	w, wo := maxOf(with), maxOf(without)
	b.ReportMetric(w, "jobs/s")
	b.ReportMetric(wo, "baseline-jobs/s")
	b.ReportMetric(w/wo, "ratio")
	b.ReportMetric(0.95, "target")
	b.Logf("jobs/s with triggers %v, without %v (rounds of %d no-op jobs)", with, without, jobsPerRound)
}

// BenchmarkTaskCancellationTriggerUpdateCost isolates the triggers' cost in
// SQL, without River's client around it: the two UPDATEs every River job
// goes through — fetched (available → running, where the track trigger's
// WHEN looks at the metadata) and completed (running → completed, where the
// untrack trigger's WHEN does) — on 5,000 rows at once, with and without the
// triggers, alternating, best of 21 rounds. Reports ms/run (with),
// baseline-ms/run (without), ratio = ms/run ÷ baseline-ms/run, and target
// 1.10: the ratio must be below it.
func BenchmarkTaskCancellationTriggerUpdateCost(b *testing.B) {
	const (
		rows   = 5_000
		rounds = 21
	)
	ctx := context.Background()
	withTriggers, withoutTriggers := triggerPools(b)
	run := func(pool *pgxpool.Pool) float64 {
		// Fresh rows every round: no dead tuples left by earlier rounds.
		if _, err := pool.Exec(ctx, "TRUNCATE river_job"); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `
			INSERT INTO river_job (args, kind, max_attempts, state, queue, metadata)
			SELECT '{}', 'demo.sleep', 25, 'available', 'default', '{"x": 1}'
			FROM generate_series(1, $1)`, rows); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "VACUUM ANALYZE river_job"); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if _, err := pool.Exec(ctx, "UPDATE river_job SET state = 'running', attempt = attempt + 1, attempted_at = now() WHERE state = 'available'"); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "UPDATE river_job SET state = 'completed', finalized_at = now() WHERE state = 'running'"); err != nil {
			b.Fatal(err)
		}
		return float64(time.Since(start).Microseconds()) / 1000
	}
	var with, without []float64
	for range b.N {
		for r := range rounds {
			if r%2 == 0 {
				with = append(with, run(withTriggers))
				without = append(without, run(withoutTriggers))
			} else {
				without = append(without, run(withoutTriggers))
				with = append(with, run(withTriggers))
			}
		}
	}
	// Other load on the machine only ever adds time: the best round of
	// each side is the least disturbed estimate.
	w, wo := minOf(with), minOf(without)
	b.ReportMetric(w, "ms/run")
	b.ReportMetric(wo, "baseline-ms/run")
	b.ReportMetric(w/wo, "ratio")
	b.ReportMetric(1.10, "target")
	b.Logf("ms per fetch+complete of %d rows with triggers %v, without %v", rows, with, without)
}

// triggerPools returns two fresh databases: one as migrated, one without the
// river_job triggers of cancellation monitoring.
func triggerPools(b *testing.B) (with, without *pgxpool.Pool) {
	b.Helper()
	with, without = testdb.NewPool(b), testdb.NewPool(b)
	for _, trigger := range []string{"sluice_task_cancellation_track", "sluice_task_cancellation_untrack"} {
		if _, err := without.Exec(context.Background(), "DROP TRIGGER "+trigger+" ON river_job"); err != nil {
			b.Fatal(err)
		}
	}
	return with, without
}

// noopThroughput pre-inserts n no-op jobs, then times one River client
// working them all, from its start until the last completion event.
func noopThroughput(b *testing.B, pool *pgxpool.Pool, n int) float64 {
	b.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "TRUNCATE river_job"); err != nil {
		b.Fatal(err)
	}
	params := make([]river.InsertManyParams, n)
	for i := range params {
		params[i] = river.InsertManyParams{Args: jobs.DemoSleepArgs{}}
	}
	inserter, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := inserter.InsertManyFast(ctx, params); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE river_job"); err != nil {
		b.Fatal(err)
	}

	deps, _ := jobtest.NewDeps(b, pool)
	workers := river.NewWorkers()
	if err := jobs.AddWorkers(workers, deps); err != nil {
		b.Fatal(err)
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		FetchCooldown:     time.Millisecond,
		FetchPollInterval: 20 * time.Millisecond,
		Logger:            deps.Logger,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 200}},
		TestOnly:          true,
		WorkerMiddleware:  jobs.Middleware(deps),
		Workers:           workers,
	})
	if err != nil {
		b.Fatal(err)
	}
	events, cancel := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: n + 1000,
		Kinds:    []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed},
	})
	defer cancel()

	start := time.Now()
	if err := client.Start(ctx); err != nil {
		b.Fatal(err)
	}
	timeout := time.After(5 * time.Minute)
	for done := 0; done < n; {
		select {
		case ev := <-events:
			if ev.Kind != river.EventKindJobCompleted {
				b.Fatalf("job %d: %s", ev.Job.ID, ev.Kind)
			}
			done++
		case <-timeout:
			b.Fatalf("%d of %d jobs completed within 5 minutes", done, n)
		}
	}
	elapsed := time.Since(start)
	stopCtx, stop := context.WithTimeout(ctx, 30*time.Second)
	defer stop()
	if err := client.Stop(stopCtx); err != nil {
		b.Fatal(err)
	}
	return float64(n) / elapsed.Seconds()
}

func minOf(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[0]
}

func maxOf(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)-1]
}
