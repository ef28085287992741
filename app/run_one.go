package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/limiter"
	"github.com/sluice-dev/sluice/migrations"
)

// RunResult summarises the job RunOne worked.
type RunResult struct {
	JobID    int64
	Kind     string
	State    rivertype.JobState
	Duration time.Duration
	// Error is the job's error when it did not complete.
	Error string
	// Maintenance is the run a maintenance kind recorded, else nil.
	Maintenance *db.MaintenanceRun
}

// Succeeded reports whether the job completed.
func (r *RunResult) Succeeded() bool { return r.State == rivertype.JobStateCompleted }

// RunOptions says how RunOne treats the concurrency limit of the job's kind.
type RunOptions struct {
	// Wait is how long to wait for a free slot of a limited kind (0: take
	// one only if free now).
	Wait time.Duration
	// IgnoreLimit runs the job without a slot, whatever its kind's limit.
	IgnoreLimit bool
}

// runSlotPoll is how often RunOne tries again for a slot.
const runSlotPoll = 100 * time.Millisecond

// RunOne works one job of args' kind now, in this process, through the same
// River client, workers, middleware and locks as a worker: it inserts the job
// (one attempt) into a private queue that only this process works, starts a
// client on that queue, and waits for the job to finish. Cancelling ctx
// cancels the job.
//
// A job of a limited kind takes a slot as a worker's would: RunOne reserves
// one for it before it starts, waiting up to opts.Wait for one to be free
// (and for the kind's parked jobs, which are older, to have gone first); if
// none frees in time, the job is deleted unrun and RunOne returns an error.
// opts.IgnoreLimit runs it without a slot. Either way the job never parks.
func RunOne(ctx context.Context, cfg Config, args river.JobArgs, opts RunOptions) (*RunResult, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	pool, err := OpenPool(ctx, cfg.DatabaseURL, "sluice run "+cfg.ID, cfg.Program().Schemas)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if err := migrations.Check(ctx, pool, cfg.Program().MigrationOptions(cfg.Logger)); err != nil {
		return nil, err
	}
	j, err := NewJobs(pool, JobsConfig{
		Program:            cfg.Program(),
		Logger:             cfg.Logger,
		WorkerID:           cfg.ID,
		JobTimeout:         cfg.JobTimeout,
		MaintenanceTimeout: cfg.MaintenanceTimeout,
		IgnoreLimits:       opts.IgnoreLimit,
		NeverPark:          true,
	})
	if err != nil {
		return nil, err
	}

	queue := privateQueueName()
	client, err := newWorkClient(pool, j, cfg.Logger, clientOpts{
		fetchCooldown:     cfg.FetchCooldown,
		fetchPollInterval: cfg.FetchPollInterval,
		id:                cfg.ID,
		jobTimeout:        cfg.JobTimeout,
		leaderElectionOff: true,
		queues:            map[string]river.QueueConfig{queue: {MaxWorkers: 1}},
		configure:         cfg.River,
	})
	if err != nil {
		return nil, err
	}
	defer func() {
		// The private queue's row is of no use once the job is done.
		cleanupCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = db.New(pool).DeleteRiverQueue(cleanupCtx, queue)
	}()

	events, unsubscribe := client.Subscribe(
		river.EventKindJobCancelled, river.EventKindJobCompleted,
		river.EventKindJobFailed, river.EventKindJobSnoozed,
	)
	defer unsubscribe()

	inserted, err := client.Insert(ctx, args, &river.InsertOpts{Queue: queue, MaxAttempts: 1})
	if err != nil {
		return nil, fmt.Errorf("insert %s job: %w", args.Kind(), err)
	}
	jobID := inserted.Job.ID
	if !opts.IgnoreLimit {
		if err := reserveRunSlot(ctx, j.Limiter, args.Kind(), jobID, opts.Wait); err != nil {
			deleteCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if _, delErr := client.JobDelete(deleteCtx, jobID); delErr != nil {
				cfg.Logger.Warn("job not run, and not deleted", "job_id", jobID, "error", delErr)
			}
			return nil, err
		}
	}
	start := time.Now()
	if err := client.Start(context.WithoutCancel(ctx)); err != nil {
		return nil, fmt.Errorf("start River client: %w", err)
	}

	var event *river.Event
wait:
	for {
		select {
		case event = <-events:
			if event == nil || event.Job == nil || event.Job.ID != jobID {
				continue
			}
			if event.Kind == river.EventKindJobSnoozed {
				// Snoozed jobs come back to this queue; keep waiting.
				cfg.Logger.Info("job snoozed; waiting for it to run again", "job_id", jobID)
				continue
			}
			break wait
		case <-ctx.Done():
			stopCtx, cancel := context.WithTimeout(context.Background(), cfg.HardStopGrace)
			defer cancel()
			_ = client.StopAndCancel(stopCtx)
			return nil, fmt.Errorf("job %d of %s interrupted: %w", jobID, args.Kind(), context.Cause(ctx))
		}
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := client.Stop(stopCtx); err != nil {
		return nil, fmt.Errorf("stop River client: %w", err)
	}
	flushLimiter(j, cfg.Logger)

	if err := j.Limiter.Forget(ctx, args.Kind(), jobID); err != nil {
		// A slot the job did not claim (it failed for want of one).
		cfg.Logger.Warn("slot of the job not freed; concurrency_limit.resume will", "job_id", jobID, "error", err)
	}
	res := &RunResult{JobID: jobID, Kind: args.Kind(), State: event.Job.State, Duration: time.Since(start)}
	if event.JobStats != nil {
		res.Duration = event.JobStats.RunDuration
	}
	if n := len(event.Job.Errors); n > 0 && !res.Succeeded() {
		res.Error = event.Job.Errors[n-1].Error
	}
	if !res.Succeeded() && res.Error == "" {
		res.Error = "job did not complete"
	}
	run, err := db.New(pool).GetMaintenanceRunByJob(ctx, &jobID)
	switch {
	case err == nil:
		res.Maintenance = run
	case !errors.Is(err, pgx.ErrNoRows):
		return nil, fmt.Errorf("read maintenance run of job %d: %w", jobID, err)
	}
	return res, nil
}

// reserveRunSlot reserves a slot of kind for the job jobID when the kind is
// limited, trying every runSlotPoll until wait has passed.
func reserveRunSlot(ctx context.Context, lim *limiter.Limiter, kind string, jobID int64, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		res, err := lim.ReserveSlot(ctx, kind, jobID)
		if err != nil {
			return err
		}
		if !res.Needed || res.Reserved {
			return nil
		}
		if !time.Now().Before(deadline) {
			why := fmt.Sprintf("%d of %d slots taken", res.Taken, res.Limit)
			switch {
			case res.Limit < 0:
				why = fmt.Sprintf("its limit %d is a circuit breaker", res.Limit)
			case res.Why == "key_limit":
				why = "its key's slots are taken"
			case res.Why == "key_fifo":
				why = "parked jobs of its key go first"
			case res.Why == "rate" || res.Why == "key_rate":
				why = "its rate limit's window is full"
			case res.Parked && res.Taken < res.Limit:
				why = "parked jobs of the kind go first"
			case res.Parked:
				why += ", and parked jobs of the kind go first"
			}
			return fmt.Errorf("no %s slot free within --wait %s (%s); job %d deleted unrun (wait longer, or --ignore-limit)",
				kind, wait, why, jobID)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for a %s slot: %w", kind, context.Cause(ctx))
		case <-time.After(min(runSlotPoll, time.Until(deadline)+time.Millisecond)):
		}
	}
}

func privateQueueName() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return RunQueuePrefix + hex.EncodeToString(b[:])
}
