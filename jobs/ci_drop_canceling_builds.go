package jobs

import (
	"context"
	"time"

	"github.com/riverqueue/river"

	"github.com/sluice-dev/sluice/db"
)

// CIDropCancelingBuildsTimeoutSetting is the dynamic setting (a Go duration string)
// that decides how old a build must be before ci.drop_canceling_builds fails it.
const CIDropCancelingBuildsTimeoutSetting = "ci.drop_canceling_builds.timeout"

// DefaultCIDropCancelingBuildsTimeout is the default of CIDropCancelingBuildsTimeoutSetting
// (1 hour).
const DefaultCIDropCancelingBuildsTimeout = time.Hour

// CIDropCancelingBuildsArgs are the args of ci.drop_canceling_builds: none.
type CIDropCancelingBuildsArgs struct{}

// Kind is the River job kind.
func (CIDropCancelingBuildsArgs) Kind() string { return "ci.drop_canceling_builds" }

// Validate accepts the only possible value, {}.
func (CIDropCancelingBuildsArgs) Validate() error { return nil }

// InsertOpts puts the job in the maintenance queue.
func (CIDropCancelingBuildsArgs) InsertOpts() river.InsertOpts { return MaintenanceInsertOpts() }

// CIDropCancelingBuildsWorker works ci.drop_canceling_builds: under the maintenance framework it
// fails builds stuck in canceling (Ci::StuckBuilds::DropCancelingService): status canceling with created_at and updated_at both older than the timeout.
type CIDropCancelingBuildsWorker struct {
	river.WorkerDefaults[CIDropCancelingBuildsArgs]
	deps *Deps
}

// Timeout bounds a run by the maintenance timeout.
func (w *CIDropCancelingBuildsWorker) Timeout(*river.Job[CIDropCancelingBuildsArgs]) time.Duration {
	return w.deps.maintenanceTimeout()
}

// Work runs one sweep.
func (w *CIDropCancelingBuildsWorker) Work(ctx context.Context, job *river.Job[CIDropCancelingBuildsArgs]) error {
	return w.deps.RunMaintenance(ctx, job.JobRow, func(ctx context.Context) (MaintenanceResult, error) {
		return w.deps.sweepStuckBuilds(ctx, ciDropCancelingBuildsSweep())
	})
}

func ciDropCancelingBuildsSweep() *stuckBuildsSweep {
	return &stuckBuildsSweep{
		kind:           CIDropCancelingBuildsArgs{}.Kind(),
		status:         "canceling",
		failureReason:  FailureReasonStuckOrTimeout,
		logMessage:     "Cleaning canceling, timed-out builds",
		timeoutSetting: CIDropCancelingBuildsTimeoutSetting,
		defaultTimeout: DefaultCIDropCancelingBuildsTimeout,
		createdAt:      true,
		updatedAt:      true,
		scheduledAt:    false,
		selectBatch: func(ctx context.Context, q *db.Queries, cutoff time.Time, after *db.CiBuild, limit int32) ([]*db.CiBuild, error) {
			createdAt, projectID, id := keyset(after)
			return q.SelectStuckCancelingBuilds(ctx, db.SelectStuckCancelingBuildsParams{
				Cutoff: cutoff, AfterCreatedAt: createdAt, AfterProjectID: projectID, AfterID: id, BatchSize: limit,
			})
		},
	}
}
