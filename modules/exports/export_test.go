package exports

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/maintenance"
	"github.com/sluice-dev/sluice/settings"
)

// TestDeps are the module's dependencies, for tests.
type TestDeps struct{ d *deps }

// NewTestDeps returns the module's dependencies on pool, with metrics
// (nil: a private registry) and a maintenance runner of its own.
func NewTestDeps(pool *pgxpool.Pool, logger *slog.Logger, metrics *Metrics) (*TestDeps, error) {
	if metrics == nil {
		m, err := NewMetrics(nil)
		if err != nil {
			return nil, err
		}
		metrics = m
	}
	runner, err := maintenance.NewRunner(maintenance.Config{Pool: pool, Logger: logger})
	if err != nil {
		return nil, err
	}
	return &TestDeps{d: &deps{Pool: pool, Logger: logger, Queries: db.New(pool), Settings: settings.New(pool),
		Metrics: metrics, runner: runner}}, nil
}

// SweepStuckExports runs one export.stuck_jobs sweep outside the maintenance
// framework, calling betweenReads between its first and second read.
func (t *TestDeps) SweepStuckExports(ctx context.Context, betweenReads func(context.Context) error) (maintenance.Result, error) {
	return t.d.sweepStuckExports(ctx, betweenReads)
}

// StuckJobsWorker returns the export.stuck_jobs worker on t.
func (t *TestDeps) StuckJobsWorker() *StuckJobsWorker { return &StuckJobsWorker{deps: t.d} }
