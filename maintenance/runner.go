package maintenance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/rivertype"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/pgkit"
)

// Config configures a Runner.
type Config struct {
	// Pool is the database pool; the lock of a run takes a connection of
	// its own from it.
	Pool *pgxpool.Pool
	// Logger receives the runs' log lines.
	Logger *slog.Logger
	// Metrics counts runs; nil: metrics on a private registry.
	Metrics *Metrics
	// WorkerID names this process in maintenance_runs.worker_id.
	WorkerID string
	// LockCheckInterval is how often a run checks its lock's connection
	// (default DefaultLockCheckInterval).
	LockCheckInterval time.Duration
	// Timeout bounds a run: the Timeout of every maintenance worker
	// (default DefaultTimeout).
	Timeout time.Duration
	// Tracer makes a span of every run (sluice.maintenance/KIND), inside
	// the job's work span; nil: none.
	Tracer trace.Tracer
}

// Runner runs maintenance runs: it is what a maintenance worker's Work
// calls.
type Runner struct {
	cfg     Config
	queries *db.Queries
}

// NewRunner returns a Runner on cfg, with defaults filled in.
func NewRunner(cfg Config) (*Runner, error) {
	if cfg.Pool == nil {
		return nil, errors.New("maintenance: a Runner needs a pool")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		m, err := NewMetrics(nil)
		if err != nil {
			return nil, err
		}
		cfg.Metrics = m
	}
	if cfg.LockCheckInterval <= 0 {
		cfg.LockCheckInterval = DefaultLockCheckInterval
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Tracer == nil {
		cfg.Tracer = noop.NewTracerProvider().Tracer("")
	}
	return &Runner{cfg: cfg, queries: db.New(cfg.Pool)}, nil
}

// Timeout is the bound of one run: maintenance workers return it from their
// Timeout method.
func (r *Runner) Timeout() time.Duration { return r.cfg.Timeout }

// Metrics are the runner's metrics.
func (r *Runner) Metrics() *Metrics { return r.cfg.Metrics }

// Run is the maintenance-run framework every maintenance worker calls from
// Work:
//
//  1. take pg_try_advisory_lock(hashtextextended(kind, 0)) on a dedicated
//     connection; if another session holds it, record the run as
//     skipped_locked and return nil (the River job completes);
//  2. mark runs of the kind left "running" by a dead process as failed;
//  3. record the run as running, call fn, record succeeded or failed with
//     the affected count and details;
//  4. release the lock (or close its connection).
//
// fn's error is returned, so River retries the job as usual. The run is
// bounded by the job's context, whose deadline is the worker's Timeout.
func (r *Runner) Run(ctx context.Context, job *rivertype.JobRow, fn Func) (err error) {
	kind := job.Kind
	ctx, span := r.cfg.Tracer.Start(ctx, "sluice.maintenance/"+kind, trace.WithAttributes(attribute.String("kind", kind)))
	var outcome string // skipped_locked, or the run's status
	defer func() {
		if outcome == "" {
			outcome = RunFailed
		}
		span.SetAttributes(attribute.String("outcome", outcome))
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}()
	logger := r.cfg.Logger.With("kind", kind, "job_id", job.ID)
	jobID := &job.ID
	var workerID *string
	if r.cfg.WorkerID != "" {
		workerID = &r.cfg.WorkerID
	}

	lock, err := pgkit.TryLock(ctx, r.cfg.Pool, kind)
	if err != nil {
		return fmt.Errorf("maintenance %s: %w", kind, err)
	}
	if lock == nil {
		outcome = RunSkippedLocked
		return r.recordSkipped(ctx, logger, kind, jobID, workerID)
	}
	// The run works on ctx cancelled as soon as the lock's connection is
	// found dead: without its session the lock is gone, and another run of
	// the kind may start.
	ctx, stopWatch := watchLock(ctx, lock, r.cfg.LockCheckInterval, logger)
	defer func() {
		stopWatch()
		if relErr := lock.Release(ctx); relErr != nil {
			logger.Warn("maintenance lock release", "error", relErr)
		}
	}()

	// Detached from ctx from here on: the journal must record the outcome
	// even when the run's deadline has passed.
	bg := context.WithoutCancel(ctx)
	abandoned, err := r.queries.AbandonMaintenanceRuns(ctx, kind)
	if err != nil {
		return fmt.Errorf("maintenance %s: close abandoned runs: %w", kind, err)
	}
	if len(abandoned) > 0 {
		logger.Warn("maintenance runs abandoned by a dead process marked failed", "run_ids", abandoned)
	}
	run, err := r.queries.StartMaintenanceRun(ctx, db.StartMaintenanceRunParams{Kind: kind, JobID: jobID, WorkerID: workerID})
	if err != nil {
		return fmt.Errorf("maintenance %s: record start: %w", kind, err)
	}
	logger = logger.With("run_id", run.ID)
	span.SetAttributes(attribute.Int64("run_id", run.ID))
	logger.Info("maintenance run started")
	start := time.Now()

	var res Result
	defer func() {
		status := RunSucceeded
		details := res.Details
		if details == nil {
			details = map[string]any{}
		}
		p := recover()
		switch {
		case p != nil:
			status = RunFailed
			details["error"] = fmt.Sprintf("panic: %v", p)
		case err != nil:
			status = RunFailed
			details["error"] = err.Error()
		}
		details["duration_ms"] = time.Since(start).Milliseconds()
		raw, mErr := json.Marshal(details)
		if mErr != nil {
			raw = []byte(fmt.Sprintf(`{"error": %q}`, "details not encodable: "+mErr.Error()))
		}
		if _, fErr := r.queries.FinishMaintenanceRun(bg, db.FinishMaintenanceRunParams{
			ID: run.ID, Status: status, Affected: res.Affected, Details: raw,
		}); fErr != nil {
			logger.Error("maintenance run outcome not recorded", "error", fErr)
		}
		outcome = status
		span.SetAttributes(attribute.Int64("affected", res.Affected))
		r.cfg.Metrics.Runs.WithLabelValues(kind, status).Inc()
		r.cfg.Metrics.Affected.WithLabelValues(kind).Add(float64(res.Affected))
		if status == RunSucceeded {
			logger.Info("maintenance run succeeded", "affected", res.Affected, "duration_ms", details["duration_ms"])
		} else {
			logger.Error("maintenance run failed", "affected", res.Affected, "error", details["error"])
		}
		if p != nil {
			panic(p)
		}
	}()

	res, err = fn(ctx)
	if cause := context.Cause(ctx); errors.Is(cause, ErrLockLost) {
		err = cause
	}
	if err != nil {
		err = fmt.Errorf("maintenance %s: %w", kind, err)
	}
	return err
}

func (r *Runner) recordSkipped(ctx context.Context, logger *slog.Logger, kind string, jobID *int64, workerID *string) error {
	details := map[string]any{"reason": "advisory lock held by another session"}
	holders, err := r.queries.AdvisoryLockHolders(ctx, kind)
	if err == nil && len(holders) > 0 {
		details["holder_pid"] = holders[0].Pid
		details["holder_application_name"] = holders[0].ApplicationName
	}
	raw, _ := json.Marshal(details)
	if _, err := r.queries.RecordSkippedMaintenanceRun(ctx, db.RecordSkippedMaintenanceRunParams{
		Kind: kind, JobID: jobID, WorkerID: workerID, Details: raw,
	}); err != nil {
		return fmt.Errorf("maintenance %s: record skipped run: %w", kind, err)
	}
	r.cfg.Metrics.Runs.WithLabelValues(kind, RunSkippedLocked).Inc()
	logger.Info("maintenance run skipped: another session holds the lock", "holder", details["holder_pid"])
	return nil
}
