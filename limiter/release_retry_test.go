package limiter_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestReleaseRetriedAfterFailure: a release that fails (here on a lock
// timeout: the test holds the kind's ledger lock while a job ends, as a
// database restart would fail it) no longer leaves the job's slot taken
// and the parked jobs waiting for concurrency_limit.resume (once a minute,
// not run in this test at all): the Limiter writes the release again in
// the background once the database answers, and the kind moves on.
func TestReleaseRetriedAfterFailure(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url, pool, tracker := probeKind(t, "retry", 1)
	// The worker's statements give up on a lock after 200ms.
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	client := startProbeWorker(t, url+sep+"lock_timeout=200", "retry-a", "retry", tracker, 20*time.Millisecond, nil)
	const kind = "test.probe.retry"

	// A takes the one slot; B and C park behind it. When A ends, B is
	// granted its slot (resumed with the slot reserved), C waits: resumed
	// ahead and waiting in the worker, or parked again. A runs 2 s, so that
	// both have parked before it ends on a loaded machine (make test failed
	// it once with 300 ms: B was resumed before C's parking landed).
	a := insertProbes(t, client, "retry", 0, 1, 2000)[0]
	require.Eventually(t, func() bool { return jobState(t, pool, a) == "running" }, 30*time.Second, 5*time.Millisecond)
	bc := insertProbes(t, client, "retry", 1, 2, 1500)
	waitParked(t, pool, bc...)
	b, c := bc[0], bc[1]
	require.Eventually(t, func() bool {
		return jobState(t, pool, b) == "running" &&
			count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = $1 AND NOT reserved`, b) == 1
	}, 30*time.Second, 5*time.Millisecond, "B runs on its own slot")

	// B ends while the test holds the kind's ledger lock: its release (or
	// the move of its slot to C, handed over in memory) fails.
	lock, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer lock.Rollback(ctx) //nolint:errcheck
	_, err = lock.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('sluice.limit_row:' || $1, 0))`, kind)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return jobState(t, pool, b) == "completed" }, 30*time.Second, 5*time.Millisecond)
	time.Sleep(500 * time.Millisecond) // past the release's lock timeout
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = $1`, b), "B's release failed")
	require.NoError(t, lock.Rollback(ctx))

	// The Limiter tries again: B's slot goes (to C, or freed and granted
	// to C) and C runs.
	require.Eventually(t, func() bool { return jobState(t, pool, c) == "completed" }, 60*time.Second, 10*time.Millisecond,
		"C did not run after B's failed release")
	require.Eventually(t, func() bool {
		return count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = ANY($1)`, []int64{b, c}) == 0
	}, 10*time.Second, 10*time.Millisecond, "the slots of B and C are freed")
	require.LessOrEqual(t, int(tracker.max.Load()), 1, "the limit held")
	require.Zero(t, count(t, pool, `
		SELECT count(*) FROM concurrency_limits l
		WHERE l.admitted <> (SELECT count(*) FROM concurrency_executions e WHERE e.kind = l.kind)
		                   + (SELECT COALESCE(sum(cl.slots), 0) FROM concurrency_leases cl WHERE cl.kind = l.kind)`))
}
