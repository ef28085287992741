package jobs

import (
	"context"
	"fmt"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// SweepStuckExports runs one export.stuck_jobs sweep outside the maintenance
// framework, calling betweenReads between its first and second read.
func SweepStuckExports(ctx context.Context, d *Deps, betweenReads func(context.Context) error) (MaintenanceResult, error) {
	return d.sweepStuckExports(ctx, betweenReads)
}

// NewExportStuckJobsWorker returns the export.stuck_jobs worker on d.
func NewExportStuckJobsWorker(d *Deps) *ExportStuckJobsWorker {
	return &ExportStuckJobsWorker{deps: d}
}

// WithStuckBuildsHook returns ctx carrying hook: the stuck-build sweep calls
// it before every drop attempt with the ids about to be updated and the
// attempt number (0: the batch statement or a build's first attempt).
func WithStuckBuildsHook(ctx context.Context, hook func(ctx context.Context, ids []int64, attempt int)) context.Context {
	return context.WithValue(ctx, stuckBuildsHookKey{}, stuckBuildsHook(hook))
}

// WorkStuckBuilds works a job of a ci.drop_*_builds kind in this goroutine,
// as River would call the worker's Work: the maintenance framework and the
// sweep run with ctx (so a hook from WithStuckBuildsHook applies).
func WorkStuckBuilds(ctx context.Context, d *Deps, kind string, jobID int64) error {
	row := &rivertype.JobRow{ID: jobID, Kind: kind}
	switch kind {
	case CIDropCancelingBuildsArgs{}.Kind():
		return (&CIDropCancelingBuildsWorker{deps: d}).Work(ctx, &river.Job[CIDropCancelingBuildsArgs]{JobRow: row})
	case CIDropRunningBuildsArgs{}.Kind():
		return (&CIDropRunningBuildsWorker{deps: d}).Work(ctx, &river.Job[CIDropRunningBuildsArgs]{JobRow: row})
	case CIDropScheduledBuildsArgs{}.Kind():
		return (&CIDropScheduledBuildsWorker{deps: d}).Work(ctx, &river.Job[CIDropScheduledBuildsArgs]{JobRow: row})
	case CIDropPendingBuildsArgs{}.Kind():
		return (&CIDropPendingBuildsWorker{deps: d}).Work(ctx, &river.Job[CIDropPendingBuildsArgs]{JobRow: row})
	}
	return fmt.Errorf("not a stuck-builds kind: %q", kind)
}

// SweepStuckBuildsUnlocked runs the sweep of a ci.drop_*_builds kind without
// the maintenance framework (no advisory lock, no journal row), so a test can
// run two at once and see optimistic locking alone keep them apart.
func SweepStuckBuildsUnlocked(ctx context.Context, d *Deps, kind string) (MaintenanceResult, error) {
	sweeps := map[string]func() *stuckBuildsSweep{
		CIDropCancelingBuildsArgs{}.Kind(): ciDropCancelingBuildsSweep,
		CIDropRunningBuildsArgs{}.Kind():   ciDropRunningBuildsSweep,
		CIDropScheduledBuildsArgs{}.Kind(): ciDropScheduledBuildsSweep,
		CIDropPendingBuildsArgs{}.Kind():   ciDropPendingBuildsSweep,
	}
	sweep, ok := sweeps[kind]
	if !ok {
		return MaintenanceResult{}, fmt.Errorf("not a stuck-builds kind: %q", kind)
	}
	return d.sweepStuckBuilds(ctx, sweep())
}
