package exports

import (
	"context"
	"fmt"
	"time"

	"github.com/riverqueue/river"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/maintenance"
)

// SettingStuckExportGrace is the dynamic setting (a duration string) of how
// long export.stuck_jobs leaves an export with relation exports alone.
const SettingStuckExportGrace = "export.stuck_jobs.relation_exports_grace"

// DefaultStuckExportGrace is SettingStuckExportGrace's default: GitLab's
// EXPORT_JOBS_EXPIRATION.
const DefaultStuckExportGrace = 6 * time.Hour

// maxDetailIDs caps the ids a run lists in maintenance_runs.details (the
// log line lists them all).
const maxDetailIDs = 100

// StuckJobsArgs are the args of export.stuck_jobs (none).
type StuckJobsArgs struct{}

// Kind is the River job kind.
func (StuckJobsArgs) Kind() string { return "export.stuck_jobs" }

// Validate accepts the empty args.
func (StuckJobsArgs) Validate() error { return nil }

// InsertOpts puts the job on the maintenance queue.
func (StuckJobsArgs) InsertOpts() river.InsertOpts { return maintenance.InsertOpts() }

// StuckJobsWorker works export.stuck_jobs (GitLab's
// StuckExportJobsWorker): it marks failed the exports still queued or
// started whose River job has finished or no longer exists.
//
// The steps, as set-based queries (1 and 2 are one read, a join):
//
//  1. read (job_id, id) of the exports queued or started with a job_id;
//  2. of those River jobs, the "completed" ones: river_job row finalized
//     (completed, cancelled, discarded) or gone (pruned); none: done;
//  3. read those exports again by id, still queued or started and still
//     pointing at the same River job (they may have finished or been
//     re-enqueued since the first read);
//  4. skip an export with relation exports created less than
//     SettingStuckExportGrace ago (a parallel export still assembling);
//  5. mark the rest failed, guarded once more by status and job_id, with
//     their unfinished relation exports; log "Marked stuck export jobs as
//     failed" with their ids and count them.
//
// An export whose River job is available, scheduled, retryable, pending or
// running is never touched.
type StuckJobsWorker struct {
	river.WorkerDefaults[StuckJobsArgs]
	deps *deps
}

// Timeout bounds the run.
func (w *StuckJobsWorker) Timeout(*river.Job[StuckJobsArgs]) time.Duration {
	return w.deps.maintenanceTimeout()
}

// Work runs the sweep under the maintenance-run framework.
func (w *StuckJobsWorker) Work(ctx context.Context, job *river.Job[StuckJobsArgs]) error {
	return w.deps.runner.Run(ctx, job.JobRow, func(ctx context.Context) (maintenance.Result, error) {
		return w.deps.sweepStuckExports(ctx, nil)
	})
}

// sweepStuckExports is export.stuck_jobs' run; betweenReads, if set, is
// called between the first read (steps 1 and 2) and the second (step 3), for
// tests.
func (d *deps) sweepStuckExports(ctx context.Context, betweenReads func(context.Context) error) (maintenance.Result, error) {
	grace, err := d.Settings.Duration(ctx, SettingStuckExportGrace, DefaultStuckExportGrace)
	if err != nil {
		return maintenance.Result{}, err
	}
	// step_ms: how long each step took, for operators and the benchmark.
	stepMS := map[string]float64{}
	details := map[string]any{"grace": grace.String(), "step_ms": stepMS}
	res := maintenance.Result{Details: details}
	start := time.Now()
	lap := func(step string) {
		now := time.Now()
		stepMS[step] = float64(now.Sub(start).Microseconds()) / 1000
		start = now
	}

	// One READ COMMITTED transaction: each statement still sees what was
	// committed before it (so the second read sees exports that finished
	// since the first), and the plan setting stays local to the sweep.
	tx, err := d.Pool.Begin(ctx)
	if err != nil {
		return res, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after Commit
	q := d.Queries.WithTx(tx)
	if err := q.StuckExportForceCustomPlans(ctx); err != nil {
		return res, fmt.Errorf("plan settings: %w", err)
	}

	// 1 and 2. Exports in progress whose River job is done, in one read.
	candidates, err := q.StuckExportCandidates(ctx)
	if err != nil {
		return res, fmt.Errorf("read exports in progress and their River jobs: %w", err)
	}
	lap("1_2_read")
	details["in_progress"] = candidates.InProgress
	details["river_job_done"] = len(candidates.Ids)
	if len(candidates.Ids) == 0 {
		return res, nil
	}
	ids, jobIDs := candidates.Ids, candidates.JobIds

	if betweenReads != nil {
		if err := betweenReads(ctx); err != nil {
			return res, err
		}
		start = time.Now()
	}

	// 3. The second read, with step 4's grace test.
	rechecked, err := q.StuckExportRecheck(ctx, db.StuckExportRecheckParams{
		GraceSeconds: grace.Seconds(), Ids: ids, JobIds: jobIDs,
	})
	if err != nil {
		return res, fmt.Errorf("read exports again: %w", err)
	}
	lap("3_reread")
	details["still_in_progress"] = len(rechecked)

	// 4. Parallel exports within their grace period.
	ids, jobIDs = ids[:0], jobIDs[:0]
	var skipped []int64
	for _, r := range rechecked {
		if r.InGrace {
			skipped = append(skipped, r.ID)
			continue
		}
		ids = append(ids, r.ID)
		jobIDs = append(jobIDs, r.JobID)
	}
	details["skipped_in_grace"] = len(skipped)
	if len(skipped) > 0 {
		d.Logger.Info("Stuck export jobs with relation exports left alone within their grace period",
			"export_job_ids", capIDs(skipped), "grace", grace.String())
	}
	if len(ids) == 0 {
		return res, nil
	}

	// 5. Fail the rest.
	failed, err := q.StuckExportFail(ctx, db.StuckExportFailParams{Ids: ids, JobIds: jobIDs})
	if err != nil {
		return res, fmt.Errorf("mark stuck exports failed: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return res, fmt.Errorf("commit: %w", err)
	}
	lap("5_fail")
	res.Affected = int64(len(failed))
	if len(failed) == 0 {
		return res, nil
	}
	failedIDs := make([]int64, len(failed))
	failedJobIDs := make([]int64, len(failed))
	for i, f := range failed {
		failedIDs[i], failedJobIDs[i] = f.ID, f.JobID
	}
	details["failed_export_job_ids"] = capIDs(failedIDs)
	d.Metrics.StuckFailed.Add(float64(len(failed)))
	d.Logger.Info("Marked stuck export jobs as failed",
		"count", len(failed), "export_job_ids", failedIDs, "job_ids", failedJobIDs)
	return res, nil
}

// capIDs returns at most maxDetailIDs of ids, for logs and details.
func capIDs(ids []int64) []int64 {
	if len(ids) > maxDetailIDs {
		return ids[:maxDetailIDs]
	}
	return ids
}
