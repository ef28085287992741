package jobs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/riverqueue/river"
)

// MaxDemoSleepMS caps demo.sleep's ms (one day).
const MaxDemoSleepMS = 24 * 60 * 60 * 1000

// DemoSleepArgs are the args of demo.sleep.
type DemoSleepArgs struct {
	// MS is how long to sleep, in milliseconds (0 to MaxDemoSleepMS).
	MS int64 `json:"ms"`
	// IgnoreCancel makes the job sleep its full time even when its context is
	// cancelled, as a job that ignores cancellation would.
	IgnoreCancel bool `json:"ignore_cancel"`
	// Fail makes the job return an error after sleeping, so that retries
	// (and discards after max_attempts) can be shown from the CLI.
	Fail bool `json:"fail,omitempty"`
}

// ErrDemoSleepFail is the error a demo.sleep job with "fail": true returns.
var ErrDemoSleepFail = errors.New("demo.sleep failed as asked (\"fail\": true)")

// Kind is the River job kind.
func (DemoSleepArgs) Kind() string { return "demo.sleep" }

// Validate checks the range of ms.
func (a DemoSleepArgs) Validate() error {
	if a.MS < 0 || a.MS > MaxDemoSleepMS {
		return fmt.Errorf("field \"ms\": must be between 0 and %d, got %d", MaxDemoSleepMS, a.MS)
	}
	return nil
}

// DemoSleepWorker works demo.sleep: it sleeps, returning early with the
// context's error when cancelled unless the job ignores cancellation, then
// fails if asked to.
type DemoSleepWorker struct {
	river.WorkerDefaults[DemoSleepArgs]
	deps *Deps
}

// Timeout lets a job sleep as long as it asked for, plus the client's job
// timeout as slack.
func (w *DemoSleepWorker) Timeout(job *river.Job[DemoSleepArgs]) time.Duration {
	return time.Duration(job.Args.MS)*time.Millisecond + w.deps.jobTimeout()
}

// Work sleeps.
func (w *DemoSleepWorker) Work(ctx context.Context, job *river.Job[DemoSleepArgs]) error {
	if err := sleep(ctx, time.Duration(job.Args.MS)*time.Millisecond, job.Args.IgnoreCancel); err != nil {
		return err
	}
	if job.Args.Fail {
		return ErrDemoSleepFail
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
