package limiter_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/limiter"
	"github.com/sluice-dev/sluice/maintenance"
)

// TestFetchGate: while jobs wait in a worker for their turn, it fetches no
// more than MaxFetchedWaiting minus those waiting, however many River asks
// for; and the fetch cut short wakes its queue once they stop waiting, so
// the rest are fetched without waiting for River's poll interval (set to a
// minute here). Nothing parks (no key has more jobs waiting than a
// decision lets wait) and each key runs in job-id order.
func TestFetchGate(t *testing.T) {
	t.Parallel()
	const kind = "test.keyed.gate"
	const keys = 100
	url := testdb.New(t)
	pool := openPool(t, url)
	ctx := context.Background()
	lim, err := limiter.New(limiter.Config{Pool: pool})
	require.NoError(t, err)
	require.NoError(t, lim.SetPerKey(ctx, kind, []string{"tenant"}, 1))
	logParkings(t, pool)

	wpool, err := pgkit.Open(ctx, url, 10*time.Second)
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
	// insert adds one job of each key, sequence numbers from seq on.
	insert := func(seq, ms int) {
		params := make([]river.InsertManyParams, keys)
		for k := range keys {
			params[k] = river.InsertManyParams{Args: keyedArgs{Seq: seq + k, Tenant: fmt.Sprintf("t%03d", k), MS: ms, K: "gate"}}
		}
		_, err := client.InsertMany(ctx, params)
		require.NoError(t, err)
	}

	// A long job holds each key; 100 then wait behind them in the worker,
	// one per key. Long enough (20 s) that all 100 run at once even when a
	// loaded machine (the whole suite at once) takes seconds to start them.
	insert(0, 20_000)
	require.Eventually(t, func() bool {
		return count(t, pool, `SELECT count(*) FROM river_job WHERE kind = $1 AND state = 'running'`, kind) == keys
	}, 20*time.Second, 5*time.Millisecond)
	insert(keys, 0)
	require.Eventually(t, func() bool {
		return count(t, pool, `SELECT count(*) FROM concurrency_waiters WHERE worker_id = 'gate'`) == keys
	}, 10*time.Second, 10*time.Millisecond)
	// 500 more (5 per key): River asks for 800, the gate lets 156 come.
	for i := range 5 {
		insert((2+i)*keys, 0)
	}
	mostRunning := 0
	for deadline := time.Now().Add(300 * time.Millisecond); time.Now().Before(deadline); {
		mostRunning = max(mostRunning, count(t, pool, `SELECT count(*) FROM river_job WHERE kind = $1 AND state = 'running'`, kind))
		time.Sleep(10 * time.Millisecond)
	}
	require.Greater(t, mostRunning, 2*keys, "the gate let no job be fetched")
	require.LessOrEqual(t, mostRunning, keys+limiter.MaxFetchedWaiting,
		"a worker with %d jobs waiting fetched more than %d minus those", keys, limiter.MaxFetchedWaiting)

	// Once the long jobs end, the lines drain; the queue owed a fetch is
	// woken, not left to the one-minute poll.
	require.Eventually(t, func() bool {
		return count(t, pool, `SELECT count(*) FROM river_job WHERE kind = $1 AND state = 'completed'`, kind) == 7*keys
	}, 60*time.Second, 10*time.Millisecond)
	require.Zero(t, count(t, pool, `SELECT count(*) FROM test_parkings`), "jobs parked")
	_, perKey, starts, _ := tracker.snapshot()
	last := map[string]int{}
	for _, s := range starts {
		if prev, ok := last[s.tenant]; ok {
			require.Greater(t, s.seq, prev, "jobs of key %s started out of order", s.tenant)
		}
		last[s.tenant] = s.seq
	}
	for tenant, n := range perKey {
		require.Equal(t, 1, n, "key %s ran %d at once", tenant, n)
	}
}
