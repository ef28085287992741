package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/sluice-dev/sluice/db"
)

// Maintenance run statuses, as recorded in maintenance_runs.status.
const (
	RunFailed        = "failed"
	RunRunning       = "running"
	RunSkippedLocked = "skipped_locked"
	RunSucceeded     = "succeeded"
)

// MaintenanceQueue is the River queue maintenance kinds are inserted into.
const MaintenanceQueue = "maintenance"

// MaintenanceMaxAttempts is how often River tries a failed maintenance run
// before discarding it; the next scheduled run tries again anyway.
const MaintenanceMaxAttempts = 3

// ErrLockLost ends a maintenance run whose advisory lock's connection died.
var ErrLockLost = errors.New("advisory lock lost: its connection died")

// DefaultLockCheckInterval is how often a maintenance run checks that the
// connection holding its lock is alive.
const DefaultLockCheckInterval = 5 * time.Second

// watchLock returns a context cancelled (cause ErrLockLost) when lock's
// connection stops answering, and a stop function that ends the watch; it
// must be called before the lock is released.
func (d *Deps) watchLock(ctx context.Context, lock *db.SessionLock, logger *slog.Logger) (context.Context, func()) {
	interval := d.LockCheckInterval
	if interval <= 0 {
		interval = DefaultLockCheckInterval
	}
	runCtx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ticker := time.NewTicker(interval)
		defer ticker.Stop()
		for {
			select {
			case <-runCtx.Done():
				return
			case <-ticker.C:
				if err := lock.Ping(runCtx); err != nil && runCtx.Err() == nil {
					logger.Error("maintenance run stopped: its advisory lock is lost", "error", err)
					cancel(fmt.Errorf("%w: %v", ErrLockLost, err))
					return
				}
			}
		}
	}()
	return runCtx, func() {
		cancel(nil)
		<-done
	}
}

// MaintenanceInsertOpts are the insert options of every maintenance kind:
// its args type returns them from InsertOpts.
func MaintenanceInsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: MaintenanceQueue, MaxAttempts: MaintenanceMaxAttempts}
}

// MaintenanceResult is what a maintenance run reports for its journal row.
type MaintenanceResult struct {
	// Affected is the number of rows the run changed.
	Affected int64
	// Details is stored in maintenance_runs.details.
	Details map[string]any
}

// MaintenanceFunc is the body of a maintenance run. It is called only while
// this process holds the kind's session advisory lock.
type MaintenanceFunc func(ctx context.Context) (MaintenanceResult, error)

// RunMaintenance is the maintenance-run framework every maintenance worker
// calls from Work:
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
func (d *Deps) RunMaintenance(ctx context.Context, job *rivertype.JobRow, fn MaintenanceFunc) (err error) {
	kind := job.Kind
	logger := d.Logger.With("kind", kind, "job_id", job.ID)
	jobID := &job.ID
	var workerID *string
	if d.WorkerID != "" {
		workerID = &d.WorkerID
	}

	lock, err := db.TryLock(ctx, d.Pool, kind)
	if err != nil {
		return fmt.Errorf("maintenance %s: %w", kind, err)
	}
	if lock == nil {
		return d.recordSkipped(ctx, logger, kind, jobID, workerID)
	}
	// The run works on ctx cancelled as soon as the lock's connection is
	// found dead: without its session the lock is gone, and another run of
	// the kind may start.
	ctx, stopWatch := d.watchLock(ctx, lock, logger)
	defer func() {
		stopWatch()
		if relErr := lock.Release(ctx); relErr != nil {
			logger.Warn("maintenance lock release", "error", relErr)
		}
	}()

	// Detached from ctx from here on: the journal must record the outcome
	// even when the run's deadline has passed.
	bg := context.WithoutCancel(ctx)
	abandoned, err := d.Queries.AbandonMaintenanceRuns(ctx, kind)
	if err != nil {
		return fmt.Errorf("maintenance %s: close abandoned runs: %w", kind, err)
	}
	if len(abandoned) > 0 {
		logger.Warn("maintenance runs abandoned by a dead process marked failed", "run_ids", abandoned)
	}
	run, err := d.Queries.StartMaintenanceRun(ctx, db.StartMaintenanceRunParams{Kind: kind, JobID: jobID, WorkerID: workerID})
	if err != nil {
		return fmt.Errorf("maintenance %s: record start: %w", kind, err)
	}
	logger = logger.With("run_id", run.ID)
	logger.Info("maintenance run started")
	start := time.Now()

	var res MaintenanceResult
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
		if _, fErr := d.Queries.FinishMaintenanceRun(bg, db.FinishMaintenanceRunParams{
			ID: run.ID, Status: status, Affected: res.Affected, Details: raw,
		}); fErr != nil {
			logger.Error("maintenance run outcome not recorded", "error", fErr)
		}
		d.Metrics.MaintenanceRuns.WithLabelValues(kind, status).Inc()
		d.Metrics.MaintenanceAffected.WithLabelValues(kind).Add(float64(res.Affected))
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

func (d *Deps) recordSkipped(ctx context.Context, logger *slog.Logger, kind string, jobID *int64, workerID *string) error {
	details := map[string]any{"reason": "advisory lock held by another session"}
	holders, err := d.Queries.AdvisoryLockHolders(ctx, kind)
	if err == nil && len(holders) > 0 {
		details["holder_pid"] = holders[0].Pid
		details["holder_application_name"] = holders[0].ApplicationName
	}
	raw, _ := json.Marshal(details)
	if _, err := d.Queries.RecordSkippedMaintenanceRun(ctx, db.RecordSkippedMaintenanceRunParams{
		Kind: kind, JobID: jobID, WorkerID: workerID, Details: raw,
	}); err != nil {
		return fmt.Errorf("maintenance %s: record skipped run: %w", kind, err)
	}
	d.Metrics.MaintenanceRuns.WithLabelValues(kind, RunSkippedLocked).Inc()
	logger.Info("maintenance run skipped: another session holds the lock", "holder", details["holder_pid"])
	return nil
}
