package cibuilds

import (
	"context"
	"time"

	"github.com/riverqueue/river"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/maintenance"
)

// The four sweeps, one per stuck status (GitLab's
// Ci::StuckBuilds::Drop{Canceling,Running,Scheduled,Pending}Service). Each
// is a maintenance kind with args {} and a timeout setting (a Go duration
// string) that decides how old a build must be before it is failed; one
// engine (Sweeper) and one generic worker run them all. Each keeps a select
// query of its own: its status is a constant in the query, so that the
// status's partial index is used by every plan, custom or generic (a
// parameter would not match the index's predicate).
var (
	// Canceling fails builds in canceling whose created_at and updated_at
	// are both older than its timeout.
	Canceling = &Sweep{
		Kind: DropCancelingBuildsArgs{}.Kind(), Status: "canceling",
		FailureReason: FailureReasonStuckOrTimeout, logMessage: "Cleaning canceling, timed-out builds",
		TimeoutSetting: "ci.drop_canceling_builds.timeout", DefaultTimeout: time.Hour,
		createdAt: true, updatedAt: true,
		selectBatch: func(ctx context.Context, q *db.Queries, cutoff time.Time, after *db.CiBuild, limit int32) ([]*db.CiBuild, error) {
			createdAt, projectID, id := keyset(after)
			return q.SelectStuckCancelingBuilds(ctx, db.SelectStuckCancelingBuildsParams{
				Cutoff: cutoff, AfterCreatedAt: createdAt, AfterProjectID: projectID, AfterID: id, BatchSize: limit,
			})
		},
	}
	// Running fails builds in running whose updated_at is older than its
	// timeout.
	Running = &Sweep{
		Kind: DropRunningBuildsArgs{}.Kind(), Status: "running",
		FailureReason: FailureReasonStuckOrTimeout, logMessage: "Cleaning running, timed-out builds",
		TimeoutSetting: "ci.drop_running_builds.timeout", DefaultTimeout: time.Hour,
		updatedAt: true,
		selectBatch: func(ctx context.Context, q *db.Queries, cutoff time.Time, after *db.CiBuild, limit int32) ([]*db.CiBuild, error) {
			createdAt, projectID, id := keyset(after)
			return q.SelectStuckRunningBuilds(ctx, db.SelectStuckRunningBuildsParams{
				Cutoff: cutoff, AfterCreatedAt: createdAt, AfterProjectID: projectID, AfterID: id, BatchSize: limit,
			})
		},
	}
	// Scheduled fails scheduled builds whose scheduled_at is older than its
	// timeout (stale_schedule).
	Scheduled = &Sweep{
		Kind: DropScheduledBuildsArgs{}.Kind(), Status: "scheduled",
		FailureReason: FailureReasonStaleSchedule, logMessage: "Cleaning scheduled, timed-out builds",
		TimeoutSetting: "ci.drop_scheduled_builds.timeout", DefaultTimeout: time.Hour,
		scheduledAt: true,
		selectBatch: func(ctx context.Context, q *db.Queries, cutoff time.Time, after *db.CiBuild, limit int32) ([]*db.CiBuild, error) {
			createdAt, projectID, id := keyset(after)
			return q.SelectStuckScheduledBuilds(ctx, db.SelectStuckScheduledBuildsParams{
				Cutoff: cutoff, AfterCreatedAt: createdAt, AfterProjectID: projectID, AfterID: id, BatchSize: limit,
			})
		},
	}
	// Pending fails builds in pending whose created_at and updated_at are
	// both older than its timeout.
	Pending = &Sweep{
		Kind: DropPendingBuildsArgs{}.Kind(), Status: "pending",
		FailureReason: FailureReasonStuckOrTimeout, logMessage: "Cleaning pending timed-out builds",
		TimeoutSetting: "ci.drop_pending_builds.timeout", DefaultTimeout: 24 * time.Hour,
		createdAt: true, updatedAt: true,
		selectBatch: func(ctx context.Context, q *db.Queries, cutoff time.Time, after *db.CiBuild, limit int32) ([]*db.CiBuild, error) {
			createdAt, projectID, id := keyset(after)
			return q.SelectStuckPendingBuilds(ctx, db.SelectStuckPendingBuildsParams{
				Cutoff: cutoff, AfterCreatedAt: createdAt, AfterProjectID: projectID, AfterID: id, BatchSize: limit,
			})
		},
	}
)

// Sweeps lists the four sweeps.
func Sweeps() []*Sweep { return []*Sweep{Canceling, Running, Scheduled, Pending} }

// SweepOf returns the sweep of kind, or nil.
func SweepOf(kind string) *Sweep {
	for _, s := range Sweeps() {
		if s.Kind == kind {
			return s
		}
	}
	return nil
}

// DropCancelingBuildsArgs are the args of ci.drop_canceling_builds: none.
type DropCancelingBuildsArgs struct{ maintenanceArgs }

// Kind is the River job kind.
func (DropCancelingBuildsArgs) Kind() string { return "ci.drop_canceling_builds" }

// DropRunningBuildsArgs are the args of ci.drop_running_builds: none.
type DropRunningBuildsArgs struct{ maintenanceArgs }

// Kind is the River job kind.
func (DropRunningBuildsArgs) Kind() string { return "ci.drop_running_builds" }

// DropScheduledBuildsArgs are the args of ci.drop_scheduled_builds: none.
type DropScheduledBuildsArgs struct{ maintenanceArgs }

// Kind is the River job kind.
func (DropScheduledBuildsArgs) Kind() string { return "ci.drop_scheduled_builds" }

// DropPendingBuildsArgs are the args of ci.drop_pending_builds: none.
type DropPendingBuildsArgs struct{ maintenanceArgs }

// Kind is the River job kind.
func (DropPendingBuildsArgs) Kind() string { return "ci.drop_pending_builds" }

// maintenanceArgs gives the sweeps' args their insert options.
type maintenanceArgs struct{}

// InsertOpts puts the job in the maintenance queue.
func (maintenanceArgs) InsertOpts() river.InsertOpts { return maintenance.InsertOpts() }

// sweepWorker works the kind of one sweep, under the maintenance framework.
type sweepWorker[T river.JobArgs] struct {
	river.WorkerDefaults[T]
	sweeper *Sweeper
	sweep   *Sweep
	runner  *maintenance.Runner
}

// Timeout bounds a run by the maintenance timeout.
func (w *sweepWorker[T]) Timeout(*river.Job[T]) time.Duration { return w.runner.Timeout() }

// Work runs one sweep.
func (w *sweepWorker[T]) Work(ctx context.Context, job *river.Job[T]) error {
	return w.runner.Run(ctx, job.JobRow, func(ctx context.Context) (maintenance.Result, error) {
		return w.sweeper.Sweep(ctx, w.sweep)
	})
}

// addSweepWorker adds the worker of sweep, whose args type is T.
func addSweepWorker[T river.JobArgs](workers *river.Workers, sweeper *Sweeper, sweep *Sweep, runner *maintenance.Runner) error {
	return river.AddWorkerSafely(workers, &sweepWorker[T]{sweeper: sweeper, sweep: sweep, runner: runner})
}
