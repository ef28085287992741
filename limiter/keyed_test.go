package limiter_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/limiter"
)

// newLimiter is a Limiter on pool for changing limits, as the CLI's.
func newLimiter(t testing.TB, url string) *limiter.Limiter {
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
	// Leased slots no job needs go back within LeaseLinger, and the last
	// release (written in the background, perhaps after River completed
	// the job) forgets the keys' turns: the books are even once they did.
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT admitted FROM concurrency_limits WHERE kind = $1", fullKind) == 0 &&
			count(t, pool, "SELECT COALESCE(sum(slots), 0)::int FROM concurrency_leases") == 0 &&
			count(t, pool, "SELECT count(*) FROM concurrency_key_lines") == 0
	}, 10*time.Second, 10*time.Millisecond, "idle leases given back, the count follows, the keys' lines forgotten")
	require.Zero(t, count(t, pool, "SELECT count(*) FROM sluice_concurrency_keys"), "keys without activity leave no rows")
}

// TestKeyedFairness: tenant A has 2,000 jobs of 50 ms waiting under a
// per-kind limit of 4 (and a per-key limit of 4); tenant B then gets 5
// jobs. Free slots go round-robin across the tenants with waiting jobs, so
// B's jobs do not wait behind A's backlog: between B's insert and B's last
// finish, at most 40 of A's jobs start (about one per turn of the round).
func TestKeyedFairness(t *testing.T) {
	t.Parallel()
	aStarts, took := keyedFairness(t, "fair")
	t.Logf("A's jobs started between B's insert and B's last finish: %d (B took %s)", aStarts, took.Round(time.Millisecond))
	require.LessOrEqual(t, aStarts, 40, "B does not wait behind A's backlog")
}

// keyedFairness runs the fairness scenario (see TestKeyedFairness) with
// kind "test.keyed."+kind and returns how many of A's jobs started between
// B's insert and B's last finish, and how long B's jobs took.
func keyedFairness(t testing.TB, kind string) (int, time.Duration) {
	ctx := context.Background()
	fullKind := "test.keyed." + kind
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
	require.LessOrEqual(t, perKey["A"], 4)
	aStarts := 0
	for _, s := range starts {
		if s.tenant == "A" && !s.at.Before(t0) && !s.at.After(lastB) {
			aStarts++
		}
	}
	return aStarts, lastB.Sub(t0)
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// attemptedAts returns the attempted_at of kind's completed jobs: when
// their last (counted) start happened.
func attemptedAts(t testing.TB, pool *pgxpool.Pool, kind string) []time.Time {
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

// TestKeyedRiverClient: jobs held by a per-key limit (one long job holds
// its tenant's only slot) are pending River rows on which River's own
// client calls behave as River documents: JobCancel cancels, JobDelete
// deletes, JobRetry makes one available (it parks again behind its key);
// the others run exactly once when the slot frees, each on its own row.
func TestKeyedRiverClient(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	const kind = "keyedapi"
	const fullKind = "test.keyed." + kind
	url := testdb.New(t)
	pool := openPool(t, url)
	lim := newLimiter(t, url)
	require.NoError(t, lim.SetPerKey(ctx, fullKind, []string{"tenant"}, 1))
	tracker := newKeyedTracker()
	client, _ := startKeyedWorker(t, url, kind, kind, tracker, 10)

	holder := insertKeyed(t, client, kind, "acme", 0, 1, 60_000)[0]
	require.Eventually(t, func() bool { return jobState(t, pool, holder) == "running" }, 30*time.Second, 10*time.Millisecond)
	held := insertKeyed(t, client, kind, "acme", 1, 5, 0)
	other := insertKeyed(t, client, kind, "globex", 100, 1, 0) // another tenant runs at once
	waitParked(t, pool, held...)
	client.WaitFinished(t, 30*time.Second, other...)
	require.Equal(t, 5, count(t, pool, `SELECT count(*) FROM concurrency_parked_jobs WHERE key = '"acme"' AND reason IN ('key_limit', 'key_fifo')`))
	require.Equal(t, 5, count(t, pool, `SELECT parked FROM sluice_concurrency_keys WHERE kind = $1 AND key = '"acme"'`, fullKind))
	require.Equal(t, 1, count(t, pool, `SELECT slots_in_use FROM sluice_concurrency_keys WHERE kind = $1 AND key = '"acme"'`, fullKind))

	for _, id := range held {
		job, err := client.JobGet(ctx, id)
		require.NoError(t, err)
		require.Equal(t, rivertype.JobStatePending, job.State)
		require.Equal(t, 0, job.Attempt, "parking is not an attempt")
	}
	cancelled, err := client.JobCancel(ctx, held[0])
	require.NoError(t, err)
	require.Equal(t, rivertype.JobStateCancelled, cancelled.State)
	_, err = client.JobDelete(ctx, held[1])
	require.NoError(t, err)
	retried, err := client.JobRetry(ctx, held[2])
	require.NoError(t, err)
	require.Equal(t, rivertype.JobStateAvailable, retried.State)
	require.Eventually(t, func() bool {
		return jobState(t, pool, held[2]) == "pending" &&
			count(t, pool, "SELECT count(*) FROM concurrency_parked_jobs WHERE job_id = $1", held[2]) == 1
	}, 30*time.Second, 10*time.Millisecond, "fetched again, it parks again behind its key")
	require.Zero(t, count(t, pool, "SELECT count(*) FROM concurrency_parked_jobs WHERE job_id = ANY($1)", held[:2]))

	// The holder ends: the rest of the tenant runs, one at a time, once each.
	_, err = client.JobCancel(ctx, holder)
	require.NoError(t, err)
	client.WaitFinished(t, 30*time.Second, held[2:]...)
	_, perKey, _, worked := tracker.snapshot()
	require.Equal(t, 1, perKey["acme"])
	for _, seq := range []int{3, 4, 5, 100} {
		require.Equal(t, 1, worked[seq], "seq %d", seq)
	}
	require.Zero(t, worked[1]+worked[2], "the cancelled and the deleted job never ran")
	require.Equal(t, "cancelled", jobState(t, pool, held[0]))
	require.Empty(t, jobState(t, pool, held[1]))
	// The last release is written in the background, perhaps after River
	// completed the job (a loaded machine): the key's rows go with it.
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT count(*) FROM sluice_concurrency_keys WHERE kind = $1", fullKind) == 0
	}, 10*time.Second, 10*time.Millisecond, "a key without activity leaves no rows")
}

// TestKeyedLimitChangedUnderLoad: under a steady stream of jobs of 4
// tenants, the per-key limit is raised from 1 to 3 and lowered to 1 again:
// each new value holds within 2 s (raising resumes the waiting jobs at
// once; lowering stops no running job); cleared, it releases every job it
// held at once; and every job runs exactly once.
func TestKeyedLimitChangedUnderLoad(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	const kind = "change"
	const fullKind = "test.keyed." + kind
	url := testdb.New(t)
	pool := openPool(t, url)
	lim := newLimiter(t, url)
	require.NoError(t, lim.SetPerKey(ctx, fullKind, []string{"tenant"}, 1))
	tracker := newKeyedTracker()
	a, _ := startKeyedWorker(t, url, kind+"-a", kind, tracker, 20)
	startKeyedWorker(t, url, kind+"-b", kind, tracker, 20)

	tenants := []string{"t1", "t2", "t3", "t4"}
	seq := 0
	for _, tenant := range tenants {
		insertKeyed(t, a, kind, tenant, seq, 40, 100)
		seq += 40
	}
	running := tracker.runningNow
	time.Sleep(300 * time.Millisecond)
	require.LessOrEqual(t, running(), 1)

	require.NoError(t, lim.SetPerKey(ctx, fullKind, []string{"tenant"}, 3))
	raised := time.Now()
	require.Eventually(t, func() bool { return running() == 3 }, 2*time.Second, 5*time.Millisecond,
		"raised: the waiting jobs resume at once")
	t.Logf("3 per tenant running %s after the raise", time.Since(raised).Round(time.Millisecond))

	require.NoError(t, lim.SetPerKey(ctx, fullKind, []string{"tenant"}, 1))
	lowered := time.Now()
	// A grant claimed just before the lowering may still start: the
	// README gives a change 50 ms to be followed (the wait leaves room for
	// a loaded machine).
	time.Sleep(300 * time.Millisecond)
	require.Eventually(t, func() bool { return running() <= 1 }, 2*time.Second, 5*time.Millisecond,
		"lowered: the running jobs end, no new one starts over the limit")
	t.Logf("1 per tenant %s after the lowering", time.Since(lowered).Round(time.Millisecond))
	for range 20 {
		require.LessOrEqual(t, running(), 1)
		time.Sleep(20 * time.Millisecond)
	}

	// Cleared: every job it held resumes at once.
	found, err := lim.ClearLimits(ctx, fullKind, limiter.Facets{PerKey: true})
	require.NoError(t, err)
	require.True(t, found.PerKey)
	require.Zero(t, count(t, pool, `SELECT count(*) FROM concurrency_limits
		WHERE kind = $1 AND (max_concurrency <> 0 OR key_max IS NOT NULL OR rate_max IS NOT NULL)`, fullKind), "no limit left")
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT count(*) FROM concurrency_parked_jobs p JOIN river_job j ON j.id = p.job_id WHERE j.state = 'pending'") == 0
	}, 2*time.Second, 5*time.Millisecond, "every waiting job made available (those completing their parking right after)")
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT count(*) FROM river_job WHERE kind = $1 AND state = 'completed'", fullKind) == seq
	}, time.Minute, 20*time.Millisecond)
	_, _, _, worked := tracker.snapshot()
	require.Len(t, worked, seq, "nothing lost")
	for s, n := range worked {
		require.Equal(t, 1, n, "seq %d ran once", s)
	}
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT count(*) FROM concurrency_limits WHERE kind = $1", fullKind) == 0
	}, 10*time.Second, 20*time.Millisecond, "the limitless row goes with the last slot")
}

// TestKeyedLimitSetBySQL: a per-key limit set by plain SQL (a migration)
// over jobs already parked: the safety net gives them their keys, and they
// resume under the limit, one per key at a time.
func TestKeyedLimitSetBySQL(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool := testdb.NewPool(t)
	var ids []int64
	for i := range 4 {
		ids = append(ids, jobtest.InsertParked(t, pool, "demo.sleep", fmt.Sprintf(`{"ms": %d}`, 200+i%2)))
	}
	_, err := pool.Exec(ctx, `INSERT INTO concurrency_limits (kind, max_concurrency, partition_fields, key_max)
		VALUES ('demo.sleep', 0, '{ms}', 1)`)
	require.NoError(t, err)
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM concurrency_limits WHERE key_source = 'sql' AND max_source IS NULL"))
	require.Equal(t, 4, count(t, pool, "SELECT count(*) FROM concurrency_parked_jobs WHERE key IS NULL"))

	deps, _ := jobtest.NewJobs(t, pool)
	client := jobtest.Start(t, pool, deps, jobtest.Config{})
	client.InsertAndWait(t, limiter.ResumeArgs{JobKind: "demo.sleep"}, nil)
	require.Zero(t, count(t, pool, "SELECT count(*) FROM concurrency_parked_jobs WHERE key IS NULL"), "keys given")
	client.WaitFinished(t, 30*time.Second, ids...)
	for _, id := range ids {
		require.Equal(t, "completed", jobState(t, pool, id))
	}
	// One per key at a time: the two 200 ms jobs of a key never overlapped,
	// so they ended at least 200 ms apart (finalized_at lags an end by
	// River's completer, up to 50 ms each; attempted_at says nothing here: a
	// job resumed ahead of its slot is fetched before it starts).
	require.Zero(t, count(t, pool, `SELECT count(*) FROM river_job a JOIN river_job b ON a.args = b.args AND a.id < b.id
		WHERE a.id = ANY($1) AND b.id = ANY($1)
		  AND abs(extract(epoch FROM a.finalized_at - b.finalized_at)) < 0.1`, ids))
}

// TestBacklogLeavesRoomForOtherKeys: under a per-key limit of 1, a
// tenant's backlog of 300 jobs of 20 ms does not fill a worker's River
// slots (20) with jobs waiting for their key: at most a few wait there
// (four times the key's limit, at least 8), the rest park at their fetch,
// never seen by River's executors, and come back as the key moves. A job
// of another tenant inserted behind the backlog is fetched and runs at
// once, not after the backlog; the busy key runs one job at a time, in
// job-id order.
func TestBacklogLeavesRoomForOtherKeys(t *testing.T) {
	t.Parallel()

	const kind = "backlog"
	const fullKind = "test.keyed." + kind
	pool, a, tracker := perKeyOneWorker(t, kind, time.Second)

	busy := insertKeyed(t, a, kind, "busy", 0, 300, 20)
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT count(*) FROM river_job WHERE kind = $1 AND state = 'completed'", fullKind) >= 10
	}, 30*time.Second, 5*time.Millisecond)
	require.LessOrEqual(t, count(t, pool, "SELECT count(*) FROM concurrency_waiters WHERE kind = $1", fullKind), 8,
		"more of the backlog waits in the worker than the decision lets wait")
	inserted := time.Now()
	other := insertKeyed(t, a, kind, "other", 1000, 1, 0)[0]
	require.Eventually(t, func() bool { return jobState(t, pool, other) == "completed" }, 2*time.Second, 5*time.Millisecond,
		"the other tenant's job waited behind the backlog")
	t.Logf("the other tenant's job ran %s after its insert", time.Since(inserted).Round(time.Millisecond))

	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT count(*) FROM river_job WHERE id = ANY($1) AND state = 'completed'", busy) == len(busy)
	}, time.Minute, 10*time.Millisecond)
	_, perKey, starts, worked := tracker.snapshot()
	require.Equal(t, 1, perKey["busy"], "one busy job at a time")
	prev := -1
	for _, s := range starts {
		if s.tenant != "busy" {
			continue
		}
		require.Greater(t, s.seq, prev, "busy jobs start in job-id order")
		require.Equal(t, 1, worked[s.seq])
		prev = s.seq
	}
	require.Positive(t, count(t, pool, "SELECT count(*) FROM test_parkings WHERE job_id = ANY($1)", busy), "the backlog parked")
}

// TestALongLineIsMeasuredAgainstTheRiverSlots: under a per-key limit of
// 1, one fetch brings 20 jobs of one key (10 ms each, a park-after of 10
// s, so none waits its time out). A worker of 200 River slots lets the 19
// that wait hold them (a line is long at an eighth of its slots, 25): none
// parks. A worker of 16 River slots parks the jobs it fetched behind 8 of
// the key's line at once, keeping its slots for other keys' jobs.
func TestALongLineIsMeasuredAgainstTheRiverSlots(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		slots  int
		parked bool
	}{{"large", 200, false}, {"small", 16, true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			kind := "line" + tc.name
			fullKind := "test.keyed." + kind
			url := testdb.New(t)
			pool := openPool(t, url)
			logParkings(t, pool)
			require.NoError(t, newLimiter(t, url).SetPerKey(ctx, fullKind, []string{"tenant"}, 1))
			tracker := newKeyedTracker()
			client, _ := startKeyedWorkerParkAfter(t, url, kind+"-w", kind, tracker, tc.slots, 10*time.Second)
			insertKeyed(t, client, kind, "a", 0, 20, 10)
			require.Eventually(t, func() bool {
				return count(t, pool, "SELECT count(*) FROM river_job WHERE kind = $1 AND state = 'completed'", fullKind) == 20
			}, time.Minute, 20*time.Millisecond)
			parkings := count(t, pool, "SELECT count(*) FROM test_parkings")
			if tc.parked {
				require.Positive(t, parkings, "a worker of %d River slots let every job of a line of 20 wait", tc.slots)
				return
			}
			require.Zero(t, parkings, "a worker of %d River slots parked jobs of a line of 20", tc.slots)
		})
	}
}

// perKeyOneWorker sets up, on a fresh database whose parkings are logged
// (logParkings), a per-key limit of 1 on kind's tenants and one worker of
// 20 River slots with parkAfter, and returns the pool, the worker's client
// and its tracker.
func perKeyOneWorker(t *testing.T, kind string, parkAfter time.Duration) (*pgxpool.Pool, *jobtest.Client, *keyedTracker) {
	t.Helper()
	url := testdb.New(t)
	pool := openPool(t, url)
	logParkings(t, pool)
	require.NoError(t, newLimiter(t, url).SetPerKey(context.Background(), "test.keyed."+kind, []string{"tenant"}, 1))
	tracker := newKeyedTracker()
	w, _ := startKeyedWorkerParkAfter(t, url, kind+"-w", kind, tracker, 20, parkAfter)
	return pool, w, tracker
}

// TestAJobWhoseLineMovesWaitsPastItsParkAfter: under a per-key limit of 1
// with a park-after of 1 s, one worker fetches, in one fetch, jobs of two
// keys. Key m: three jobs that take no time, one of 1.2 s, then job m4,
// which waits about 1.3 s. Its line moved in its worker within its
// park-after (three or four began, none waits ahead of it), so it would
// start within another: it waits on rather than park (a parking would only
// send it back to be fetched behind the same line). Key s: a job of 3 s,
// then job s1: its line does not move after its first job began, and it
// parks at its second park-after. The jobs of each key run in job-id
// order. (Fetched together, the jobs' waits and their lines' begins share
// one clock; the margins are 200 ms and more on a loaded machine.)
func TestAJobWhoseLineMovesWaitsPastItsParkAfter(t *testing.T) {
	t.Parallel()

	const kind = "moving"
	pool, w, tracker := perKeyOneWorker(t, kind, time.Second)

	var params []river.InsertManyParams
	for _, j := range []struct {
		tenant  string
		seq, ms int
	}{{"s", 100, 3000}, {"s", 101, 0}, {"m", 0, 0}, {"m", 1, 0}, {"m", 2, 0}, {"m", 3, 1200}, {"m", 4, 0}} {
		params = append(params, river.InsertManyParams{Args: keyedArgs{Seq: j.seq, Tenant: j.tenant, MS: j.ms, K: kind}})
	}
	res, err := w.InsertMany(context.Background(), params)
	require.NoError(t, err)
	var ids []int64
	for _, r := range res {
		ids = append(ids, r.Job.ID)
	}
	stuck, moving := ids[1], ids[6]
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT count(*) FROM river_job WHERE id = ANY($1) AND state = 'completed'", ids) == len(ids)
	}, 30*time.Second, 10*time.Millisecond)
	require.Zero(t, count(t, pool, "SELECT count(*) FROM test_parkings WHERE job_id = $1", moving),
		"a job whose line moved in its worker parked at its park-after")
	require.Positive(t, count(t, pool, "SELECT count(*) FROM test_parkings WHERE job_id = $1", stuck),
		"a job whose line did not move waited on past its park-after")
	_, perKey, starts, _ := tracker.snapshot()
	require.Equal(t, 1, perKey["m"], "one job of the key at a time")
	prev := map[string]int{"m": -1, "s": 99}
	for _, s := range starts {
		require.Greater(t, s.seq, prev[s.tenant], "the jobs of %s start in job-id order", s.tenant)
		prev[s.tenant] = s.seq
	}
}
