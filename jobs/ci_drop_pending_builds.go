package jobs

import (
	"context"
	"time"

	"github.com/riverqueue/river"

	"github.com/sluice-dev/sluice/db"
)

// CIDropPendingBuildsTimeoutSetting is the dynamic setting (a Go duration string)
// that decides how old a build must be before ci.drop_pending_builds fails it.
const CIDropPendingBuildsTimeoutSetting = "ci.drop_pending_builds.timeout"

// DefaultCIDropPendingBuildsTimeout is the default of CIDropPendingBuildsTimeoutSetting
// (1 day).
const DefaultCIDropPendingBuildsTimeout = 24 * time.Hour

// CIDropPendingBuildsArgs are the args of ci.drop_pending_builds: none.
type CIDropPendingBuildsArgs struct{}

// Kind is the River job kind.
func (CIDropPendingBuildsArgs) Kind() string { return "ci.drop_pending_builds" }

// Validate accepts the only possible value, {}.
func (CIDropPendingBuildsArgs) Validate() error { return nil }

// InsertOpts puts the job in the maintenance queue.
func (CIDropPendingBuildsArgs) InsertOpts() river.InsertOpts { return MaintenanceInsertOpts() }

// CIDropPendingBuildsWorker works ci.drop_pending_builds: under the maintenance framework it
// fails builds stuck in pending (Ci::StuckBuilds::DropPendingService): status pending with created_at and updated_at both older than the timeout.
type CIDropPendingBuildsWorker struct {
	river.WorkerDefaults[CIDropPendingBuildsArgs]
	deps *Deps
}

// Timeout bounds a run by the maintenance timeout.
func (w *CIDropPendingBuildsWorker) Timeout(*river.Job[CIDropPendingBuildsArgs]) time.Duration {
	return w.deps.maintenanceTimeout()
}

// Work runs one sweep.
func (w *CIDropPendingBuildsWorker) Work(ctx context.Context, job *river.Job[CIDropPendingBuildsArgs]) error {
	return w.deps.RunMaintenance(ctx, job.JobRow, func(ctx context.Context) (MaintenanceResult, error) {
		return w.deps.sweepStuckBuilds(ctx, ciDropPendingBuildsSweep())
	})
}

func ciDropPendingBuildsSweep() *stuckBuildsSweep {
	return &stuckBuildsSweep{
		kind:           CIDropPendingBuildsArgs{}.Kind(),
		status:         "pending",
		failureReason:  FailureReasonStuckOrTimeout,
		logMessage:     "Cleaning pending timed-out builds",
		timeoutSetting: CIDropPendingBuildsTimeoutSetting,
		defaultTimeout: DefaultCIDropPendingBuildsTimeout,
		createdAt:      true,
		updatedAt:      true,
		scheduledAt:    false,
		selectBatch: func(ctx context.Context, q *db.Queries, cutoff time.Time, after *db.CiBuild, limit int32) ([]*db.CiBuild, error) {
			createdAt, projectID, id := keyset(after)
			return q.SelectStuckPendingBuilds(ctx, db.SelectStuckPendingBuildsParams{
				Cutoff: cutoff, AfterCreatedAt: createdAt, AfterProjectID: projectID, AfterID: id, BatchSize: limit,
			})
		},
	}
}
