// Package maintenance is the framework every maintenance kind runs under: a
// session-level advisory lock per kind (pg_try_advisory_lock(
// hashtextextended(KIND, 0)), held for the whole run on a dedicated
// connection and watched while the run works) and a journal row per run in
// maintenance_runs. A run whose lock another session holds is recorded as
// skipped_locked and completes; a run whose lock's connection dies is
// stopped and recorded as failed.
//
// An application's own maintenance kinds use it as the built-in ones do:
// their args return InsertOpts() (the maintenance queue), and their worker's
// Work calls Runner.Run with the body of the run.
package maintenance

import (
	"context"
	"errors"
	"time"

	"github.com/riverqueue/river"
)

// Maintenance run statuses, as recorded in maintenance_runs.status.
const (
	RunFailed        = "failed"
	RunRunning       = "running"
	RunSkippedLocked = "skipped_locked"
	RunSucceeded     = "succeeded"
)

// Queue is the River queue maintenance kinds are inserted into.
const Queue = "maintenance"

// MaxAttempts is how often River tries a failed maintenance run before
// discarding it; the next scheduled run tries again anyway.
const MaxAttempts = 3

// DefaultLockCheckInterval is how often a maintenance run checks that the
// connection holding its lock is alive.
const DefaultLockCheckInterval = 5 * time.Second

// DefaultTimeout bounds one maintenance run: the seed's lease TTL.
const DefaultTimeout = 30 * time.Minute

// ErrLockLost ends a maintenance run whose advisory lock's connection died.
var ErrLockLost = errors.New("advisory lock lost: its connection died")

// InsertOpts are the insert options of every maintenance kind: its args type
// returns them from InsertOpts.
func InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: Queue, MaxAttempts: MaxAttempts}
}

// Result is what a maintenance run reports for its journal row.
type Result struct {
	// Affected is the number of rows the run changed.
	Affected int64
	// Details is stored in maintenance_runs.details.
	Details map[string]any
}

// Func is the body of a maintenance run. It is called only while this
// process holds the kind's session advisory lock.
type Func func(ctx context.Context) (Result, error)
