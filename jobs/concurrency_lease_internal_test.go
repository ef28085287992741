package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// newTestLease is a leaser holding leased slots of kind "k" under limit,
// inUse of them in use, as its keeper last saw it; keeper marks it as
// running so that nothing here talks to a database.
func newTestLease(limit int32, leased, inUse int) (*leaser, *kindLease) {
	s := newLeaser(&Limiter{}, 20*time.Millisecond)
	k := &kindLease{kind: "k", limit: limit, fast: true, leased: leased, inUse: inUse, keeper: true, wake: make(chan struct{}, 1)}
	s.kinds["k"] = k
	return s, k
}

// TestLeaserCapsAtLimit: leased slots above a lowered limit are not used:
// a job starts only while fewer jobs than the limit run.
func TestLeaserCapsAtLimit(t *testing.T) {
	ctx := context.Background()
	st := limitState{kind: "k", limit: 2}
	s, k := newTestLease(2, 10, 3)
	require.False(t, s.acquire(ctx, st, 1), "3 run under a limit of 2: no new start")

	k.inUse = 1
	require.True(t, s.acquire(ctx, st, 2))
	require.False(t, s.acquire(ctx, st, 3), "2 run under a limit of 2")

	// A slot freed above the limit goes back, not to a waiting job.
	k.inUse = 3
	s.release("k")
	require.Equal(t, 2, k.inUse)
	require.Equal(t, 9, k.leased)
	require.Equal(t, 1, k.toReturn)
}

// TestLeaserLostSlots: slots the database no longer counts (an expired
// lease) are dropped when their jobs end, never handed on.
func TestLeaserLostSlots(t *testing.T) {
	s, k := newTestLease(5, 0, 2) // the lease was lost with 2 jobs on it
	w := &leaseWaiter{jobID: 9, ready: make(chan struct{})}
	k.waiters = append(k.waiters, w)
	s.release("k")
	require.Equal(t, 1, k.inUse)
	require.Zero(t, k.leased)
	require.Zero(t, k.toReturn)
	select {
	case <-w.ready:
		t.Fatal("a lost slot was handed to a waiting job")
	default:
	}
}

// TestLeaserOverLimit: while the slots taken across all workers exceed the
// kind's limit, a worker starts nothing on its spare slots and gives every
// freed slot back.
func TestLeaserOverLimit(t *testing.T) {
	ctx := context.Background()
	st := limitState{kind: "k", limit: 4}
	s, k := newTestLease(4, 3, 2)
	k.overLimit = true
	require.False(t, s.acquire(ctx, st, 1), "over the limit: no new start on a spare slot")
	s.release("k")
	require.Equal(t, 1, k.inUse)
	require.Equal(t, 2, k.leased)
	require.Equal(t, 1, k.toReturn, "the freed slot goes back")
}
