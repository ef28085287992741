package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/limiter"
)

// TestConcurrencyLeasesShared: two workers share a kind's limit through
// slot leases: the limit holds, both workers run jobs, nothing parks when
// slots free up in time, and every leased slot goes back once idle. "In
// time" is a park-after of 5 s: the 300 jobs of 5 ms take under a second
// alone, and the default second was not enough beside the other packages
// of make test on 2 cores (a job parked, and the kind's line, once used,
// parked 219 more).
func TestConcurrencyLeasesShared(t *testing.T) {
	t.Parallel()

	const kind = "leases"
	const fullKind = "test.probe." + kind
	pool, tracker, a := limitedProbes(t, kind, 4, 5*time.Second)

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
	jobtest.SetLimit(t, pool, "demo.sleep", 3)
	_, err := pool.Exec(ctx, `INSERT INTO concurrency_leases (kind, worker_id, slots, renewed_at)
		VALUES ('demo.sleep', 'gone', 2, now() - $1::interval), ('demo.sleep', 'alive', 1, now())`, limiter.LeaseTTL.String())
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE concurrency_limits SET admitted = 3 WHERE kind = 'demo.sleep'`)
	require.NoError(t, err)

	// A registered live worker's lease is the reaper's business, however
	// old its renewal: it is kept.
	_, err = pool.Exec(ctx, `INSERT INTO sluice_workers (id, host, pid, heartbeat_interval) VALUES ('paused', 'h', 1, '1s');
		INSERT INTO concurrency_leases (kind, worker_id, slots, renewed_at) VALUES ('demo.sleep', 'paused', 0, now() - interval '1 hour')`)
	require.NoError(t, err)

	deps, _ := jobtest.NewJobs(t, pool)
	client := jobtest.Start(t, pool, deps, jobtest.Config{})
	// The cron's kindless run finds the kind by its leases.
	client.InsertAndWait(t, limiter.ResumeArgs{}, nil)
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT count(*) FROM concurrency_leases WHERE worker_id = 'gone'") == 0
	}, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, 1, count(t, pool, "SELECT slots FROM concurrency_leases WHERE worker_id = 'alive'"))
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM concurrency_leases WHERE worker_id = 'paused'"))
	require.Equal(t, 1, count(t, pool, "SELECT admitted FROM concurrency_limits WHERE kind = 'demo.sleep'"))
}

// TestConcurrencyLeaseLost: a worker whose lease was freed behind its back
// (expired while it was paused) stops using those slots at its next renewal,
// so another worker leasing them does not take the kind over its limit.
func TestConcurrencyLeaseLost(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	const kind = "lost"
	const fullKind = "test.probe." + kind
	url, pool, tracker := probeKind(t, kind, 2)
	a, lim := startProbeWorkerSignals(t, url, kind+"-a", kind, tracker, 0, nil)
	insertProbes(t, a, kind, 0, 30, 150)
	require.Eventually(t, func() bool { return tracker.running.Load() == 2 }, 10*time.Second, 5*time.Millisecond)

	// Free a's lease as an expiry would (a's process does not know).
	_, err := pool.Exec(ctx, `DELETE FROM concurrency_leases WHERE worker_id = $1`, kind+"-a")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE concurrency_limits SET admitted = 0 WHERE kind = $1`, fullKind)
	require.NoError(t, err)
	// a renews and finds them gone: wait for a renewal that began after
	// the delete (one in flight may have read the row before it).
	for range 2 {
		require.Equal(t, fullKind, lim.TestSignals.Renewed.WaitOrTimeout())
	}
	tracker.max.Store(tracker.running.Load())
	startProbeWorker(t, url, kind+"-b", kind, tracker, 0, nil)
	waitAllDone(t, pool, tracker, fullKind, 30, time.Minute)
	require.LessOrEqual(t, tracker.max.Load(), int32(2), "the limit held after the lease was lost")
}

// TestConcurrencyLimitLowered: lowering a limit stops new jobs from starting
// on leased slots above it at once, even while older jobs still run and
// the worker holds more slots.
func TestConcurrencyLimitLowered(t *testing.T) {
	t.Parallel()

	const kind = "lowered"
	const fullKind = "test.probe." + kind
	url, pool, tracker := probeKind(t, kind, 10)
	a := startProbeWorker(t, url, kind+"-a", kind, tracker, 0, nil)
	insertProbes(t, a, kind, 0, 3, 3000)   // three long jobs
	insertProbes(t, a, kind, 100, 300, 20) // and a stream of short ones
	require.Eventually(t, func() bool { return tracker.running.Load() >= 8 }, 10*time.Second, 5*time.Millisecond,
		"the worker uses its leased slots")

	jobtest.SetLimit(t, pool, fullKind, 2)
	time.Sleep(limiter.LimitCacheTTL + limiter.LeaseIdlePoll + 200*time.Millisecond)
	_, worked := tracker.snapshot()
	require.Less(t, len(worked), 303, "short jobs are left to start after the change")
	tracker.max.Store(tracker.running.Load())
	time.Sleep(500 * time.Millisecond)
	require.LessOrEqual(t, tracker.max.Load(), int32(3), "no job started above the lowered limit while the long ones ran")
	waitAllDone(t, pool, tracker, fullKind, 303, 2*time.Minute)
}

// TestConcurrencyLimitLoweredManyWorkers: with several workers holding
// slots, a lowered limit holds too: while the slots taken across workers
// exceed it, no worker starts a job on a spare slot, and freed slots go
// back until the total is within the limit.
func TestConcurrencyLimitLoweredManyWorkers(t *testing.T) {
	t.Parallel()

	const kind = "lowered3"
	const fullKind = "test.probe." + kind
	url, pool, tracker := probeKind(t, kind, 9)
	a := startProbeWorker(t, url, kind+"-a", kind, tracker, 0, nil)
	startProbeWorker(t, url, kind+"-b", kind, tracker, 0, nil)
	startProbeWorker(t, url, kind+"-c", kind, tracker, 0, nil)
	insertProbes(t, a, kind, 0, 1500, 20)
	require.Eventually(t, func() bool { return tracker.running.Load() >= 7 }, 10*time.Second, 2*time.Millisecond)

	// Measured before any waiting job could have waited --park-after (1s)
	// and parked, which would switch the kind to per-job admission: the
	// leases alone must hold the new limit, once the workers have seen it
	// (each reads the kind's state every few ms while jobs wait).
	jobtest.SetLimit(t, pool, fullKind, 4)
	time.Sleep(250 * time.Millisecond)
	tracker.max.Store(tracker.running.Load())
	time.Sleep(500 * time.Millisecond)
	_, worked := tracker.snapshot()
	require.Less(t, len(worked), 1500, "jobs were still starting while measured")
	require.LessOrEqual(t, tracker.max.Load(), int32(4), "the lowered limit holds across workers")
	waitAllDone(t, pool, tracker, fullKind, 1500, 2*time.Minute)
}

// TestConcurrencyLimitClearedWithLeases: removing a limit drops the leases
// counted against it, so setting it again starts from what really runs.
func TestConcurrencyLimitClearedWithLeases(t *testing.T) {
	t.Parallel()

	const kind = "cleared"
	const fullKind = "test.probe." + kind
	url, pool, tracker := probeKind(t, kind, 3)
	a := startProbeWorker(t, url, kind+"-a", kind, tracker, 0, nil)
	insertProbes(t, a, kind, 0, 5, 0)
	insertProbes(t, a, kind, 5, 1, 1500) // holds a leased slot while the limit is cleared
	require.Eventually(t, func() bool {
		_, worked := tracker.snapshot()
		return len(worked) == 6 && tracker.running.Load() == 1 // the five short ones ended, the long one runs
	}, time.Minute, 5*time.Millisecond)
	require.Positive(t, count(t, pool, "SELECT COALESCE(sum(slots), 0)::int FROM concurrency_leases"), "a leased slot is in use")

	cleared, err := clearLimits(t, pool, fullKind)
	require.NoError(t, err)
	require.True(t, cleared.Concurrency)
	require.Zero(t, count(t, pool, "SELECT count(*) FROM concurrency_leases"))
	jobtest.SetLimit(t, pool, fullKind, 3)
	require.Zero(t, count(t, pool, "SELECT admitted FROM concurrency_limits WHERE kind = $1", fullKind), "no ghost slots")
	waitAllDone(t, pool, tracker, fullKind, 6, time.Minute)
	tracker.max.Store(0)
	insertProbes(t, a, kind, 100, 6, 0)
	waitAllDone(t, pool, tracker, fullKind, 12, time.Minute)
	require.LessOrEqual(t, tracker.max.Load(), int32(3))
}

// TestClearLimitRacesGrant: a lease granted while limits clear waits for
// the kind's lock is removed with the limit (no ghost lease row).
func TestClearLimitRacesGrant(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool := testdb.NewPool(t)
	jobtest.SetLimit(t, pool, "demo.sleep", 3)
	// A grant in flight: it holds the kind's lock and writes its lease.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, `SELECT 1 FROM concurrency_limits WHERE kind = 'demo.sleep' FOR UPDATE`)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		_, err := clearLimits(t, pool, "demo.sleep")
		done <- err
	}()
	// The clear ensures the row and locks it in one statement
	// (EnsureLimitRow). This looked for LockConcurrencyLimits, which the
	// clear does not reach while the row is locked: it passed while some
	// other statement of that name waited on the row, and failed once the
	// safety net's clean-up took the row-creation lock first.
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%EnsureLimitRow%'") == 1
	}, 10*time.Second, 5*time.Millisecond, "clear waits for the lock")
	_, err = tx.Exec(ctx, `INSERT INTO concurrency_leases (kind, worker_id, slots) VALUES ('demo.sleep', 'w', 2)`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `UPDATE concurrency_limits SET admitted = admitted + 2 WHERE kind = 'demo.sleep'`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-done)
	require.Zero(t, count(t, pool, "SELECT count(*) FROM concurrency_leases"), "the lease went with the limit")
	jobtest.SetLimit(t, pool, "demo.sleep", 3)
	require.Zero(t, count(t, pool, "SELECT admitted FROM concurrency_limits WHERE kind = 'demo.sleep'"))
}

// TestConcurrencyLeaseCountedButNotHeld: slots the database counts for a
// worker that does not hold them (a grant whose reply was lost) are given
// back at the worker's next renewal.
func TestConcurrencyLeaseCountedButNotHeld(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	const kind = "extra"
	const fullKind = "test.probe." + kind
	url, pool, tracker := probeKind(t, kind, 4)
	a := startProbeWorker(t, url, kind+"-a", kind, tracker, 0, nil)
	insertProbes(t, a, kind, 0, 1, 4000) // keeps one slot leased meanwhile
	require.Eventually(t, func() bool { return tracker.running.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT slots FROM concurrency_leases WHERE worker_id = $1", kind+"-a") == 1
	}, 3*limiter.LeaseRenew, 5*time.Millisecond, "one slot, the running job's, stays leased")

	_, err := pool.Exec(ctx, `UPDATE concurrency_leases SET slots = slots + 2 WHERE worker_id = $1`, kind+"-a")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE concurrency_limits SET admitted = admitted + 2 WHERE kind = $1`, fullKind)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT slots FROM concurrency_leases WHERE worker_id = $1", kind+"-a") == 1 &&
			count(t, pool, "SELECT admitted FROM concurrency_limits WHERE kind = $1", fullKind) == 1
	}, 3*limiter.LeaseRenew, 20*time.Millisecond, "the extra slots went back")
}

// TestLeasedSlotTakenAtFetchLeavesNoMark: a job that takes a spare leased
// slot at its fetch is decided within the fetch's transaction and writes
// no mark as "fetched and not decided" (concurrency_fetches): only the jobs
// that wait for a leased slot are marked (the other workers let them go
// first). A stream under a limit it never reaches on one worker: the first
// fetch waits for the lease, and later fetches find the slots that jobs
// ended spare.
func TestLeasedSlotTakenAtFetchLeavesNoMark(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	const kind = "nomark"
	const fullKind = "test.probe." + kind
	url, pool, tracker := probeKind(t, kind, 1000)
	logParkings(t, pool)
	// Every mark written, as the fetch transactions insert them.
	_, err := pool.Exec(ctx, `
		CREATE TABLE marks_seen (job_id bigint, leased boolean);
		CREATE FUNCTION note_mark() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO marks_seen VALUES (NEW.job_id, NEW.leased); RETURN NULL; END $$;
		CREATE TRIGGER note_mark AFTER INSERT ON concurrency_fetches FOR EACH ROW EXECUTE FUNCTION note_mark();`)
	require.NoError(t, err)
	a := startProbeWorker(t, url, kind+"-a", kind, tracker, 0, nil)

	const n = 2000
	insertProbes(t, a, kind, 0, n, 0)
	waitAllDone(t, pool, tracker, fullKind, n, time.Minute)

	marks := count(t, pool, "SELECT count(*) FROM marks_seen")
	unleased := count(t, pool, "SELECT count(*) FROM marks_seen WHERE NOT leased")
	t.Logf("%d marks for %d jobs (%d not leased)", marks, n, unleased)
	// A job whose fetch finds the keeper's view older than local.TakeFresh
	// (30 ms) waits for the keeper and is marked: up to 240 of 2,000 on a
	// loaded machine (20 at 50 ms); the code before marked every one.
	require.Less(t, marks, n/4, "jobs that took a spare leased slot at their fetch were marked")
	require.Zero(t, unleased, "a job of a kind on the leased path was marked for the line")
	require.Zero(t, parkings(t, pool, fullKind), "nothing parked")
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT count(*) FROM concurrency_fetches") == 0
	}, 10*time.Second, 10*time.Millisecond, "the marks of the jobs that waited went with the keeper's publication")
}

// TestLeasedFetchRolledBack: a fetch whose transaction fails after the
// worker's memory decided its jobs (here: the mark of a job waiting for a
// leased slot fails) takes the decisions back: its jobs are available
// again and fetched later, each works once, the limit holds, and no slot
// taken by a job of a failed fetch stays in use (the worker gives every
// leased slot back once idle).
func TestLeasedFetchRolledBack(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	const kind = "unfetched"
	const fullKind = "test.probe." + kind
	url, pool, tracker := probeKind(t, kind, 5)
	logParkings(t, pool)
	// Once 50 jobs are done (the worker holds its lease), the next 30
	// fetches that mark a job fail: each took spare leased slots for its
	// first jobs and left the others waiting for one.
	_, err := pool.Exec(ctx, `
		CREATE SEQUENCE mark_tries;
		CREATE FUNCTION fail_mark() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF (SELECT count(*) FROM river_job WHERE state = 'completed') >= 50 AND nextval('mark_tries') <= 30 THEN
				RAISE EXCEPTION 'injected: mark refused';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER fail_mark BEFORE INSERT ON concurrency_fetches FOR EACH ROW EXECUTE FUNCTION fail_mark();`)
	require.NoError(t, err)
	a := startProbeWorker(t, url, kind+"-a", kind, tracker, 5*time.Second, nil)

	const n = 300
	insertProbes(t, a, kind, 0, n, 5)
	waitAllDone(t, pool, tracker, fullKind, n, time.Minute)

	require.Greater(t, count(t, pool, "SELECT last_value FROM mark_tries"), 30, "fetches failed and later ones passed")
	require.LessOrEqual(t, tracker.max.Load(), int32(5), "the limit held")
	_, worked := tracker.snapshot()
	for seq := range n {
		require.Equal(t, 1, worked[seq], "job %d worked %d times", seq, worked[seq])
	}
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT admitted FROM concurrency_limits WHERE kind = $1", fullKind) == 0 &&
			count(t, pool, "SELECT COALESCE(sum(slots), 0)::int FROM concurrency_leases") == 0
	}, 10*time.Second, 10*time.Millisecond, "idle leases given back")
}

// TestAFetchReadsTheLeasedKind: a worker's fetch of first attempts of a
// kind on the leased path reads the kind's state in its own transaction,
// so that they take a spare leased slot on a view as young as the fetch
// (the keeper's, read every 25 ms, is often older than TakeFresh by the
// time a fetch's jobs are decided): the jobs run within the limit.
func TestAFetchReadsTheLeasedKind(t *testing.T) {
	t.Parallel()
	const kind = "atfetch"
	const fullKind = "test.probe." + kind
	url, pool, tracker := probeKind(t, kind, 2)
	a, lim := startProbeWorkerSignals(t, url, kind+"-a", kind, tracker, 0, nil)
	insertProbes(t, a, kind, 0, 1, 10)
	waitAllDone(t, pool, tracker, fullKind, 1, 30*time.Second)
	insertProbes(t, a, kind, 1, 4, 10)
	require.Equal(t, fullKind, lim.TestSignals.LookedAtFetch.WaitOrTimeout(), "the fetch did not read the kind")
	waitAllDone(t, pool, tracker, fullKind, 5, 30*time.Second)
	require.LessOrEqual(t, tracker.max.Load(), int32(2), "the limit held")
}
