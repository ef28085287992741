package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/limiter"
)

// TestHandOverSlotsKeepsCounts: writing a slot handed over in memory moves
// the ended job's slot row to the job that took it, the kind's count
// unchanged, and takes that job out of the waiters; when a grant round
// reserved a slot for the job meanwhile, the job keeps that one, claimed,
// and the ended job's slot is freed, the count lowered by one.
func TestHandOverSlotsKeepsCounts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.NewPool(t)
	q := db.New(pool)
	jobtest.SetLimit(t, pool, "demo.sleep", 5)
	worker := "a"
	require.NoError(t, q.UpsertWaiters(ctx, db.UpsertWaitersParams{Kind: "demo.sleep", JobIds: []int64{8, 10}, Keys: []string{"", ""},
		Reasons: []string{"limit", "limit"}, WorkerID: &worker}))
	admitSlotRow(t, pool, 7, "a")
	admitSlotRow(t, pool, 9, "a")
	// A grant round reserved a slot for job 10 (waiting in a).
	require.NoError(t, q.ReserveGrants(ctx, db.ReserveGrantsParams{Kind: "demo.sleep", JobIds: []int64{10}, Keys: []string{""},
		WorkerIds: []string{"a"}, Claimed: []bool{false}}))
	require.Equal(t, 3, count(t, pool, "SELECT admitted FROM concurrency_limits WHERE kind = 'demo.sleep'"))

	lowered, err := q.HandOverSlots(ctx, db.HandOverSlotsParams{FromIds: []int64{7, 9}, ToIds: []int64{8, 10}, WorkerID: "a"})
	require.NoError(t, err)
	require.Equal(t, []string{"demo.sleep"}, lowered, "job 10's own grant frees job 9's slot")

	type slot struct {
		JobID    int64
		WorkerID string
		Reserved bool
	}
	rows, err := pool.Query(ctx, "SELECT job_id, worker_id, reserved FROM concurrency_executions ORDER BY job_id")
	require.NoError(t, err)
	var slots []slot
	for rows.Next() {
		var s slot
		require.NoError(t, rows.Scan(&s.JobID, &s.WorkerID, &s.Reserved))
		slots = append(slots, s)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []slot{{8, "a", false}, {10, "a", false}}, slots)
	require.Equal(t, 2, count(t, pool, "SELECT admitted FROM concurrency_limits WHERE kind = 'demo.sleep'"), "the count equals the rows")
	require.Zero(t, count(t, pool, "SELECT count(*) FROM concurrency_waiters"), "the jobs handed a slot left the waiters")

	// Another worker's slot is never moved.
	_, err = q.HandOverSlots(ctx, db.HandOverSlotsParams{FromIds: []int64{8}, ToIds: []int64{11}, WorkerID: "b"})
	require.NoError(t, err)
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM concurrency_executions WHERE job_id = 8"))
}

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
