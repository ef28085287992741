package limiter

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/db"
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
	require.False(t, k.fast, "a job that waited in vain goes to the line, and new jobs follow it")

	k.inUse, k.fast = 1, true // the keeper's next look: nothing waits in the line
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

// TestLeaserCloseWhileDatabaseDown: a stopping worker's keepers end even
// when every statement fails (the database is down), and close returns.
func TestLeaserCloseWhileDatabaseDown(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	require.NoError(t, err)
	defer pool.Close()
	l := &Limiter{pool: pool, q: db.New(pool), logger: slog.New(slog.DiscardHandler), workerID: "down"}
	s := newLeaser(l, 20*time.Millisecond)
	k := &kindLease{kind: "k", limit: 3, fast: true, leased: 2, wake: make(chan struct{}, 1)}
	s.mu.Lock()
	s.kinds["k"] = k
	s.startKeeper(k)
	s.mu.Unlock()
	time.Sleep(50 * time.Millisecond) // the keeper fails a few rounds

	closed := make(chan struct{})
	go func() {
		s.close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("close hangs while the database is down")
	}
}
