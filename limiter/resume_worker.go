package limiter

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/kinds"
	"github.com/sluice-dev/sluice/maintenance"
)

// ResumeKind is the kind of the resume worker.
const ResumeKind = "concurrency_limit.resume"

// ResumeRescheduleDelay is how soon the resume worker runs again for a kind
// that still has parked jobs after a resume (the seed's RESCHEDULE_DELAY).
const ResumeRescheduleDelay = time.Second

// ResumeArgs are the args of concurrency_limit.resume.
type ResumeArgs struct {
	// JobKind is the job kind whose parked jobs to resume; empty: schedule
	// a resume for every kind with parked jobs.
	JobKind string `json:"kind,omitempty"`
}

// Kind is the River job kind.
func (ResumeArgs) Kind() string { return ResumeKind }

// InsertOpts keeps at most one pending resume per kind (unique by args among
// jobs not yet finished) on the maintenance queue.
func (ResumeArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{
		Queue:       maintenance.Queue,
		MaxAttempts: maintenance.MaxAttempts,
		UniqueOpts: river.UniqueOpts{
			ByArgs: true,
			ByState: []rivertype.JobState{
				rivertype.JobStateAvailable, rivertype.JobStatePending, rivertype.JobStateRetryable,
				rivertype.JobStateRunning, rivertype.JobStateScheduled,
			},
		},
	}
}

// Validate rejects the resume kind itself.
func (a ResumeArgs) Validate() error {
	if a.JobKind == ResumeKind {
		return errors.New(`field "kind": concurrency_limit.resume is never limited`)
	}
	return nil
}

// ValidateIn rejects kinds the program does not know (a row inserted by SQL
// with an unknown kind is skipped when worked).
func (a ResumeArgs) ValidateIn(r *kinds.Registry) error {
	if a.JobKind == "" {
		return nil
	}
	if _, err := r.Lookup(a.JobKind); err != nil {
		return fmt.Errorf(`field "kind": %w`, err)
	}
	return nil
}

// ResumeWorker is the safety net that makes parked jobs available again
// (GitLab's ConcurrencyLimit::ResumeWorker), frees stale and expired
// reserved slots, and corrects the counts; the release path of the Limiter
// resumes promptly when a slot frees.
type ResumeWorker struct {
	river.WorkerDefaults[ResumeArgs]
	limiter  *Limiter
	registry *kinds.Registry
	client   atomic.Pointer[river.Client[pgx.Tx]]
}

// NewResumeWorker returns the worker of concurrency_limit.resume for l;
// registry is the program's kinds (a resume of an unknown kind is skipped).
// SetClient must give it the River client before it works a job without a
// kind, which enqueues one resume per kind.
func NewResumeWorker(l *Limiter, registry *kinds.Registry) *ResumeWorker {
	return &ResumeWorker{limiter: l, registry: registry}
}

// SetClient gives the worker the River client it inserts resumes with.
func (w *ResumeWorker) SetClient(client *river.Client[pgx.Tx]) { w.client.Store(client) }

// Work schedules a resume per kind (no kind) or resumes one kind.
//
// The scheduled run (no kind) deletes its earlier completed runs
// (queries/housekeeping.sql): a safety net every minute leaves one completed
// job, not one per minute among the user's jobs.
func (w *ResumeWorker) Work(ctx context.Context, job *river.Job[ResumeArgs]) error {
	if job.Args.JobKind != "" {
		return w.resumeKind(ctx, job.Args.JobKind)
	}
	if err := w.scheduleKinds(ctx); err != nil {
		return err
	}
	if _, err := w.limiter.q.DeleteEarlierRuns(ctx, db.DeleteEarlierRunsParams{
		Kind: job.Kind, BeforeID: job.ID, Args: job.EncodedArgs}); err != nil {
		w.limiter.logger.Warn("concurrency_limit.resume: earlier runs not deleted", "job_id", job.ID, "error", err)
	}
	return nil
}

// scheduleKinds enqueues concurrency_limit.resume {"kind": K} for each kind
// with parked jobs, reserved slots or leases whose limit is not a circuit
// breaker.
func (w *ResumeWorker) scheduleKinds(ctx context.Context) error {
	q := w.limiter.q
	kinds, err := q.ResumableKinds(ctx)
	if err != nil {
		return fmt.Errorf("list kinds with parked jobs: %w", err)
	}
	if len(kinds) == 0 {
		return nil
	}
	limits, err := q.ListConcurrencyLimits(ctx)
	if err != nil {
		return fmt.Errorf("read concurrency limits: %w", err)
	}
	broken := map[string]bool{}
	for _, l := range limits {
		broken[l.Kind] = l.MaxConcurrency < 0
	}
	client := w.client.Load()
	if client == nil {
		return errors.New("concurrency_limit.resume: no River client to insert resumes with (SetClient)")
	}
	var params []river.InsertManyParams
	for _, kind := range kinds {
		if !broken[kind] {
			params = append(params, river.InsertManyParams{Args: ResumeArgs{JobKind: kind}})
		}
	}
	if len(params) == 0 {
		return nil
	}
	if _, err := client.InsertMany(ctx, params); err != nil {
		return fmt.Errorf("schedule resumes: %w", err)
	}
	w.limiter.logger.Info("concurrency_limit.resume scheduled", "kinds", len(params))
	return nil
}

// resumeKind resumes parked jobs of kind into its free slots, cleans up
// stale slots, and runs again in a second while jobs stay parked.
func (w *ResumeWorker) resumeKind(ctx context.Context, kind string) error {
	logger := w.limiter.logger.With("kind", kind)
	if !w.registry.Has(kind) {
		logger.Warn("concurrency_limit.resume: unknown job kind; skipped")
		return nil
	}
	resumed, remaining, err := w.limiter.cleanUp(ctx, kind, ResumeKind)
	if err != nil {
		return fmt.Errorf("resume %s: %w", kind, err)
	}
	logger.Info("concurrency_limit.resume done", "resumed_jobs", resumed, "still_parked", remaining)
	if remaining {
		// More to resume once these finish (or, unlimited, in the next
		// batch), or jobs still completing their parking.
		return river.JobSnooze(ResumeRescheduleDelay)
	}
	return nil
}
