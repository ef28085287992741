package jobs

import "context"

// SweepStuckExports runs one export.stuck_jobs sweep outside the maintenance
// framework, calling betweenReads between its first and second read.
func SweepStuckExports(ctx context.Context, d *Deps, betweenReads func(context.Context) error) (MaintenanceResult, error) {
	return d.sweepStuckExports(ctx, betweenReads)
}

// NewExportStuckJobsWorker returns the export.stuck_jobs worker on d.
func NewExportStuckJobsWorker(d *Deps) *ExportStuckJobsWorker {
	return &ExportStuckJobsWorker{deps: d}
}
