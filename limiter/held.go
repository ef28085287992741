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

// Admission is how a job of a limited kind was let start by its worker's
// limiter: what it holds while it runs. Tracing reads it (AdmissionFrom)
// for the job's work span.
type Admission struct {
	// Slot is the concurrency slot the job holds until it ends: SlotLeased,
	// SlotLine, or "" (none: it started under a rate alone, or with its
	// kind's limits cleared while it waited).
	Slot string
	// held is how it waited before it started (HeldFrom); wasHeld: it
	// did.
	held    Held
	wasHeld bool
}

// The slots of an Admission.
const (
	// SlotLeased is a slot of the worker's lease of its kind's slots (a
	// per-kind limit alone), taken in the worker's memory.
	SlotLeased = "leased"
	// SlotLine is a slot of its kind's line: decided or granted by the
	// ledger, or handed over in memory by a job that ended.
	SlotLine = "line"
)

// admissionKey is the context key of an Admission.
type admissionKey struct{}

// AdmissionFrom returns how the job whose Work ctx is was let start by
// its kind's limits; ok is false when the limiter did not decide it (its
// kind has no limit).
func AdmissionFrom(ctx context.Context) (a Admission, ok bool) {
	a, ok = ctx.Value(admissionKey{}).(Admission)
	return a, ok
}

// HeldFrom returns how the job whose Work ctx is was held before it
// started; ok is false when it started without waiting.
func HeldFrom(ctx context.Context) (h Held, ok bool) {
	a, _ := ctx.Value(admissionKey{}).(Admission)
	return a.held, a.wasHeld
}

// withAdmission is ctx telling the inner middleware and the worker how the
// job was let start (a).
func withAdmission(ctx context.Context, a Admission) context.Context {
	return context.WithValue(ctx, admissionKey{}, a)
}

// leaseWaitShown is how long a job must have waited for a leased slot for
// its wait to be told (HeldFrom): shorter waits are the lease's own cost.
const leaseWaitShown = time.Millisecond
