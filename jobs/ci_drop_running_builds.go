package jobs

import (
	"context"
	"time"

	"github.com/riverqueue/river"

	"github.com/sluice-dev/sluice/db"
)

// CIDropRunningBuildsTimeoutSetting is the dynamic setting (a Go duration string)
// that decides how old a build must be before ci.drop_running_builds fails it.
const CIDropRunningBuildsTimeoutSetting = "ci.drop_running_builds.timeout"

// DefaultCIDropRunningBuildsTimeout is the default of CIDropRunningBuildsTimeoutSetting
// (1 hour).
const DefaultCIDropRunningBuildsTimeout = time.Hour

// CIDropRunningBuildsArgs are the args of ci.drop_running_builds: none.
type CIDropRunningBuildsArgs struct{}

// Kind is the River job kind.
func (CIDropRunningBuildsArgs) Kind() string { return "ci.drop_running_builds" }

// Validate accepts the only possible value, {}.
func (CIDropRunningBuildsArgs) Validate() error { return nil }

// InsertOpts puts the job in the maintenance queue.
func (CIDropRunningBuildsArgs) InsertOpts() river.InsertOpts { return MaintenanceInsertOpts() }

// CIDropRunningBuildsWorker works ci.drop_running_builds: under the maintenance framework it
// fails builds stuck in running (Ci::StuckBuilds::DropRunningService): status running with updated_at older than the timeout.
type CIDropRunningBuildsWorker struct {
	river.WorkerDefaults[CIDropRunningBuildsArgs]
	deps *Deps
}

// Timeout bounds a run by the maintenance timeout.
func (w *CIDropRunningBuildsWorker) Timeout(*river.Job[CIDropRunningBuildsArgs]) time.Duration {
	return w.deps.maintenanceTimeout()
}

// Work runs one sweep.
func (w *CIDropRunningBuildsWorker) Work(ctx context.Context, job *river.Job[CIDropRunningBuildsArgs]) error {
	return w.deps.RunMaintenance(ctx, job.JobRow, func(ctx context.Context) (MaintenanceResult, error) {
		return w.deps.sweepStuckBuilds(ctx, ciDropRunningBuildsSweep())
	})
}

func ciDropRunningBuildsSweep() *stuckBuildsSweep {
	return &stuckBuildsSweep{
		kind:           CIDropRunningBuildsArgs{}.Kind(),
		status:         "running",
		failureReason:  FailureReasonStuckOrTimeout,
		logMessage:     "Cleaning running, timed-out builds",
		timeoutSetting: CIDropRunningBuildsTimeoutSetting,
		defaultTimeout: DefaultCIDropRunningBuildsTimeout,
		createdAt:      false,
		updatedAt:      true,
		scheduledAt:    false,
		selectBatch: func(ctx context.Context, q *db.Queries, cutoff time.Time, after *db.CiBuild, limit int32) ([]*db.CiBuild, error) {
			createdAt, projectID, id := keyset(after)
			return q.SelectStuckRunningBuilds(ctx, db.SelectStuckRunningBuildsParams{
				Cutoff: cutoff, AfterCreatedAt: createdAt, AfterProjectID: projectID, AfterID: id, BatchSize: limit,
			})
		},
	}
}
