package limiter_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestReleaseRetriedAfterFailure: a per-job release that fails (here on a
// lock timeout: the test holds the kind's limit row while the job ends, as
// a database restart would fail it) no longer leaves the job's slot taken
// and the parked jobs waiting for concurrency_limit.resume (once a minute,
// not run in this test at all): the Limiter cleans the kind up again in the
// background once the database answers, freeing the ended job's slot and
// resuming the next parked job into it.
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
	// ahead and waiting in the worker, or parked again.
	a := insertProbes(t, client, "retry", 0, 1, 300)[0]
	require.Eventually(t, func() bool { return jobState(t, pool, a) == "running" }, 30*time.Second, 5*time.Millisecond)
	bc := insertProbes(t, client, "retry", 1, 2, 1500)
	waitParked(t, pool, bc...)
	b, c := bc[0], bc[1]
	require.Eventually(t, func() bool {
		return jobState(t, pool, b) == "running" &&
			count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = $1 AND NOT reserved`, b) == 1
	}, 30*time.Second, 5*time.Millisecond, "B runs on its own slot")
	require.Zero(t, tracker.workedOf(2), "C waits")

	// B ends while the test holds the kind's limit row: its release fails.
	lock, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer lock.Rollback(ctx) //nolint:errcheck
	_, err = lock.Exec(ctx, `SELECT 1 FROM concurrency_limits WHERE kind = $1 FOR UPDATE`, kind)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return jobState(t, pool, b) == "completed" }, 30*time.Second, 5*time.Millisecond)
	time.Sleep(500 * time.Millisecond) // past the release's lock timeout
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = $1`, b), "B's release failed")
	require.Zero(t, tracker.workedOf(2), "C waits")
	require.NoError(t, lock.Rollback(ctx))

	// The Limiter tries again: B's slot goes and C runs.
	require.Eventually(t, func() bool { return jobState(t, pool, c) == "completed" }, 60*time.Second, 10*time.Millisecond,
		"C was not resumed after B's failed release")
	require.Zero(t, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = $1`, b), "B's slot is freed")
	require.LessOrEqual(t, int(tracker.max.Load()), 1, "the limit held")
	require.Zero(t, count(t, pool, `
		SELECT count(*) FROM concurrency_limits l
		WHERE l.admitted <> (SELECT count(*) FROM concurrency_executions e WHERE e.kind = l.kind)
		                   + (SELECT COALESCE(sum(cl.slots), 0) FROM concurrency_leases cl WHERE cl.kind = l.kind)`))
}
