package exports_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/modules/exports"
)

// stuckExportFloorSQL is the floor: one hand-written statement that does
// what one export.stuck_jobs run does, finding the stuck exports and marking
// them failed with their unfinished relation exports, and returns their ids.
const stuckExportFloorSQL = `
WITH stuck AS (
    SELECT e.id
    FROM project_export_jobs e
    LEFT JOIN river_job r ON r.id = e.job_id
    WHERE e.status IN ('queued', 'started') AND e.job_id IS NOT NULL
      AND (r.id IS NULL OR r.state IN ('completed', 'cancelled', 'discarded'))
      AND NOT (e.created_at > now() - interval '6 hours'
               AND EXISTS (SELECT 1 FROM project_relation_exports re WHERE re.project_export_job_id = e.id))
), failed AS (
    UPDATE project_export_jobs e
    SET status = 'failed', error = 'stuck: floor', finished_at = now(), updated_at = now()
    FROM stuck WHERE e.id = stuck.id
    RETURNING e.id
), relations AS (
    UPDATE project_relation_exports re
    SET status = 'failed', error = 'stuck: the export failed', updated_at = now()
    WHERE re.project_export_job_id IN (SELECT id FROM failed) AND re.status IN ('queued', 'started')
)
SELECT id FROM failed ORDER BY id`

// BenchmarkExportStuckJobs times one export.stuck_jobs run (through the
// worker and the maintenance framework: lock, journal, five steps) over
// 100,000 exports in progress of which 1,000 are stuck (and 1,000 more have
// a finished River job but are parallel exports within their grace period),
// against the floor: one statement that finds the same 1,000 exports and
// marks them failed with their relation exports (the same writes; the rows
// are reset after each side). Each figure is the median of 5 repetitions;
// stepN_*-ms are the run's own step timings (maintenance_runs.details.step_ms).
// ratio = ms/run / floor-ms/run; the target (P6) is ratio <= 1.5.
func BenchmarkExportStuckJobs(b *testing.B) {
	const (
		active = 100_000
		stuck  = 1_000
		reps   = 5
	)
	ctx := context.Background()
	pool := testdb.NewPool(b)
	deps, err := exports.NewTestDeps(pool, jobtest.Logger(b), nil)
	if err != nil {
		b.Fatal(err)
	}
	seedStuckExportBench(b, pool, active)
	worker := deps.StuckJobsWorker()

	floor := func() []int64 {
		rows, err := pool.Query(ctx, stuckExportFloorSQL)
		if err != nil {
			b.Fatal(err)
		}
		defer rows.Close()
		var ids []int64
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				b.Fatal(err)
			}
			ids = append(ids, id)
		}
		if err := rows.Err(); err != nil {
			b.Fatal(err)
		}
		return ids
	}
	jobID := int64(1 << 40)
	steps := map[string][]time.Duration{}
	run := func() {
		jobID++
		job := &river.Job[exports.StuckJobsArgs]{JobRow: &rivertype.JobRow{ID: jobID, Kind: "export.stuck_jobs"}}
		if err := worker.Work(ctx, job); err != nil {
			b.Fatal(err)
		}
	}
	recordSteps := func() {
		var details struct {
			StepMS map[string]float64 `json:"step_ms"`
		}
		var raw []byte
		if err := pool.QueryRow(ctx, "SELECT details FROM maintenance_runs WHERE job_id = $1", jobID).Scan(&raw); err != nil {
			b.Fatal(err)
		}
		if err := json.Unmarshal(raw, &details); err != nil {
			b.Fatal(err)
		}
		for step, ms := range details.StepMS {
			steps[step] = append(steps[step], time.Duration(ms*float64(time.Millisecond)))
		}
	}
	failedIDs := func() []int64 {
		rows, err := pool.Query(ctx, "SELECT id FROM project_export_jobs WHERE status = 'failed' AND error LIKE 'stuck:%' ORDER BY id")
		if err != nil {
			b.Fatal(err)
		}
		defer rows.Close()
		var ids []int64
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				b.Fatal(err)
			}
			ids = append(ids, id)
		}
		return ids
	}
	reset := func() {
		if _, err := pool.Exec(ctx, `
			WITH e AS (
				UPDATE project_export_jobs SET status = 'started', error = NULL, finished_at = NULL
				WHERE status = 'failed' AND error LIKE 'stuck:%' RETURNING id
			)
			UPDATE project_relation_exports SET status = 'started', error = NULL
			WHERE project_export_job_id IN (SELECT id FROM e)`); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "VACUUM ANALYZE project_export_jobs, project_relation_exports"); err != nil {
			b.Fatal(err)
		}
	}

	// Warm-up, and both sides mark the same rows.
	want := floor()
	if len(want) != stuck {
		b.Fatalf("floor found %d stuck exports, want %d", len(want), stuck)
	}
	if got := failedIDs(); !slices.Equal(got, want) {
		b.Fatalf("the floor marked %d exports failed, it returned %d (or other ids)", len(got), len(want))
	}
	reset()
	run()
	if got := failedIDs(); !slices.Equal(got, want) {
		b.Fatalf("the run failed %d exports, the floor finds %d (or other ids)", len(got), len(want))
	}
	reset()

	var runTimes, floorTimes []time.Duration
	b.ResetTimer()
	for range b.N {
		for range reps {
			start := time.Now()
			floor()
			floorTimes = append(floorTimes, time.Since(start))
			b.StopTimer()
			reset()
			b.StartTimer()

			start = time.Now()
			run()
			runTimes = append(runTimes, time.Since(start))
			b.StopTimer()
			recordSteps()
			reset()
			b.StartTimer()
		}
	}
	b.StopTimer()
	runMS := jobtest.Median(runTimes).Seconds() * 1000
	floorMS := jobtest.Median(floorTimes).Seconds() * 1000
	b.ReportMetric(runMS, "ms/run")
	b.ReportMetric(floorMS, "floor-ms/run")
	b.ReportMetric(runMS/floorMS, "ratio")
	b.ReportMetric(1.5, "target")
	for step, ds := range steps {
		// e.g. step1_read-ms: the share of each step in ms/run.
		b.ReportMetric(jobtest.Median(ds).Seconds()*1000, "step"+step+"-ms")
	}
	b.ReportMetric(active, "exports")
	b.ReportMetric(stuck, "stuck")
}

// seedStuckExportBench inserts n exports in progress, each with its River
// job: i % 100 == 0 are stuck (River job finalized, or pruned when
// i % 400 == 0; parallel, 12 hours old), i % 100 == 50 have a finalized
// River job but are parallel exports 1 hour old (within the grace period),
// the rest have River jobs that are available, scheduled, retryable, pending
// or running. Every tenth export is parallel (two relation exports), and
// 50,000 finished exports of the past sit beside them.
func seedStuckExportBench(b *testing.B, pool *pgxpool.Pool, n int) {
	b.Helper()
	ctx := context.Background()
	for _, sql := range []string{
		`WITH src AS (
			SELECT i,
			       CASE WHEN i % 100 IN (0, 50) THEN (ARRAY['completed', 'cancelled', 'discarded'])[1 + (i / 100) % 3]
			            ELSE (ARRAY['running', 'running', 'available', 'scheduled', 'retryable', 'pending'])[1 + i % 6]
			       END::river_job_state AS state
			FROM generate_series(1, $1::int) i
		), rj AS (
			INSERT INTO river_job (kind, args, state, max_attempts, queue, attempt, scheduled_at, finalized_at)
			SELECT 'export.project', jsonb_build_object('export_job_id', i), state, 3, 'bench', 1,
			       now() + CASE WHEN state IN ('scheduled', 'retryable') THEN interval '1 hour' ELSE interval '0' END,
			       CASE WHEN state IN ('completed', 'cancelled', 'discarded') THEN now() END
			FROM src
			RETURNING id, (args->>'export_job_id')::int AS i
		)
		INSERT INTO project_export_jobs (project_id, job_id, status, parallel, created_at, updated_at)
		SELECT 1 + i % 500,
		       CASE WHEN i % 400 = 0 THEN id + 1000000000 ELSE id END,
		       CASE WHEN i % 2 = 0 THEN 'started' ELSE 'queued' END,
		       i % 10 = 0,
		       now() - CASE WHEN i % 100 = 0 THEN interval '12 hours'
		                    WHEN i % 100 = 50 THEN interval '1 hour'
		                    ELSE make_interval(mins => i % 600) END,
		       now()
		FROM rj`,
		`INSERT INTO project_export_jobs (project_id, job_id, status, created_at, finished_at)
		 SELECT 1 + i % 500, 2000000000 + i, 'finished', now() - interval '30 days', now() - interval '30 days'
		 FROM generate_series(1, $1::int / 2) i`,
	} {
		if _, err := pool.Exec(ctx, sql, n); err != nil {
			b.Fatalf("seed: %v", err)
		}
	}
	for _, sql := range []string{
		`INSERT INTO project_relation_exports (project_export_job_id, relation, status)
		 SELECT e.id, r, 'started' FROM project_export_jobs e, unnest(ARRAY['project', 'ci_builds']) r WHERE e.parallel`,
		`VACUUM ANALYZE river_job, project_export_jobs, project_relation_exports`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			b.Fatalf("seed: %v", err)
		}
	}
}
