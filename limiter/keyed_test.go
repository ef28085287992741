package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/limiter"
)

// newLimiter is a Limiter on pool for changing limits, as the CLI's.
func newLimiter(t *testing.T, url string) *limiter.Limiter {
	t.Helper()
	lim, err := limiter.New(limiter.Config{Pool: openPool(t, url)})
	require.NoError(t, err)
	return lim
}

// TestPerKeyLimit: a per-key limit of 2 beside a per-kind limit of 6, two
// workers, 5 tenants of 20 jobs: no tenant ever has more than 2 jobs
// running, the kind never more than 6, every job runs once, and within a
// tenant the jobs that waited start in job-id order.
func TestPerKeyLimit(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	const kind = "perkey"
	const fullKind = "test.keyed." + kind
	url := testdb.New(t)
	pool := openPool(t, url)
	logParkings(t, pool)
	lim := newLimiter(t, url)
	require.NoError(t, lim.SetPerKey(ctx, fullKind, []string{"tenant"}, 2))
	require.NoError(t, lim.SetConcurrency(ctx, fullKind, 6))
	tracker := newKeyedTracker()
	a, _ := startKeyedWorker(t, url, kind+"-a", kind, tracker, 20)
	startKeyedWorker(t, url, kind+"-b", kind, tracker, 20)

	ids := map[string][]int64{}
	for i, tenant := range []string{"t1", "t2", "t3", "t4", "t5"} {
		ids[tenant] = insertKeyed(t, a, kind, tenant, i*100, 20, 30)
	}
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT count(*) FROM river_job WHERE kind = $1 AND state = 'completed'", fullKind) == 100
	}, time.Minute, 20*time.Millisecond)

	maxRunning, perKey, starts, worked := tracker.snapshot()
	require.LessOrEqual(t, maxRunning, 6, "the per-kind limit holds")
	require.Greater(t, maxRunning, 2, "tenants run side by side")
	for tenant, n := range perKey {
		require.LessOrEqual(t, n, 2, "tenant %s", tenant)
	}
	require.Len(t, worked, 100)
	for seq, n := range worked {
		require.Equal(t, 1, n, "seq %d ran once", seq)
	}
	// Within a tenant, the jobs that waited start in job-id order: a job
	// never overtakes an older one that waits (two resumed together, as
	// many as the key's limit, race to their workers).
	parked := parkedSeqs(t, pool)
	require.NotEmpty(t, parked, "jobs parked")
	requireStartOrder(t, starts, parked, 2)
	require.Zero(t, count(t, pool, "SELECT count(*) FROM concurrency_parked_jobs"))
	require.Zero(t, count(t, pool, "SELECT count(*) FROM concurrency_executions"))
	require.Zero(t, count(t, pool, "SELECT admitted FROM concurrency_limits WHERE kind = $1", fullKind))
	require.Zero(t, count(t, pool, "SELECT count(*) FROM sluice_concurrency_keys"), "keys without activity leave no rows")
	require.Zero(t, count(t, pool, "SELECT count(*) FROM concurrency_key_turns"))
}

// TestKeyedFairness: tenant A has 2,000 jobs of 50 ms waiting under a
// per-kind limit of 4 (and a per-key limit of 4); tenant B then gets 5
// jobs. Free slots go round-robin across the tenants with waiting jobs, so
// B's jobs do not wait behind A's backlog: between B's insert and B's last
// finish, at most 40 of A's jobs start (about one per turn of the round).
func TestKeyedFairness(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	const kind = "fair"
	const fullKind = "test.keyed." + kind
	url := testdb.New(t)
	pool := openPool(t, url)
	lim := newLimiter(t, url)
	require.NoError(t, lim.SetConcurrency(ctx, fullKind, 4))
	require.NoError(t, lim.SetPerKey(ctx, fullKind, []string{"tenant"}, 4))
	tracker := newKeyedTracker()
	a, _ := startKeyedWorker(t, url, kind+"-a", kind, tracker, 20)
	startKeyedWorker(t, url, kind+"-b", kind, tracker, 20)

	insertKeyed(t, a, kind, "A", 0, 2000, 50)
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT count(*) FROM river_job WHERE kind = $1 AND state = 'available'", fullKind) == 0 &&
			count(t, pool, "SELECT count(*) FROM concurrency_parked_jobs p JOIN river_job j ON j.id = p.job_id WHERE j.state = 'pending'") > 1500
	}, time.Minute, 20*time.Millisecond, "A's backlog waits, parked")

	t0 := time.Now()
	insertKeyed(t, a, kind, "B", 10000, 5, 50)
	var lastB time.Time
	require.Eventually(t, func() bool {
		lastB = time.Time{}
		for seq := 10000; seq < 10005; seq++ {
			end := tracker.endOf(seq)
			if end.IsZero() {
				return false
			}
			lastB = maxTime(lastB, end)
		}
		return true
	}, time.Minute, 10*time.Millisecond, "B's jobs ran")
	_, perKey, starts, _ := tracker.snapshot()
	aStarts := 0
	for _, s := range starts {
		if s.tenant == "A" && !s.at.Before(t0) && !s.at.After(lastB) {
			aStarts++
		}
	}
	t.Logf("A's jobs started between B's insert and B's last finish: %d (B took %s)", aStarts, lastB.Sub(t0).Round(time.Millisecond))
	require.LessOrEqual(t, aStarts, 40, "B does not wait behind A's backlog")
	require.LessOrEqual(t, perKey["A"], 4)
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// attemptedAts returns the attempted_at of kind's completed jobs: when
// their last (counted) start happened.
func attemptedAts(t *testing.T, pool *pgxpool.Pool, kind string) []time.Time {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT attempted_at FROM river_job WHERE kind = $1 AND state = 'completed'`, kind)
	require.NoError(t, err)
	ts, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
	require.NoError(t, err)
	return ts
}

// TestRateLimit: a rate of 20/1s over 10 s, two workers, a backlog of 0 ms
// jobs: no sliding 1-s window holds more than 20 starts (River's
// attempted_at of each execution), and the achieved rate is at least 90%
// of 20/s.
func TestRateLimit(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	const kind = "rate"
	const fullKind = "test.keyed." + kind
	url := testdb.New(t)
	pool := openPool(t, url)
	lim := newLimiter(t, url)
	require.NoError(t, lim.SetRate(ctx, fullKind, limiter.Rate{Max: 20, Per: time.Second}, nil))
	tracker := newKeyedTracker()
	a, _ := startKeyedWorker(t, url, kind+"-a", kind, tracker, 20)
	startKeyedWorker(t, url, kind+"-b", kind, tracker, 20)

	start := time.Now()
	insertKeyed(t, a, kind, "x", 0, 260, 0)
	time.Sleep(10*time.Second - time.Since(start)) // the measured span itself
	var ts []time.Time
	require.Eventually(t, func() bool {
		ts = attemptedAts(t, pool, fullKind)
		return len(ts) >= 180
	}, 5*time.Second, 50*time.Millisecond)
	require.LessOrEqual(t, maxInWindow(ts, time.Second), 20, "at most 20 starts in any 1 s")
	first := ts[0]
	inTen := 0
	for _, at := range ts {
		if at.Sub(first) < 10*time.Second {
			inTen++
		}
	}
	t.Logf("starts in the first 10 s: %d (of 200 allowed)", inTen)
	require.GreaterOrEqual(t, inTen, 180, "at least 90%% of the rate")
	_, _, _, worked := tracker.snapshot()
	for seq, n := range worked {
		require.Equal(t, 1, n, "seq %d ran once", seq)
	}
}
