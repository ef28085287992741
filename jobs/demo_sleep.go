package jobs

import (
	"context"
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
}

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
// context's error when cancelled unless the job ignores cancellation.
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
	d := time.Duration(job.Args.MS) * time.Millisecond
	if d == 0 {
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	if job.Args.IgnoreCancel {
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
