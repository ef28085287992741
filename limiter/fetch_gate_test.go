package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/limiter"
	"github.com/sluice-dev/sluice/maintenance"
)

// TestFetchGate: while jobs wait in a worker for their turn, it fetches no
// more than MaxFetchedWaiting minus those waiting, however many River asks
// for; and the fetch cut short wakes its queue once they stop waiting, so
// the rest are fetched without waiting for River's poll interval (set to a
// minute here). Nothing parks and the key runs in job-id order.
func TestFetchGate(t *testing.T) {
	t.Parallel()
	const kind = "test.keyed.gate"
	url := testdb.New(t)
	pool := openPool(t, url)
	ctx := context.Background()
	lim, err := limiter.New(limiter.Config{Pool: pool})
	require.NoError(t, err)
	require.NoError(t, lim.SetPerKey(ctx, kind, []string{"tenant"}, 1))
	logParkings(t, pool)

	wpool, err := db.Open(ctx, url, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(wpool.Close)
	deps, _ := jobtest.NewJobsConfig(t, wpool, app.JobsConfig{WorkerID: "gate", ParkAfter: time.Minute})
	tracker := newKeyedTracker()
	client := jobtest.Start(t, wpool, deps, jobtest.Config{
		ID: "gate",
		Configure: func(c *river.Config) {
			river.AddWorkerArgs(c.Workers, keyedArgs{K: "gate"}, &keyedWorker{tracker: tracker})
			c.Queues = map[string]river.QueueConfig{
				river.QueueDefault: {MaxWorkers: 1000},
				maintenance.Queue:  {MaxWorkers: 5},
			}
			c.FetchPollInterval = time.Minute
		},
	})

	// One long job holds the key; 100 then wait behind it in the worker.
	insertKeyed(t, client, "gate", "t", 0, 1, 1500)
	require.Eventually(t, func() bool { return tracker.runningNow() == 1 }, 10*time.Second, 5*time.Millisecond)
	insertKeyed(t, client, "gate", "t", 1, 100, 0)
	require.Eventually(t, func() bool {
		return count(t, pool, `SELECT count(*) FROM concurrency_waiters WHERE worker_id = 'gate'`) == 100
	}, 10*time.Second, 10*time.Millisecond)
	// 600 more: River asks for 899, the gate lets 156 come.
	insertKeyed(t, client, "gate", "t", 101, 600, 0)
	mostRunning := 0
	for deadline := time.Now().Add(300 * time.Millisecond); time.Now().Before(deadline); {
		mostRunning = max(mostRunning, count(t, pool, `SELECT count(*) FROM river_job WHERE kind = $1 AND state = 'running'`, kind))
		time.Sleep(10 * time.Millisecond)
	}
	require.Greater(t, mostRunning, 101, "the gate let no job be fetched")
	require.LessOrEqual(t, mostRunning, 1+limiter.MaxFetchedWaiting,
		"a worker with 100 jobs waiting fetched more than %d minus those", limiter.MaxFetchedWaiting)

	// Once the long job ends, the line drains; the queue owed a fetch is
	// woken, not left to the one-minute poll.
	require.Eventually(t, func() bool {
		return count(t, pool, `SELECT count(*) FROM river_job WHERE kind = $1 AND state = 'completed'`, kind) == 701
	}, 30*time.Second, 10*time.Millisecond)
	require.Zero(t, count(t, pool, `SELECT count(*) FROM test_parkings`), "jobs parked")
	_, _, starts, _ := tracker.snapshot()
	for i, s := range starts {
		require.Equal(t, i, s.seq, "jobs of the key started out of order")
	}
}
