package cibuilds_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/maintenance"
	"github.com/sluice-dev/sluice/modules/cibuilds"
)

// BenchmarkDropCancelingBuilds times one ci.drop_canceling_builds run (the
// maintenance framework, 100 batches of 100 builds with optimistic locking)
// on 1,000,000 ci_builds of which 10,000 are stuck in canceling, against the
// floor: one set-based UPDATE of the same rows. The rows are reset (and the
// table vacuumed and checkpointed) before each measurement; five rounds
// alternate the two, and the fastest of each is reported.
//
// Reported: ms/run (the sweep), baseline-ms/run (the set-based UPDATE),
// ratio = ms/run / baseline-ms/run, and target = 1.5 (P5): the ratio must be
// at or below the target. It also EXPLAINs every batch select the sweep ran (custom
// and generic plan) and fails unless each is an index scan of
// ci_builds_canceling_sweep_idx; the first plan is logged.
func BenchmarkDropCancelingBuilds(b *testing.B) {
	const (
		kind   = "ci.drop_canceling_builds"
		total  = 1_000_000
		stuck  = 10_000
		rounds = 5
		target = 1.5
	)
	ctx := context.Background()
	url := testdb.New(b)
	pool, selects := tracedPool(b, url, "-- name: SelectStuckCancelingBuilds")
	deps := newSweepEnv(b, pool)

	exec := func(sql string, args ...any) int64 {
		tag, err := pool.Exec(ctx, sql, args...)
		require.NoError(b, err, sql)
		return tag.RowsAffected()
	}
	// Every 100th build is stuck in canceling; every 100th + 3 is canceling
	// but fresh, + 4 canceling for long but updated recently; a few are in
	// flight; the rest are finished.
	start := time.Now()
	exec(`
		INSERT INTO ci_builds (project_id, pipeline_id, runner_id, name, stage, status, failure_reason,
		                       created_at, updated_at, started_at, finished_at)
		SELECT g % 5000, g / 10, g % 300, 'rspec ' || (g % 40), 'test', s.status,
		       CASE WHEN s.status = 'failed' THEN 'script_failure' END,
		       s.created_at, s.updated_at, s.created_at,
		       CASE WHEN s.status IN ('success', 'failed', 'canceled') THEN s.updated_at END
		FROM generate_series(1, $1::int) AS g,
		LATERAL (SELECT
		    CASE g % 100 WHEN 0 THEN 'canceling' WHEN 1 THEN 'running' WHEN 2 THEN 'pending'
		                 WHEN 3 THEN 'canceling' WHEN 4 THEN 'canceling' WHEN 5 THEN 'failed'
		                 WHEN 6 THEN 'canceled' ELSE 'success' END AS status,
		    CASE WHEN g % 100 IN (1, 2, 3) THEN now() - interval '10 minutes'
		         ELSE now() - interval '30 days' + g * interval '2 seconds' END AS created_at,
		    CASE WHEN g % 100 IN (1, 2, 3, 4) THEN now() - interval '5 minutes'
		         ELSE now() - interval '30 days' + g * interval '2 seconds' + interval '1 minute' END AS updated_at
		) AS s`, total)
	exec("VACUUM ANALYZE ci_builds")
	b.Logf("setup: %d builds in %s", total, time.Since(start).Round(time.Millisecond))

	reset := func() {
		exec(`
			UPDATE ci_builds
			SET status = 'canceling', failure_reason = NULL, finished_at = NULL,
			    updated_at = created_at + interval '1 minute', lock_version = 0
			WHERE id % 100 = 0 AND status <> 'canceling'`)
		exec("VACUUM ANALYZE ci_builds")
		_, _ = pool.Exec(ctx, "CHECKPOINT") // needs a privileged role; fine without
	}
	setBased := func() time.Duration {
		reset()
		start := time.Now()
		n := exec(`
			UPDATE ci_builds
			SET status = 'failed', failure_reason = 'stuck_or_timeout_failure',
			    finished_at = COALESCE(finished_at, now()), updated_at = now(),
			    lock_version = lock_version + 1
			WHERE status = 'canceling'
			  AND created_at < now() - interval '1 hour' AND updated_at < now() - interval '1 hour'`)
		elapsed := time.Since(start)
		require.EqualValues(b, stuck, n)
		return elapsed
	}
	sweep := func() time.Duration {
		reset()
		selects.take()
		start := time.Now()
		run, details, err := sweepOnce(b, ctx, deps, kind)
		elapsed := time.Since(start)
		require.NoError(b, err)
		require.Equal(b, maintenance.RunSucceeded, run.Status)
		require.EqualValues(b, stuck, details["dropped"])
		require.EqualValues(b, stuck/cibuilds.StuckBuildsBatchSize, details["batches"])
		return elapsed
	}

	var sweeps, floors []time.Duration
	var plans []string
	b.ResetTimer()
	for round := range rounds {
		floors = append(floors, setBased())
		sweeps = append(sweeps, sweep())
		if round == 0 {
			plans = checkSelectPlans(b, pool, selects.take())
		}
	}
	b.StopTimer()

	best, floor := slices.Min(sweeps), slices.Min(floors)
	b.Logf("sweep runs %v, set-based UPDATEs %v", sweeps, floors)
	for _, plan := range plans {
		b.Log(plan)
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(best), "ms/run")
	b.ReportMetric(ms(floor), "baseline-ms/run")
	b.ReportMetric(ms(best)/ms(floor), "ratio")
	b.ReportMetric(target, "target")
	b.ReportMetric(float64(stuck)/best.Seconds(), "builds/s")
}

// checkSelectPlans EXPLAINs each batch select of a run and fails unless every
// plan is an index scan of ci_builds_canceling_sweep_idx. It returns the
// plans of the first and the last select, for the log.
func checkSelectPlans(b *testing.B, pool *pgxpool.Pool, queries []tracedQuery) []string {
	b.Helper()
	var out []string
	require.Len(b, queries, 101, "100 batches and the empty select that ends the run")
	for i, q := range queries {
		custom, generic := explain(b, pool, q)
		for _, plan := range []string{custom, generic} {
			require.Contains(b, plan, "Index Scan using ci_builds_canceling_sweep_idx on ci_builds", plan)
			require.NotContains(b, plan, "Seq Scan", plan)
		}
		if i == 0 || i == len(queries)-1 {
			out = append(out,
				fmt.Sprintf("plan of batch select %d (custom):\n%s", i+1, indent(custom)),
				fmt.Sprintf("plan of batch select %d (generic):\n%s", i+1, indent(generic)))
		}
	}
	return out
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(s, "\n", "\n    ")
}
