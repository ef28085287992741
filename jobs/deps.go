package jobs

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/sluice-dev/sluice/db"
)

// DefaultJobTimeout is River's own default job timeout.
const DefaultJobTimeout = time.Minute

// DefaultMaintenanceTimeout bounds one maintenance run: the seed's lease TTL.
const DefaultMaintenanceTimeout = 30 * time.Minute

// Deps is what workers share: the pool, logger, metrics and settings.
type Deps struct {
	// Pool is the database pool.
	Pool *pgxpool.Pool
	// Logger is the structured logger.
	Logger *slog.Logger
	// Metrics holds the job metrics.
	Metrics *Metrics
	// Limiter enforces the concurrency limits.
	Limiter *Limiter
	// Settings reads dynamic settings.
	Settings *db.Settings
	// Queries runs sqlc queries on Pool.
	Queries *db.Queries
	// WorkerID names this process in maintenance_runs (River's client ID).
	WorkerID string
	// JobTimeout is the client-level job timeout.
	JobTimeout time.Duration
	// MaintenanceTimeout bounds a maintenance run.
	MaintenanceTimeout time.Duration
	// LockCheckInterval is how often a maintenance run checks its lock's
	// connection (default DefaultLockCheckInterval).
	LockCheckInterval time.Duration
	// ExportDir is where export.project writes archives; empty means
	// DefaultExportDir.
	ExportDir string
	// ExportMetrics holds the project export metrics.
	ExportMetrics *ExportMetrics
}

// DepsConfig configures NewDeps.
type DepsConfig struct {
	Logger             *slog.Logger
	Registerer         prometheus.Registerer
	WorkerID           string
	JobTimeout         time.Duration
	MaintenanceTimeout time.Duration
	ExportDir          string
	// IgnoreLimits makes the Limiter let every job run without a slot
	// (sluice run --ignore-limit).
	IgnoreLimits bool
	// NeverPark makes the Limiter fail a job that finds no slot instead of
	// parking it, and take no leases (sluice run, whose job reserved its
	// slot before it started).
	NeverPark bool
	// ParkAfter is how long a job of a limited kind waits in its worker for
	// a slot before it parks; 0 means DefaultParkAfter.
	ParkAfter time.Duration
}

// NewDeps builds the dependencies of every worker and registers their
// metrics with cfg.Registerer.
func NewDeps(pool *pgxpool.Pool, cfg DepsConfig) (*Deps, error) {
	metrics, err := NewMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	exportMetrics, err := NewExportMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	reg := cfg.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	limitMetrics, err := NewLimitMetrics(reg, pool, logger)
	if err != nil {
		return nil, err
	}
	return &Deps{
		Limiter:            newLimiter(pool, logger, limitMetrics, cfg.WorkerID, cfg.IgnoreLimits, cfg.NeverPark, cfg.ParkAfter),
		Pool:               pool,
		Logger:             logger,
		Metrics:            metrics,
		Settings:           db.NewSettings(pool),
		Queries:            db.New(pool),
		WorkerID:           cfg.WorkerID,
		JobTimeout:         cfg.JobTimeout,
		MaintenanceTimeout: cfg.MaintenanceTimeout,
		ExportDir:          cfg.ExportDir,
		ExportMetrics:      exportMetrics,
	}, nil
}

func (d *Deps) jobTimeout() time.Duration {
	if d.JobTimeout > 0 {
		return d.JobTimeout
	}
	return DefaultJobTimeout
}

func (d *Deps) maintenanceTimeout() time.Duration {
	if d.MaintenanceTimeout > 0 {
		return d.MaintenanceTimeout
	}
	return DefaultMaintenanceTimeout
}

// AddWorkers registers the worker of every kind in NewRegistry with workers.
func AddWorkers(workers *river.Workers, deps *Deps) error {
	for _, kind := range NewRegistry().Kinds() {
		if err := kind.addWorker(workers, deps); err != nil {
			return fmt.Errorf("add %s worker: %w", kind.Name, err)
		}
	}
	return nil
}

// Middleware is the worker middleware every sluice client installs, outermost
// first.
func Middleware(deps *Deps) []rivertype.WorkerMiddleware {
	return []rivertype.WorkerMiddleware{
		&metricsMiddleware{metrics: deps.Metrics},
		deps.Limiter,
	}
}
