package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/limiter"
)

// TestSlotsHandedOverInMemory: a breaker over parked jobs raised to 1, one
// worker: the jobs resumed ahead wait in the worker, and each job that ends
// hands its slot to the oldest of them in memory. The limit holds, the jobs
// start in job-id order, each runs once, and when the line is empty nothing
// is left: no slot, no waiter, a count of 0.
func TestSlotsHandedOverInMemory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.probe.handover"
	const n = 20
	url, pool, tracker := probeKind(t, "handover", -1)
	client, lim := startProbeWorkerSignals(t, url, "handover-a", "handover", tracker, 0, nil)
	ids := insertProbes(t, client, "handover", 0, n, 20)
	waitParked(t, pool, ids...)

	setter, err := limiter.New(limiter.Config{Pool: pool})
	require.NoError(t, err)
	require.NoError(t, setter.SetConcurrency(ctx, kind, 1))
	handed := lim.TestSignals.HandedOver.WaitOrTimeout()
	require.Contains(t, ids, handed, "a job of the kind was handed a slot in memory")
	waitAllDone(t, pool, tracker, kind, n, time.Minute)

	require.Equal(t, int32(1), tracker.max.Load(), "the limit holds")
	tracker.mu.Lock()
	order := append([]int(nil), tracker.order...)
	tracker.mu.Unlock()
	for i, seq := range order {
		require.Equal(t, i, seq, "jobs start in job-id order: %v", order)
	}
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT count(*) FROM concurrency_executions WHERE kind = $1", kind) == 0 &&
			count(t, pool, "SELECT count(*) FROM concurrency_waiters WHERE kind = $1", kind) == 0 &&
			count(t, pool, "SELECT admitted FROM concurrency_limits WHERE kind = $1", kind) == 0
	}, 10*time.Second, 20*time.Millisecond, "no slot, waiter or count left")
}
