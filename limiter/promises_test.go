package limiter_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/limiter"
)

// The regression tests of the promises found broken where the limiter's
// paths meet (the torture test, limiter/torture, checks them all together
// under random schedules).

// TestSequenceStartsInOrder: a per-key limit of 1 is a sequence. Five jobs
// of one key, one insert each before any worker runs, start in job-id
// order, one at a time, with one worker and with two.
func TestSequenceStartsInOrder(t *testing.T) {
	t.Parallel()
	for _, workers := range []int{1, 2} {
		ctx := context.Background()
		url := testdb.New(t)
		pool := openPool(t, url)
		lim, err := limiter.New(limiter.Config{Pool: pool})
		require.NoError(t, err)
		require.NoError(t, lim.SetPerKey(ctx, "test.keyed.seq", []string{"tenant"}, 1))
		inserter, err := app.NewInsertClient(pool, nil)
		require.NoError(t, err)
		const n = 5
		for i := range n {
			_, err := inserter.Insert(ctx, keyedArgs{Seq: i, Tenant: "repo-1", MS: 20, K: "seq"}, nil)
			require.NoError(t, err)
		}
		tracker := newKeyedTracker()
		for w := range workers {
			startKeyedWorker(t, url, string(rune('a'+w)), "seq", tracker, 10)
		}
		require.Eventually(t, func() bool {
			_, _, starts, _ := tracker.snapshot()
			return len(starts) == n && count(t, pool, "SELECT count(*) FROM river_job WHERE state = 'completed'") == n
		}, 30*time.Second, 10*time.Millisecond)
		_, perKey, starts, worked := tracker.snapshot()
		order := make([]int, len(starts))
		for i, s := range starts {
			order[i] = s.seq
		}
		require.Equal(t, []int{0, 1, 2, 3, 4}, order, "%d worker(s): the sequence ran in job-id order", workers)
		require.Equal(t, 1, perKey["repo-1"], "one at a time")
		require.Len(t, worked, n)
	}
}

// TestRateChangedHolds: a rate changed at runtime holds, on workers idle
// in between too. A backlog runs at 20/1s on two workers; the rate is
// cleared (the backlog drains unlimited, and the workers learn the kind
// has no limit), the workers go idle, and the rate is set to 5/2s. 5 s
// later 3 jobs, and 0.7 s later 7 more: no 2 s window holds more than 5
// starts.
func TestRateChangedHolds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.New(t)
	pool := openPool(t, url)
	lim, err := limiter.New(limiter.Config{Pool: pool})
	require.NoError(t, err)
	const kind = "test.keyed.rate"
	require.NoError(t, lim.SetRate(ctx, kind, limiter.Rate{Max: 20, Per: time.Second}, nil))
	tracker := newKeyedTracker()
	a, _ := startKeyedWorker(t, url, "a", "rate", tracker, 20)
	startKeyedWorker(t, url, "b", "rate", tracker, 20)
	insertKeyed(t, a, "rate", "t", 0, 300, 250)
	time.Sleep(1500 * time.Millisecond)
	_, err = lim.ClearLimits(ctx, kind, limiter.Facets{Rate: true})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT count(*) FROM river_job WHERE kind = $1 AND state = 'completed'", kind) == 300
	}, time.Minute, 20*time.Millisecond)
	time.Sleep(500 * time.Millisecond)
	require.NoError(t, lim.SetRate(ctx, kind, limiter.Rate{Max: 5, Per: 2 * time.Second}, nil))
	time.Sleep(5 * time.Second)
	insertKeyed(t, a, "rate", "t", 1000, 3, 5)
	time.Sleep(700 * time.Millisecond)
	insertKeyed(t, a, "rate", "t", 2000, 7, 5)
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT count(*) FROM river_job WHERE kind = $1 AND state = 'completed'", kind) == 310
	}, time.Minute, 20*time.Millisecond)
	_, _, starts, _ := tracker.snapshot()
	var late []time.Time
	for _, s := range starts {
		if s.seq >= 1000 {
			late = append(late, s.at)
		}
	}
	require.Len(t, late, 10)
	// 50 ms less than the window: a start is recorded by the job a moment
	// after its admission.
	require.LessOrEqual(t, maxInWindow(late, 2*time.Second-50*time.Millisecond), 5, "starts in a 2 s window under 5/2s")
}

// TestBreakerRaisedResumesOnlyWhatStarts: raising a circuit breaker to 2
// over 200 parked jobs resumes what the limit lets start (each with a
// reserved slot, plus the bounded lookahead), not all 200 at once: the
// jobs do not park again, and at no moment do more than 2 + Lookahead
// wait available.
func TestBreakerRaisedResumesOnlyWhatStarts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.probe.breaker"
	url, pool, tracker := probeKind(t, "breaker", -1)
	logParkings(t, pool)
	a := startProbeWorker(t, url, "breaker-a", "breaker", tracker, 0, nil)
	startProbeWorker(t, url, "breaker-b", "breaker", tracker, 0, nil)
	const n = 200
	ids := insertProbes(t, a, "breaker", 0, n, 10)
	waitParked(t, pool, ids...)
	require.Equal(t, n, parkings(t, pool, kind))

	var maxAvailable atomic.Int32
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			var c int32
			if pool.QueryRow(ctx, "SELECT count(*) FROM river_job WHERE kind = $1 AND state = 'available'", kind).Scan(&c) == nil &&
				c > maxAvailable.Load() {
				maxAvailable.Store(c)
			}
		}
	}()
	lim, err := limiter.New(limiter.Config{Pool: pool})
	require.NoError(t, err)
	require.NoError(t, lim.SetConcurrency(ctx, kind, 2))
	waitAllDone(t, pool, tracker, kind, n, time.Minute)
	close(stop)
	<-sampled

	require.LessOrEqual(t, maxAvailable.Load(), int32(2+limiter.Lookahead), "resumed at once: the 2 slots and the lookahead")
	require.LessOrEqual(t, parkings(t, pool, kind), n+n/20, "at most 1.05 parkings per job in all")
	require.Equal(t, int32(2), tracker.max.Load(), "the new limit holds, and is used")
	_, worked := tracker.snapshot()
	for seq := range n {
		require.Equal(t, 1, worked[seq], "seq %d ran once", seq)
	}
}

// TestARateSetParksTheJobsWaitingAhead: jobs resumed ahead of a free slot
// (the lookahead, under a concurrency limit) wait in their worker as long
// as it takes; a rate set on their kind ends that, and they park after
// their park-after time rather than hold their worker's River slots until
// the rate lets them start (seed 16190584: a rate of 2 in 2 s held jobs
// resumed ahead in every River slot of both workers for seconds, and a
// job of another kind granted a slot was not fetched meanwhile).
func TestARateSetParksTheJobsWaitingAhead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.probe.aheadrate"
	url, pool, tracker := probeKind(t, "aheadrate", -1)
	a := startProbeWorker(t, url, "aheadrate-a", "aheadrate", tracker, 200*time.Millisecond, nil)
	ids := insertProbes(t, a, "aheadrate", 0, 100, 300)
	waitParked(t, pool, ids...)

	lim, err := limiter.New(limiter.Config{Pool: pool})
	require.NoError(t, err)
	require.NoError(t, lim.SetConcurrency(ctx, kind, 1))
	waitingAhead := func() int {
		return count(t, pool, `SELECT count(*) FROM concurrency_waiters w JOIN river_job j ON j.id = w.job_id AND j.state = 'running'
			WHERE w.kind = $1 AND w.worker_id IS NOT NULL`, kind)
	}
	require.Eventually(t, func() bool { return waitingAhead() >= 5 }, 10*time.Second, 5*time.Millisecond,
		"the lookahead's jobs did not come to wait in the worker")
	time.Sleep(400 * time.Millisecond) // past their park-after time: they wait without a deadline
	require.GreaterOrEqual(t, waitingAhead(), 5, "jobs resumed ahead parked before a rate was set")

	require.NoError(t, lim.SetRate(ctx, kind, limiter.Rate{Max: 1, Per: time.Minute}, nil))
	require.Eventually(t, func() bool {
		return waitingAhead() == 0 && count(t, pool, `SELECT count(*) FROM river_job WHERE kind = $1 AND state = 'running'`, kind) <= 1
	}, 5*time.Second, 10*time.Millisecond, "jobs resumed ahead still hold River slots under a rate of 1 a minute")
}

// TestAGrantUnderTheNewLimitsBeginsAtOnce: a change of limits that grants
// a job waiting in a worker's line (its own transaction's grant round, by
// note) made the grant under the new limits: the job begins with it,
// without being decided again for the change (a recheck is a ledger
// transaction, and under load it let younger jobs of its line, resumed by
// the same change and fetched elsewhere, start first: torture seed
// 611679386). A grant made under limits the worker does not hold is still
// rechecked (TestHeldAsNamesOnlyTheLimitsHeld).
func TestAGrantUnderTheNewLimitsBeginsAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.probe.regrant"
	url, pool, tracker := probeKind(t, "regrant", 0)
	lim, err := limiter.New(limiter.Config{Pool: pool})
	require.NoError(t, err)
	require.NoError(t, lim.SetRate(ctx, kind, limiter.Rate{Max: 1, Per: 20 * time.Second}, nil))
	// The grant watch's poll would find the grant too, without the limits
	// it was made under (its job is decided again): the note alone
	// brings it here (the poll won about one run in twenty under load).
	a, al := startProbeWorkerJobs(t, url, "regrant", tracker, app.JobsConfig{WorkerID: "regrant-a", ParkAfter: 30 * time.Second,
		LimiterGrants: limiter.GrantWatchConfig{Poll: time.Minute}}, nil, true)
	ids := insertProbes(t, a, "regrant", 0, 2, 0)
	waiting := func() bool {
		return tracker.doneCount() == 1 && count(t, pool, `SELECT count(*) FROM concurrency_waiters w JOIN river_job j ON j.id = w.job_id
			AND j.state = 'running' WHERE w.job_id = $1 AND w.worker_id = 'regrant-a'`, ids[1]) == 1
	}
	for end := time.Now().Add(10 * time.Second); !waiting() && time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond)
	}
	if !waiting() {
		t.Fatalf("the second job did not come to wait in the worker's line: %d done, %s", tracker.doneCount(),
			jobtest.JobState(t, pool, ids[1]))
	}

	require.NoError(t, lim.SetRate(ctx, kind, limiter.Rate{Max: 2, Per: 20 * time.Second}, nil))
	require.Equal(t, ids[1], al.TestSignals.GrantHeard.WaitOrTimeout(), "the change's grant was not heard")
	require.Eventually(t, func() bool { return tracker.doneCount() == 2 }, 10*time.Second, 5*time.Millisecond)
	al.TestSignals.Rechecked.RequireEmpty()
	require.Equal(t, 2, count(t, pool, `SELECT count(*) FROM concurrency_starts WHERE kind = $1`, kind),
		"both starts are in the window")
}
