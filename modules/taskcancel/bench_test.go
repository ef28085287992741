package taskcancel_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
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
				with = append(with, jobtest.NoopThroughput(b, withTriggers, jobsPerRound, nil))
				without = append(without, jobtest.NoopThroughput(b, withoutTriggers, jobsPerRound, nil))
			} else {
				without = append(without, jobtest.NoopThroughput(b, withoutTriggers, jobsPerRound, nil))
				with = append(with, jobtest.NoopThroughput(b, withTriggers, jobsPerRound, nil))
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
