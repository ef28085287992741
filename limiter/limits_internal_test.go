package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/limiter/internal/ledger"
	"github.com/sluice-dev/sluice/limiter/internal/local"
)

// TestHeldAsNamesOnlyTheLimitsHeld: a grant made under the limits the
// worker's copy holds is stamped with the changes the copy holds; one made
// under other limits (a change the copy has not read, or one it read
// since) is not, nor is one checked against a copy kept when a read failed
// (its changes not known).
func TestHeldAsNamesOnlyTheLimitsHeld(t *testing.T) {
	ctx := context.Background()
	held := ledger.Limits{Kind: "k", Present: true, Fields: []string{"tenant"}, KeyMax: 2, RateMax: 3,
		RatePeriod: time.Second, RatePerKey: true, Admitted: 4}
	c := &limitsCopy{}
	c.gen.Store(6)
	c.cur.Store(&limitsSnapshot{kinds: map[string]ledger.Limits{"k": held}, loaded: time.Now(), gen: 6})

	counted := held
	counted.Admitted, counted.HasParked = 9, true // counts are not settings
	require.Equal(t, uint64(6), c.heldAs(ctx, "k", counted.Tag()))

	for name, other := range map[string]func(l *ledger.Limits){
		"max":      func(l *ledger.Limits) { l.Max = 1 },
		"fields":   func(l *ledger.Limits) { l.Fields = []string{"user"} },
		"key max":  func(l *ledger.Limits) { l.KeyMax = 3 },
		"rate":     func(l *ledger.Limits) { l.RateMax = 4 },
		"period":   func(l *ledger.Limits) { l.RatePeriod = 2 * time.Second },
		"per kind": func(l *ledger.Limits) { l.RatePerKey = false },
		"no row":   func(l *ledger.Limits) { *l = ledger.Limits{Kind: "k"} },
	} {
		l := held
		other(&l)
		require.Zero(t, c.heldAs(ctx, "k", l.Tag()), name)
	}
	require.Equal(t, uint64(6), c.heldAs(ctx, "none", ledger.Limits{Kind: "none"}.Tag()), "a kind without a row, as held")
	require.Zero(t, c.heldAs(ctx, "k", ""), "no tag")

	c.cur.Store(&limitsSnapshot{kinds: map[string]ledger.Limits{"k": held}, loaded: time.Now()})
	require.Zero(t, c.heldAs(ctx, "k", held.Tag()), "a copy whose changes are not known")
}

// TestACopyReadBeforeAChangeHeardIsNotUsed: a read of the limits that
// began before a change the worker hears can store its copy after the
// change expired the one stored; that copy holds the limits before the
// change and must not be used (a job decided under them would be taken as
// fitting the limits in force, and begin without being decided again).
func TestACopyReadBeforeAChangeHeardIsNotUsed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.copy.stale"
	l := listeningLimiter(t)
	pool := l.pool
	require.NoError(t, l.SetConcurrency(ctx, kind, 1))
	before, err := l.limits.snapshot(ctx)
	require.NoError(t, err)
	require.Equal(t, int32(1), before.of(kind).Max)

	_, err = pool.Exec(ctx, `UPDATE concurrency_limits SET max_concurrency = 2 WHERE kind = $1`, kind)
	require.NoError(t, err)
	l.limits.expire(kind)      // the change is heard
	l.limits.cur.Store(before) // a read that began before it stores its copy last
	require.Nil(t, l.limits.held(), "held gave a copy that misses a change heard")

	lim, err := l.limits.of(ctx, kind)
	require.NoError(t, err)
	require.Equal(t, int32(2), lim.Max, "the copy read before the change was used after it was heard")
}

// TestAChangeOfAnotherKindLeavesADecisionBe: a job decided and not begun
// is decided again when the worker hears a change of its own kind's limits
// (or one that names no kind, or its listener connecting again: a change
// may have been missed), not when it hears a change of another kind's: a
// decision again is a ledger transaction, and while it runs younger jobs
// of the job's line may start first.
func TestAChangeOfAnotherKindLeavesADecisionBe(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind, other = "test.recheck.mine", "test.recheck.other"
	l := listeningLimiter(t)
	require.NoError(t, l.SetRate(ctx, kind, Rate{Max: 5, Per: time.Second}, nil))

	q := l.queues.of(kind)
	decided := func(id int64) *local.Job {
		j := q.Fetch([]local.Fetched{{ID: id, Fetched: time.Now()}})[0]
		j.Stamp(l.limits.gen.Load())
		require.True(t, q.Work(id, local.NoSlot))
		return j
	}
	j := decided(1)
	l.limits.expire(other)
	require.False(t, l.limitCameAfter(ctx, q, j), "a change of another kind made the job be decided again")
	require.Equal(t, l.limits.gen.Load(), j.Stamped(), "the job holds every change heard")
	q.Forget(j.ID)

	for name, changed := range map[string]string{"its kind": kind, "no kind named": ""} {
		j := decided(map[string]int64{kind: 2, "": 3}[changed])
		l.limits.expire(changed)
		require.True(t, l.limitCameAfter(ctx, q, j), "a change of %s left the job as it was decided", name)
		q.Forget(j.ID)
	}
}

// listeningLimiter is a Limiter of worker "w1" on a fresh database, its
// copy of the limits as its listener leaves it on connecting (trusted
// until a change is heard); no listener runs.
func listeningLimiter(t *testing.T) *Limiter {
	t.Helper()
	ctx := context.Background()
	pool, err := pgkit.Open(ctx, testdb.New(t), 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	l, err := New(Config{Pool: pool, WorkerID: "w1"})
	require.NoError(t, err)
	t.Cleanup(l.Flush)
	l.limits.connected()
	return l
}
