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

// RunOptions says how RunOne treats the concurrency limit of the job's kind,
// and how long it may take in all.
type RunOptions struct {
	// Wait is how long to wait for a free slot of a limited kind (0: take
	// one only if free now).
	Wait time.Duration
	// IgnoreLimit runs the job without a slot, whatever its kind's limit.
	IgnoreLimit bool
	// Timeout bounds the whole run (0: only ctx does): the database, the
	// insert, the wait for a slot, the job's work and any snoozes. When it
	// passes, the job is deleted unrun, or cancelled, and RunOne's error
	// says what it was waiting for.
	Timeout time.Duration
}

// runSlotPoll is how often RunOne tries again for a slot.
const runSlotPoll = 100 * time.Millisecond

// runBookkeepingTimeout bounds what RunOne does for a job once it has
// finished or been given up (reading its outcome, freeing its slot,
// cancelling or deleting it), whatever is left of its context.
const runBookkeepingTimeout = 10 * time.Second

// errRunTimedOut is the cause of RunOne's context once opts.Timeout passed.
var errRunTimedOut = errors.New("run timed out")

// DuplicateJobError is RunOne's error when River skipped the insert of its
// job as a duplicate of a job already there, by the unique options of the
// job's kind: that job waits for a worker serving its queue, and RunOne
// neither waits for it nor takes it over.
type DuplicateJobError struct {
	// Job is the existing job, as River's insert returned it.
	Job *rivertype.JobRow
}

// Error says which job the insert duplicated and where it waits.
func (e *DuplicateJobError) Error() string {
	return fmt.Sprintf("%s job not run: it is a duplicate of job %d (%s in queue %s) by the kind's unique options, so River skipped its insert; "+
		"job %d is for a worker serving queue %s (let it finish, or cancel it, to run the kind here)",
		e.Job.Kind, e.Job.ID, e.Job.State, e.Job.Queue, e.Job.ID, e.Job.Queue)
}

// RunOne works one job of args' kind now, in this process, through the same
// River client, workers, middleware and locks as a worker: it inserts the job
// (one attempt) into a private queue that only this process works, starts a
// client on that queue, and waits for the job to finish. Cancelling ctx, or
// opts.Timeout passing, cancels the job.
//
// A job of a limited kind takes a slot as a worker's would: RunOne reserves
// one for it before it starts, waiting up to opts.Wait for one to be free
// (and for the kind's parked jobs, which are older, to have gone first); if
// none frees in time, the job is deleted unrun and RunOne returns an error.
// opts.IgnoreLimit runs it without a slot. Either way the job never parks.
//
// A job River does not insert, as the duplicate of a job already there by
// the kind's unique options, is not run: the error is a *DuplicateJobError
// naming that job. A job the program's insert middleware moved out of the
// private queue is deleted unrun.
func RunOne(ctx context.Context, cfg Config, args river.JobArgs, opts RunOptions) (*RunResult, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opts.Timeout < 0 {
		return nil, fmt.Errorf("run timeout must not be negative, got %s", opts.Timeout)
	}
	cfg = cfg.withDefaults()
	if opts.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, opts.Timeout, errRunTimedOut)
		defer cancel()
	}
	kind := args.Kind()
	// gaveUp is err, or, once opts.Timeout has passed, the error saying
	// what the run was waiting for.
	gaveUp := func(waitingFor string, err error) error {
		if errors.Is(context.Cause(ctx), errRunTimedOut) {
			return fmt.Errorf("gave up after --timeout %s waiting for %s", opts.Timeout, waitingFor)
		}
		return err
	}
	// bookkeeping is the context of what RunOne does for its job after it
	// finished or was given up.
	bookkeeping := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), runBookkeepingTimeout)
	}

	pool, err := OpenPool(ctx, cfg.DatabaseURL, "sluice run "+cfg.ID, cfg.Program().Schemas)
	if err != nil {
		return nil, gaveUp("the database", err)
	}
	defer pool.Close()
	if err := migrations.Check(ctx, pool, cfg.Program().MigrationOptions(cfg.Logger)); err != nil {
		return nil, gaveUp("the database", err)
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
	// The work client started the limiter's services (its listener holds a
	// connection of its own): they stop before the pool closes, whichever
	// way run returns.
	defer j.Limiter.Flush()
	defer func() {
		// The private queue's row is of no use once the job is done.
		cleanupCtx, cancel := bookkeeping()
		defer cancel()
		_ = db.New(pool).DeleteRiverQueue(cleanupCtx, queue)
	}()
	// deleteUnrun deletes the job, which never started.
	deleteUnrun := func(jobID int64) {
		deleteCtx, cancel := bookkeeping()
		defer cancel()
		if _, err := client.JobDelete(deleteCtx, jobID); err != nil {
			cfg.Logger.Warn("job not run, and not deleted", "job_id", jobID, "error", err)
		}
	}

	events, unsubscribe := client.Subscribe(
		river.EventKindJobCancelled, river.EventKindJobCompleted,
		river.EventKindJobFailed, river.EventKindJobSnoozed,
	)
	defer unsubscribe()

	inserted, err := client.Insert(ctx, args, &river.InsertOpts{Queue: queue, MaxAttempts: 1})
	if err != nil {
		return nil, gaveUp("the insert of the "+kind+" job", fmt.Errorf("insert %s job: %w", kind, err))
	}
	jobID := inserted.Job.ID
	switch {
	case inserted.UniqueSkippedAsDuplicate:
		// Nothing was inserted, and the job River returned is not run's
		// to work: no event of it would ever come here.
		return nil, &DuplicateJobError{Job: inserted.Job}
	case inserted.Job.Queue != queue:
		deleteUnrun(jobID)
		return nil, fmt.Errorf("%s job %d was inserted into queue %s, not run's own (the program's insert middleware moved it): deleted unrun",
			kind, jobID, inserted.Job.Queue)
	}
	if !opts.IgnoreLimit {
		if why, err := reserveRunSlot(ctx, j.Limiter, inserted.Job, opts.Wait); err != nil {
			deleteUnrun(jobID)
			if why != "" {
				why = " (" + why + ")"
			}
			return nil, gaveUp(fmt.Sprintf("a free %s slot%s; job %d deleted unrun", kind, why, jobID), err)
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
			waitingFor := fmt.Sprintf("job %d of %s to finish", jobID, kind)
			checkCtx, cancelCheck := bookkeeping()
			defer cancelCheck()
			if row, err := client.JobGet(checkCtx, jobID); err == nil {
				waitingFor = jobWait(row)
			}
			stopCtx, cancel := context.WithTimeout(context.Background(), cfg.HardStopGrace)
			defer cancel()
			_ = client.StopAndCancel(stopCtx)
			// A job that had not started (or was snoozed) is cancelled as
			// River cancels jobs; one that ran is finished by now.
			if _, err := client.JobCancel(checkCtx, jobID); err != nil {
				cfg.Logger.Warn("job given up, and not cancelled", "job_id", jobID, "error", err)
			}
			return nil, gaveUp(waitingFor+"; job cancelled",
				fmt.Errorf("job %d of %s interrupted: %w", jobID, kind, context.Cause(ctx)))
		}
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := client.Stop(stopCtx); err != nil {
		return nil, fmt.Errorf("stop River client: %w", err)
	}
	flushLimiter(j, cfg.Logger)

	doneCtx, cancelDone := bookkeeping()
	defer cancelDone()
	if err := j.Limiter.Forget(doneCtx, kind, jobID); err != nil {
		// A slot the job did not claim (it failed for want of one).
		cfg.Logger.Warn("slot of the job not freed; concurrency_limit.resume will", "job_id", jobID, "error", err)
	}
	res := &RunResult{JobID: jobID, Kind: kind, State: event.Job.State, Duration: time.Since(start)}
	if event.JobStats != nil {
		res.Duration = event.JobStats.RunDuration
	}
	if n := len(event.Job.Errors); n > 0 && !res.Succeeded() {
		res.Error = event.Job.Errors[n-1].Error
	}
	if !res.Succeeded() && res.Error == "" {
		res.Error = "job did not complete"
	}
	run, err := db.New(pool).GetMaintenanceRunByJob(doneCtx, &jobID)
	switch {
	case err == nil:
		res.Maintenance = run
	case !errors.Is(err, pgx.ErrNoRows):
		return nil, fmt.Errorf("read maintenance run of job %d: %w", jobID, err)
	}
	return res, nil
}

// jobWait is what a run waiting for its job row waits for, by the row's
// state.
func jobWait(row *rivertype.JobRow) string {
	switch row.State {
	case rivertype.JobStateAvailable:
		return fmt.Sprintf("job %d of %s to start (available, not fetched yet)", row.ID, row.Kind)
	case rivertype.JobStateRunning:
		since := ""
		if row.AttemptedAt != nil {
			since = " since " + row.AttemptedAt.UTC().Format(time.RFC3339)
		}
		return fmt.Sprintf("job %d of %s to finish (running%s)", row.ID, row.Kind, since)
	case rivertype.JobStateScheduled:
		return fmt.Sprintf("job %d of %s to run (scheduled at %s; River's scheduler, on the workers' leader, makes it available)",
			row.ID, row.Kind, row.ScheduledAt.UTC().Format(time.RFC3339))
	default:
		return fmt.Sprintf("job %d of %s to finish (%s)", row.ID, row.Kind, row.State)
	}
}

// reserveRunSlot reserves a slot for job when its kind is limited, trying
// every runSlotPoll until wait has passed. When it finds none, it returns
// why the last try found none, with its error.
func reserveRunSlot(ctx context.Context, lim *limiter.Limiter, job *rivertype.JobRow, wait time.Duration) (string, error) {
	deadline := time.Now().Add(wait)
	why := ""
	kind, jobID := job.Kind, job.ID
	for {
		res, err := lim.ReserveSlot(ctx, job)
		if err != nil {
			return why, err
		}
		if !res.Needed || res.Reserved {
			return "", nil
		}
		why = slotTaken(res)
		if !time.Now().Before(deadline) {
			return why, fmt.Errorf("no %s slot free within --wait %s (%s); job %d deleted unrun (wait longer, or --ignore-limit)",
				kind, wait, why, jobID)
		}
		select {
		case <-ctx.Done():
			return why, fmt.Errorf("waiting for a %s slot: %w", kind, context.Cause(ctx))
		case <-time.After(min(runSlotPoll, time.Until(deadline)+time.Millisecond)):
		}
	}
}

// slotTaken says why a reservation found no slot.
func slotTaken(res limiter.SlotReservation) string {
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
	return why
}

func privateQueueName() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return RunQueuePrefix + hex.EncodeToString(b[:])
}
