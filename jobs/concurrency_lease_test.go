package jobs_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/jobs"
)

// TestConcurrencyLeasesShared: two workers share a kind's limit through
// slot leases: the limit holds, both workers run jobs, nothing parks when
// slots free up in time, and every leased slot goes back once idle.
func TestConcurrencyLeasesShared(t *testing.T) {
	t.Parallel()

	const kind = "leases"
	const fullKind = "test.probe." + kind
	pool, tracker, a := limitedProbes(t, kind, 4, 0)

	const n = 300
	insertProbes(t, a, kind, 0, n, 5)
	waitAllDone(t, pool, tracker, fullKind, n, time.Minute)

	require.LessOrEqual(t, tracker.max.Load(), int32(4), "the limit held")
	require.Equal(t, int32(4), tracker.max.Load(), "the limit is used fully")
	_, worked := tracker.snapshot()
	for seq := range n {
		require.Equal(t, 1, worked[seq], "job %d worked %d times", seq, worked[seq])
	}
	require.Zero(t, parkings(t, pool, fullKind), "slots freed in time: nothing parked")
	for _, w := range []string{kind + "-a", kind + "-b"} {
		ran := count(t, pool, "SELECT count(*) FROM river_job WHERE kind = $1 AND attempted_by[1] = $2", fullKind, w)
		require.Greater(t, ran, n/10, "worker %s ran %d of %d jobs: the limit is shared", w, ran, n)
	}
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT admitted FROM concurrency_limits WHERE kind = $1", fullKind) == 0 &&
			count(t, pool, "SELECT COALESCE(sum(slots), 0)::int FROM concurrency_leases") == 0
	}, 10*time.Second, 10*time.Millisecond, "idle leases given back")
}

// TestConcurrencyLeaseExpires: a lease whose holder stopped renewing it (a
// process gone without a liveness row) is freed by concurrency_limit.resume
// after LeaseTTL, and its kind's count follows.
func TestConcurrencyLeaseExpires(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool := testdb.NewPool(t)
	setLimit(t, pool, "demo.sleep", 3)
	_, err := pool.Exec(ctx, `INSERT INTO concurrency_leases (kind, worker_id, slots, renewed_at)
		VALUES ('demo.sleep', 'gone', 2, now() - $1::interval), ('demo.sleep', 'alive', 1, now())`, jobs.LeaseTTL.String())
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE concurrency_limits SET admitted = 3 WHERE kind = 'demo.sleep'`)
	require.NoError(t, err)

	deps, _ := jobtest.NewDeps(t, pool)
	client := jobtest.Start(t, pool, deps, jobtest.Config{})
	client.InsertAndWait(t, jobs.ConcurrencyLimitResumeArgs{JobKind: "demo.sleep"}, nil)
	require.Equal(t, 0, count(t, pool, "SELECT count(*) FROM concurrency_leases WHERE worker_id = 'gone'"))
	require.Equal(t, 1, count(t, pool, "SELECT slots FROM concurrency_leases WHERE worker_id = 'alive'"))
	require.Equal(t, 1, count(t, pool, "SELECT admitted FROM concurrency_limits WHERE kind = 'demo.sleep'"))
}
