package demo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/riverqueue/river"
)

// MaxSleepMS caps demo.sleep's ms (one day).
const MaxSleepMS = 24 * 60 * 60 * 1000

// SleepArgs are the args of demo.sleep.
type SleepArgs struct {
	// MS is how long to sleep, in milliseconds (0 to MaxSleepMS).
	MS int64 `json:"ms"`
	// IgnoreCancel makes the job sleep its full time even when its context is
	// cancelled, as a job that ignores cancellation would.
	IgnoreCancel bool `json:"ignore_cancel"`
	// Fail makes the job return an error after sleeping, so that retries
	// (and discards after max_attempts) can be shown from the CLI.
	Fail bool `json:"fail,omitempty"`
}

// ErrSleepFail is the error a demo.sleep job with "fail": true returns.
var ErrSleepFail = errors.New("demo.sleep failed as asked (\"fail\": true)")

// Kind is the River job kind.
func (SleepArgs) Kind() string { return "demo.sleep" }

// Validate checks the range of ms.
func (a SleepArgs) Validate() error {
	if a.MS < 0 || a.MS > MaxSleepMS {
		return fmt.Errorf("field \"ms\": must be between 0 and %d, got %d", MaxSleepMS, a.MS)
	}
	return nil
}

// SleepWorker works demo.sleep: it sleeps, returning early with the
// context's error when cancelled unless the job ignores cancellation, then
// fails if asked to.
type SleepWorker struct {
	river.WorkerDefaults[SleepArgs]
	jobTimeout time.Duration
}

// Timeout lets a job sleep as long as it asked for, plus the client's job
// timeout as slack.
func (w *SleepWorker) Timeout(job *river.Job[SleepArgs]) time.Duration {
	return time.Duration(job.Args.MS)*time.Millisecond + w.jobTimeout
}

// Work sleeps.
func (w *SleepWorker) Work(ctx context.Context, job *river.Job[SleepArgs]) error {
	if err := sleep(ctx, time.Duration(job.Args.MS)*time.Millisecond, job.Args.IgnoreCancel); err != nil {
		return err
	}
	if job.Args.Fail {
		return ErrSleepFail
	}
	return nil
}

// sleep waits d, or until ctx is done unless ignoreCancel is set.
func sleep(ctx context.Context, d time.Duration, ignoreCancel bool) error {
	if d == 0 {
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	if ignoreCancel {
		<-timer.C
		return nil
	}
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("demo.sleep interrupted: %w", context.Cause(ctx))
	}
}
