package limiter

import (
	"context"
	"time"
)

// Held is how a job that runs was held by its kind's limits in its worker
// before it started: since when it waited, and for what. Tracing reads it
// (HeldFrom) to put the wait on the job's work span.
type Held struct {
	// Since is when the job began to wait: when it was fetched.
	Since time.Time
	// Reason is the limit that held it: limit (the per-kind concurrency
	// limit), fifo (older jobs of the kind went first), breaker, rate,
	// key_limit, key_fifo or key_rate (those of its key).
	Reason string
}

// heldKey is the context key of a Held.
type heldKey struct{}

// HeldFrom returns how the job whose Work ctx is was held before it
// started; ok is false when it started without waiting.
func HeldFrom(ctx context.Context) (h Held, ok bool) {
	h, ok = ctx.Value(heldKey{}).(Held)
	return h, ok
}

// withHeld is ctx telling the inner middleware and the worker that the job
// was held (h).
func withHeld(ctx context.Context, h Held) context.Context {
	return context.WithValue(ctx, heldKey{}, h)
}

// leaseWaitShown is how long a job must have waited for a leased slot for
// its wait to be told (HeldFrom): shorter waits are the lease's own cost.
const leaseWaitShown = time.Millisecond
