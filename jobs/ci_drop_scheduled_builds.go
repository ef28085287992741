package jobs

import (
	"context"
	"time"

	"github.com/riverqueue/river"

	"github.com/sluice-dev/sluice/db"
)

// CIDropScheduledBuildsTimeoutSetting is the dynamic setting (a Go duration string)
// that decides how old a build must be before ci.drop_scheduled_builds fails it.
const CIDropScheduledBuildsTimeoutSetting = "ci.drop_scheduled_builds.timeout"

// DefaultCIDropScheduledBuildsTimeout is the default of CIDropScheduledBuildsTimeoutSetting
// (1 hour).
const DefaultCIDropScheduledBuildsTimeout = time.Hour

// CIDropScheduledBuildsArgs are the args of ci.drop_scheduled_builds: none.
type CIDropScheduledBuildsArgs struct{}

// Kind is the River job kind.
func (CIDropScheduledBuildsArgs) Kind() string { return "ci.drop_scheduled_builds" }

// Validate accepts the only possible value, {}.
func (CIDropScheduledBuildsArgs) Validate() error { return nil }

// InsertOpts puts the job in the maintenance queue.
func (CIDropScheduledBuildsArgs) InsertOpts() river.InsertOpts { return MaintenanceInsertOpts() }

// CIDropScheduledBuildsWorker works ci.drop_scheduled_builds: under the maintenance framework it
// fails scheduled builds whose time passed long ago (Ci::StuckBuilds::DropScheduledService): status scheduled with scheduled_at older than the timeout.
type CIDropScheduledBuildsWorker struct {
	river.WorkerDefaults[CIDropScheduledBuildsArgs]
	deps *Deps
}

// Timeout bounds a run by the maintenance timeout.
func (w *CIDropScheduledBuildsWorker) Timeout(*river.Job[CIDropScheduledBuildsArgs]) time.Duration {
	return w.deps.maintenanceTimeout()
}

// Work runs one sweep.
func (w *CIDropScheduledBuildsWorker) Work(ctx context.Context, job *river.Job[CIDropScheduledBuildsArgs]) error {
	return w.deps.RunMaintenance(ctx, job.JobRow, func(ctx context.Context) (MaintenanceResult, error) {
		return w.deps.sweepStuckBuilds(ctx, ciDropScheduledBuildsSweep())
	})
}

func ciDropScheduledBuildsSweep() *stuckBuildsSweep {
	return &stuckBuildsSweep{
		kind:           CIDropScheduledBuildsArgs{}.Kind(),
		status:         "scheduled",
		failureReason:  FailureReasonStaleSchedule,
		logMessage:     "Cleaning scheduled, timed-out builds",
		timeoutSetting: CIDropScheduledBuildsTimeoutSetting,
		defaultTimeout: DefaultCIDropScheduledBuildsTimeout,
		createdAt:      false,
		updatedAt:      false,
		scheduledAt:    true,
		selectBatch: func(ctx context.Context, q *db.Queries, cutoff time.Time, after *db.CiBuild, limit int32) ([]*db.CiBuild, error) {
			createdAt, projectID, id := keyset(after)
			return q.SelectStuckScheduledBuilds(ctx, db.SelectStuckScheduledBuildsParams{
				Cutoff: cutoff, AfterCreatedAt: createdAt, AfterProjectID: projectID, AfterID: id, BatchSize: limit,
			})
		},
	}
}
