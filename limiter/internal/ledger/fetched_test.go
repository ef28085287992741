package ledger_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/limiter/internal/ledger"
)

// TestAJobFetchedElsewhereGoesFirst: a job of a line fetched by another
// worker and not decided yet (marked by its fetch) holds up the younger
// jobs of its line: a decision makes a younger one wait, and a grant round
// gives it nothing, until the older one's decision (which takes the mark
// away and asks for a round). A mark older than two seconds holds nothing
// up. Under a per-key limit (the key's line) and a per-kind limit alone
// (the kind's).
func TestAJobFetchedElsewhereGoesFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, c := range []struct {
		kind, set, args, key, reason string
	}{
		{"test.fetched.key", "partition_fields = '{tenant}', key_max = 2", `{"tenant": "a"}`, `"a"`, ledger.ReasonKeyFIFO},
		{"test.fetched.kind", "max_concurrency = 2", `{}`, "", ledger.ReasonFIFO},
	} {
		t.Run(c.kind, func(t *testing.T) {
			t.Parallel()
			pool, w1 := newLedger(t, "w1")
			w2 := ledger.New(ledger.Config{Pool: pool, WorkerID: "w2"})
			setLimits(t, w1, c.kind, c.set)
			older := running(t, pool, c.kind, c.args, "w1", 1, time.Now().Add(-100*time.Millisecond))
			younger := running(t, pool, c.kind, c.args, "w2", 1, time.Now())
			require.NoError(t, w1.MarkFetched(ctx, pool, []ledger.Fetched{{ID: older.ID, Kind: c.kind, Key: c.key}}))

			d := decideOne(t, w2, younger, nil)
			require.Equal(t, ledger.Wait, d.Action, "the younger job started before the older one's decision")
			require.Equal(t, c.reason, d.Reason)
			requireNotGranted(t, w2, pool, c.kind, younger.ID)

			out, err := w1.Decide(ctx, []ledger.Job{older}, nil, time.Second, nil)
			require.NoError(t, err)
			require.Equal(t, ledger.Slot, out.Decisions[0].Action, "the older job: room")
			requireRoundDue(t, out, c.kind, c.key, "a younger job waits with room left")
			require.Zero(t, count(t, pool, `SELECT count(*) FROM concurrency_fetches WHERE job_id = $1`, older.ID),
				"its decision left its mark")
			_, err = w2.Release(ctx, dueRound(out), nil)
			require.NoError(t, err)
			require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = $1 AND worker_id = 'w2'`,
				younger.ID), "the younger job was not granted its turn")

			// A mark older than two seconds holds nothing up.
			exec(t, pool, `DELETE FROM concurrency_executions WHERE kind = $1`, c.kind)
			exec(t, pool, `UPDATE concurrency_limits SET admitted = 0 WHERE kind = $1 AND admitted IS NOT NULL`, c.kind)
			exec(t, pool, `UPDATE concurrency_key_lines SET slots = 0 WHERE kind = $1`, c.kind)
			stale := running(t, pool, c.kind, c.args, "w1", 1, time.Now())
			next := running(t, pool, c.kind, c.args, "w2", 1, time.Now())
			require.NoError(t, w1.MarkFetched(ctx, pool, []ledger.Fetched{{ID: stale.ID, Kind: c.kind, Key: c.key}}))
			exec(t, pool, `UPDATE concurrency_fetches SET fetched_at = now() - interval '3 seconds' WHERE job_id = $1`, stale.ID)
			require.Equal(t, ledger.Slot, decideOne(t, w2, next, nil).Action, "a stale mark held a job up")
		})
	}
}

// TestAJobGrantedOnItsWayGoesFirst: under a rate per key, a job of the key
// resumed with a start reserved for it (on its way to a worker) goes
// before a younger job of its key fetched meanwhile: that one waits in the
// line, and the older one's claim of its start asks for the grant round
// that gives the younger one its turn.
func TestAJobGrantedOnItsWayGoesFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.onitsway"
	pool, w1 := newLedger(t, "w1")
	w2 := ledger.New(ledger.Config{Pool: pool, WorkerID: "w2"})
	setLimits(t, w1, kind, "partition_fields = '{tenant}', rate_max = 3, rate_period = '1 second', rate_per_key = true")
	older := running(t, pool, kind, `{"tenant": "a"}`, "w1", 1, time.Now())
	exec(t, pool, `UPDATE river_job SET state = 'available' WHERE id = $1`, older.ID)
	exec(t, pool, `INSERT INTO concurrency_starts (kind, key, job_id, started_at, reserved) VALUES ($1, '"a"', $2, now(), true)`,
		kind, older.ID)
	younger := running(t, pool, kind, `{"tenant": "a"}`, "w2", 1, time.Now())

	d := decideOne(t, w2, younger, nil)
	require.Equal(t, ledger.Wait, d.Action, "the younger job started before the older one on its way")
	require.Equal(t, ledger.ReasonKeyFIFO, d.Reason)

	exec(t, pool, `UPDATE river_job SET state = 'running', attempted_at = now() WHERE id = $1`, older.ID)
	older.FetchedAt = time.Now()
	out, err := w1.Decide(ctx, []ledger.Job{older}, nil, time.Second, nil)
	require.NoError(t, err)
	require.Equal(t, ledger.Run, out.Decisions[0].Action, "the older job claims its start")
	requireRoundDue(t, out, kind, `"a"`, "a younger job waits behind the claimed grant")
	_, err = w2.Release(ctx, dueRound(out), nil)
	require.NoError(t, err)
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_starts WHERE job_id = $1`, younger.ID),
		"the younger job was not granted its turn")
}

// TestALeasedMarkWaitsUntilPublished: a first attempt on the leased path
// marked leased by its fetch counts, for the other workers' leases, as
// waiting for a leased slot from its fetch on (before its worker's keeper
// publishes what waits there), and its worker's publication takes the mark
// away. A leased mark, and then the job published as waiting for a leased
// slot, holds up the younger jobs of the line: a decision makes one wait,
// a grant round gives it nothing (seed 458964646: a younger job of the
// line started while 20 older ones waited in a slow worker) and the lease
// state shows it as the oldest job of the line elsewhere, which no slot
// handed over in memory passes (seed 909341398), until the job no longer
// waits.
func TestALeasedMarkWaitsUntilPublished(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.leasedmark"
	pool, holder, waiter := leaseHolder(t, kind, 3, 2)

	fetched := time.Now().Add(-time.Second).Truncate(time.Millisecond)
	job := running(t, pool, kind, `{}`, "w2", 1, fetched)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, waiter.MarkFetched(ctx, tx, []ledger.Fetched{{ID: job.ID, Kind: kind, Leased: true}}))
	require.NoError(t, tx.Commit(ctx))
	st, err := holder.LeaseState(ctx, kind, 50*time.Millisecond)
	require.NoError(t, err)
	require.False(t, st.OldestOther.IsZero(), "the holder does not see the job its fetch marked waiting in w2")
	require.Equal(t, st.OldestOther, st.OldestOtherLine, "a hand-over in memory would pass the leased mark")

	younger := running(t, pool, kind, `{}`, "w1", 2, time.Now())
	d := decideOne(t, holder, younger, nil)
	require.Equal(t, ledger.Wait, d.Action, "a younger job of the line passed a leased mark")
	require.Equal(t, ledger.ReasonFIFO, d.Reason)
	requireNotGranted(t, holder, pool, kind, younger.ID)

	// Published as waiting for a leased slot: it still goes first.
	require.NoError(t, waiter.PublishWaiting(ctx, kind, []int64{job.ID}, []int64{job.ID}))
	require.Zero(t, count(t, pool, `SELECT count(*) FROM concurrency_fetches WHERE job_id = $1`, job.ID), "the publication left the mark")
	requireNotGranted(t, holder, pool, kind, younger.ID)
	st, err = holder.LeaseState(ctx, kind, 50*time.Millisecond)
	require.NoError(t, err)
	require.WithinDuration(t, fetched, st.OldestOtherLine, 5*time.Millisecond, "a hand-over in memory would pass the job published as waiting for a leased slot")

	// It waits no more (a leased slot, say): the younger job's turn.
	require.NoError(t, waiter.PublishWaiting(ctx, kind, nil, nil))
	st, err = holder.LeaseState(ctx, kind, 50*time.Millisecond)
	require.NoError(t, err)
	require.True(t, st.OldestOther.IsZero(), "a job published as no longer waiting still counts")
	require.True(t, st.OldestOtherLine.IsZero(), "a job published as no longer waiting still holds the hand-over up")
	_, err = holder.Release(ctx, ledger.Release{Rounds: []string{kind}}, nil)
	require.NoError(t, err)
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = $1`, younger.ID),
		"the younger job was not granted its turn")
}

// TestAJobLetGoGoesFirst: a job waiting in a worker's line when its kind's
// limits are cleared is let go (its place goes, its worker decides it
// again), and is marked fetched and not decided again: when a limit comes
// back before that decision, a younger job of the kind that another worker
// decides waits behind it, and the older one's decision takes the mark
// away.
func TestAJobLetGoGoesFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.letgo"
	pool, w1 := newLedger(t, "w1")
	w2 := ledger.New(ledger.Config{Pool: pool, WorkerID: "w2"})
	setLimits(t, w1, kind, "partition_fields = '{tenant}', key_max = 1")
	holder := running(t, pool, kind, `{"tenant": "a"}`, "w1", 1, time.Now().Add(-200*time.Millisecond))
	require.Equal(t, ledger.Slot, decideOne(t, w1, holder, nil).Action)
	older := running(t, pool, kind, `{"tenant": "a"}`, "w1", 1, time.Now().Add(-100*time.Millisecond))
	require.Equal(t, ledger.Wait, decideOne(t, w1, older, nil).Action, "the key's slot is taken")

	setLimits(t, w1, kind, "partition_fields = NULL, key_max = NULL")
	require.Zero(t, count(t, pool, `SELECT count(*) FROM concurrency_waiters WHERE kind = $1`, kind), "the line was not let go")
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_fetches WHERE job_id = $1 AND worker_id = 'w1'`, older.ID),
		"the job let go in w1 is not marked")
	setLimits(t, w1, kind, "max_concurrency = 5")

	younger := running(t, pool, kind, `{"tenant": "b"}`, "w2", 1, time.Now())
	d := decideOne(t, w2, younger, nil)
	require.Equal(t, ledger.Wait, d.Action, "the younger job started before the job let go was decided again")
	require.Equal(t, ledger.ReasonFIFO, d.Reason)

	older.FetchedAt = time.Now()
	out, err := w1.Decide(ctx, []ledger.Job{older}, nil, time.Second, nil)
	require.NoError(t, err)
	require.Equal(t, ledger.Slot, out.Decisions[0].Action, "the job let go: room")
	require.Zero(t, count(t, pool, `SELECT count(*) FROM concurrency_fetches WHERE job_id = $1`, older.ID),
		"its decision left its mark")
	requireRoundDue(t, out, kind, "", "a younger job waits with room left")
}

// requireRoundDue checks that decision out asks for a grant round of
// kind: under per-key limits alone (key not empty) of key's line alone,
// else of the kind's whole line.
func requireRoundDue(t *testing.T, out *ledger.Decided, kind, key, why string) {
	t.Helper()
	if key != "" {
		require.Equal(t, []string{key}, out.Recheck[kind], "%s: a grant round of its key's line (its alone) is due", why)
		return
	}
	require.Contains(t, out.Recheck, kind, "%s: a grant round is due", why)
}

// dueRound is the release that runs the grant rounds decision out asks
// for, as the worker sends it.
func dueRound(out *ledger.Decided) ledger.Release {
	return ledger.Release{KeyRounds: out.Recheck}
}

// TestParkAheadParksTheBacklogBehindALongLine: before a fetch, the
// available jobs of a key whose line has its wait cap of older jobs parked
// are parked, never fetched (their attempt untouched), in their key's line;
// a key with a shorter line, a job resumed ahead (a waiter) and jobs of
// other keys are left to the fetch. A change of the kind's limits waits
// for a parking under way, a parking never waits for a change (it parks
// nothing of the kind meanwhile), and a kind whose limits were cleared
// parks nothing.
func TestParkAheadParksTheBacklogBehindALongLine(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.ahead"
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, "partition_fields = '{tenant}', key_max = 1")
	lim := ledger.Limits{Kind: kind, Present: true, Fields: []string{"tenant"}, KeyMax: 1}
	limits := map[string]ledger.Limits{kind: lim}
	park := func(tenant string, n int) {
		for range n {
			id := queued(t, pool, kind, `{"tenant": "`+tenant+`"}`, "pending")
			exec(t, pool, `INSERT INTO concurrency_parked_jobs (job_id, kind, reason, worker_id, key) VALUES ($1, $2, 'key_limit', 'w0', $3)`,
				id, kind, `"`+tenant+`"`)
		}
	}
	park("a", lim.WaitCap(0))
	park("c", lim.WaitCap(0)-1)
	var behindA, others []int64
	for i := range 6 {
		switch i % 3 {
		case 0:
			behindA = append(behindA, queued(t, pool, kind, `{"tenant": "a"}`, "available"))
		case 1:
			others = append(others, queued(t, pool, kind, `{"tenant": "b"}`, "available"))
		default:
			others = append(others, queued(t, pool, kind, `{"tenant": "c"}`, "available"))
		}
	}
	waiter := queued(t, pool, kind, `{"tenant": "a"}`, "available")
	exec(t, pool, `INSERT INTO concurrency_waiters (job_id, kind, key, reason, ahead) VALUES ($1, $2, '"a"', 'key_limit', true)`, waiter, kind)
	others = append(others, waiter)

	// While a change of the kind's limits is under way, a fetch parks
	// nothing of the kind, at once: it never waits for a change.
	change, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = change.Rollback(ctx) }() // a failure below must not leave the pool waiting for it
	_, err = change.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('sluice.limit_change:' || $1::text, 0))`, kind)
	require.NoError(t, err)
	waitCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	parked, err := l.ParkAhead(waitCtx, pool, "default", limits, 100, 0)
	cancel()
	require.NoError(t, err, "a parking ahead waited for a change of limits")
	require.Empty(t, parked, "jobs parked while the kind's limits were being changed")
	require.NoError(t, change.Rollback(ctx))

	// A change of limits waits for the parking's transaction.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	parked, err = l.ParkAhead(ctx, tx, "default", limits, 100, 0)
	require.NoError(t, err)
	changed := make(chan struct{})
	go func() {
		defer close(changed)
		setLimits(t, l, kind, "key_max = 2")
	}()
	select {
	case <-changed:
		t.Fatal("a change of limits ran while a parking ahead was under way")
	case <-time.After(200 * time.Millisecond):
	}
	require.NoError(t, tx.Commit(ctx))
	<-changed

	require.ElementsMatch(t, behindA, parked, "the jobs behind a's long line, and only those, park")
	require.Equal(t, len(behindA), count(t, pool, `SELECT count(*) FROM river_job j JOIN concurrency_parked_jobs p ON p.job_id = j.id
		WHERE j.id = ANY($1) AND j.state = 'pending' AND j.attempt = 0 AND p.key = '"a"' AND p.reason = 'key_fifo'
		  AND (j.metadata->'sluice_parking'->>'parks')::int = 1`, behindA), "parked in a's line, never fetched")
	require.Equal(t, len(others), count(t, pool, `SELECT count(*) FROM river_job WHERE id = ANY($1) AND state = 'available'`, others),
		"a job of a shorter line, of another key, or resumed ahead was parked")

	// With the limits cleared, nothing parks.
	more := queued(t, pool, kind, `{"tenant": "a"}`, "available")
	setLimits(t, l, kind, "partition_fields = NULL, key_max = NULL")
	exec(t, pool, `INSERT INTO concurrency_parked_jobs (job_id, kind, reason, worker_id, key)
		SELECT id, kind, 'key_limit', 'w0', '"a"' FROM river_job WHERE kind = $1 AND state = 'pending' LIMIT 8
		ON CONFLICT DO NOTHING`, kind)
	parked, err = l.ParkAhead(ctx, pool, "default", limits, 100, 0)
	require.NoError(t, err)
	require.Empty(t, parked, "a kind whose limits were cleared parked jobs")
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM river_job WHERE id = $1 AND state = 'available'`, more))
}

// TestJobsWaitingForLeasedSlotsGoFirstAfterAChange: under a per-kind limit
// alone, worker w2 holds an older job waiting for a leased slot (published
// in its lease row, marked leased by its fetch, or both); the kind then
// gets a per-key limit (off the leased path). Until w2 decides the older
// job, a younger job of its key that w1 fetched waits in the line behind
// it, and a grant round gives it nothing; once w2 decided it, it goes
// first.
func TestJobsWaitingForLeasedSlotsGoFirstAfterAChange(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, c := range []struct{ published, marked bool }{{true, false}, {false, true}, {true, true}} {
		kind := fmt.Sprintf("test.unlease.published-%v.marked-%v", c.published, c.marked)
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			pool, w1 := newLedger(t, "w1")
			w2 := ledger.New(ledger.Config{Pool: pool, WorkerID: "w2"})
			setLimits(t, w1, kind, "max_concurrency = 2")
			older := running(t, pool, kind, `{"tenant": "a"}`, "w2", 1, time.Now().Add(-200*time.Millisecond))
			if c.published {
				exec(t, pool, `INSERT INTO concurrency_leases (kind, worker_id, slots, waiting) VALUES ($1, 'w2', 0, ARRAY[$2::bigint])`,
					kind, older.ID)
			}
			if c.marked {
				require.NoError(t, w2.MarkFetched(ctx, pool, []ledger.Fetched{{ID: older.ID, Kind: kind, Leased: true}}))
			}
			setLimits(t, w1, kind, "max_concurrency = 0, partition_fields = '{tenant}', key_max = 1")

			younger := running(t, pool, kind, `{"tenant": "a"}`, "w1", 1, time.Now())
			d := decideOne(t, w1, younger, nil)
			require.Equal(t, ledger.Wait, d.Action, "the younger job started before the older one, waiting for a leased slot, was decided")
			require.Equal(t, ledger.ReasonKeyFIFO, d.Reason)
			requireNotGranted(t, w1, pool, kind, younger.ID)

			out, err := w2.Decide(ctx, []ledger.Job{older}, nil, time.Second, nil)
			require.NoError(t, err)
			require.Equal(t, ledger.Slot, out.Decisions[0].Action, "the older job goes first")
		})
	}
}

// requireNotGranted runs a grant round of kind by l and requires that it
// granted job id, younger than a job of its line not decided yet, nothing.
func requireNotGranted(t *testing.T, l *ledger.Ledger, pool *pgxpool.Pool, kind string, id int64) {
	t.Helper()
	_, err := l.Release(context.Background(), ledger.Release{Rounds: []string{kind}}, nil)
	require.NoError(t, err)
	require.Zero(t, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = $1`, id),
		"a grant round granted the younger job past the older one not decided yet")
}

// TestAnUnleasedMarkHoldsLeasesBack: a job another worker fetched and has
// not decided yet, marked by its fetch for the line (not leased: its
// worker's leased path was closed), counts for the leased path as a job
// waiting in that worker, from its fetch on: no worker gives a leased slot
// to a job fetched more than FetchTolerance after it. Seed 760667819 of
// the torture test: a worker's 18 jobs fetched for the line waited 230 ms
// for their decision while another worker's leased path started younger
// jobs, one fetched 121 ms after them.
func TestAnUnleasedMarkHoldsLeasesBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.unleasedmark"
	pool, holder, waiter := leaseHolder(t, kind, 3, 2)

	job := running(t, pool, kind, `{}`, "w2", 1, time.Now())
	require.NoError(t, waiter.MarkFetched(ctx, pool, []ledger.Fetched{{ID: job.ID, Kind: kind}}))
	st, err := holder.LeaseState(ctx, kind, 50*time.Millisecond)
	require.NoError(t, err)
	require.False(t, st.OldestOther.IsZero(), "the holder's leased path does not see the job w2 fetched and has not decided")
	require.WithinDuration(t, time.Now(), st.OldestOther, 5*time.Second)
	require.Equal(t, st.OldestOther, st.OldestOtherLine, "the job fetched for the line is the oldest of the line elsewhere")

	_, err = waiter.Decide(ctx, []ledger.Job{{ID: job.ID, Kind: kind, Args: []byte(`{}`), FetchedAt: time.Now(), Attempt: 1}}, nil, time.Second, nil)
	require.NoError(t, err)
	st, err = holder.LeaseState(ctx, kind, 50*time.Millisecond)
	require.NoError(t, err)
	require.True(t, st.OldestOther.IsZero(), "a job decided still counts as fetched and not decided")
}

// TestLeaseStateTellsWhenTheOtherLinesWereFetched: the lease state tells
// a worker when the oldest job of the line waiting in another worker was
// fetched (its own jobs of the line do not count), for a hand-over in
// memory follows fetch order under a per-kind limit alone, and which job
// is the oldest resumed ahead and not fetched yet, which goes first
// whatever its fetch.
func TestLeaseStateTellsWhenTheOtherLinesWereFetched(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.otherline"
	pool, holder, other := leaseHolder(t, kind, 1, 1)

	st, err := holder.LeaseState(ctx, kind, 50*time.Millisecond)
	require.NoError(t, err)
	require.True(t, st.OldestOtherLine.IsZero(), "nothing waits elsewhere")
	require.Zero(t, st.OldestResumed)

	own := running(t, pool, kind, `{}`, "w1", 1, time.Now().Add(-2*time.Second).Truncate(time.Millisecond))
	require.Equal(t, ledger.Wait, decideOne(t, holder, own, nil).Action, "the kind's one slot is leased: the job waits")
	fetched := time.Now().Add(-time.Second).Truncate(time.Millisecond)
	elsewhere := running(t, pool, kind, `{}`, "w2", 1, fetched)
	require.Equal(t, ledger.Wait, decideOne(t, other, elsewhere, nil).Action)
	st, err = holder.LeaseState(ctx, kind, 50*time.Millisecond)
	require.NoError(t, err)
	require.WithinDuration(t, fetched, st.OldestOtherLine, time.Millisecond,
		"the job waiting in w2's line (not w1's own, fetched earlier) is the oldest of the line elsewhere")
	require.Zero(t, st.OldestResumed)

	resumed := queued(t, pool, kind, `{}`, "available")
	_, err = pool.Exec(ctx, `INSERT INTO concurrency_waiters (job_id, kind, reason, ahead) VALUES ($1, $2, 'limit', true)`, resumed, kind)
	require.NoError(t, err)
	st, err = holder.LeaseState(ctx, kind, 50*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, resumed, st.OldestResumed, "a job resumed ahead and not fetched is the oldest resumed")
	require.WithinDuration(t, fetched, st.OldestOtherLine, time.Millisecond)
}

// TestParkAheadReadsEachLineByItsIndex: a fetch that parks the backlog
// behind a long line reads each line's parked jobs by their index, however
// its connection's cached plan was made. Planned while few jobs were
// parked (a prepared statement's generic plan, kept as the table grows),
// the pick read every parked job of the line, by a bitmap scan and a
// sort, for each available job it looked at (2-3 s a fetch with 4,800
// parked in P11, while the jobs the rate had granted waited for it). The
// transaction's own counts tell: 500 jobs behind 2,000 parked. The fetch's
// transaction gets its plan settings back for River's fetch.
func TestParkAheadReadsEachLineByItsIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.ahead.plan"
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, "max_concurrency = 2")
	limits := map[string]ledger.Limits{kind: {Kind: kind, Present: true, Max: 2}}
	park := func(n int) {
		exec(t, pool, `WITH j AS (INSERT INTO river_job (args, kind, max_attempts, state, queue)
			SELECT '{}', $1, 5, 'pending', 'default' FROM generate_series(1, $2::int) RETURNING id)
			INSERT INTO concurrency_parked_jobs (job_id, kind, reason, worker_id) SELECT id, $1, 'limit', 'w0' FROM j`, kind, n)
	}
	available := func(n int) {
		exec(t, pool, `INSERT INTO river_job (args, kind, max_attempts, state, queue)
			SELECT '{}', $1, 5, 'available', 'default' FROM generate_series(1, $2::int)`, kind, n)
	}
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	// pickOn parks ahead in a transaction on conn and returns the jobs
	// parked, the parked jobs' rows read, and the settings it left.
	pickOn := func(commit bool) (parked []int64, fetched int64, settings []string) {
		t.Helper()
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		parked, err = l.ParkAhead(ctx, tx, "default", limits, 500, 0)
		require.NoError(t, err)
		var seqscan, bitmapscan string
		require.NoError(t, tx.QueryRow(ctx, `SELECT COALESCE(idx_tup_fetch, 0) + COALESCE(seq_tup_read, 0), current_setting('enable_seqscan'), current_setting('enable_bitmapscan')
			FROM pg_stat_xact_user_tables WHERE relname = 'concurrency_parked_jobs'`).Scan(&fetched, &seqscan, &bitmapscan))
		if commit {
			require.NoError(t, tx.Commit(ctx))
		}
		return parked, fetched, []string{seqscan, bitmapscan}
	}
	// The connection's plans, made while 8 jobs are parked.
	exec(t, pool, "ANALYZE concurrency_parked_jobs")
	park(8)
	available(1)
	for range 8 {
		parked, _, _ := pickOn(false)
		require.Len(t, parked, 1)
	}

	park(2000)
	available(500)
	parked, fetched, settings := pickOn(true)
	require.Len(t, parked, 500, "the 500 looked at are all behind the line's parked ones")
	require.Less(t, fetched, int64(50_000), "parked jobs read to pick 500 jobs behind 2,008")
	require.Equal(t, []string{"on", "on"}, settings, "the fetch's plan settings after the pick")
}

// TestLeaseStateCountsAFetchInFlight: a fetch's marks show from its
// commit, so another connection's fetch in flight for longer than
// FetchInFlight counts in the lease state as a job fetched at its start
// (torture seed 530070960: a job took a spare leased slot 50 ms after an
// older one was fetched elsewhere, whose fetch had not committed); one in
// flight for less, the reader's own, and one ended do not.
func TestLeaseStateCountsAFetchInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.fetchinflight"
	pool, _, _ := leaseHolder(t, kind, 3, 1)
	soon := ledger.New(ledger.Config{Pool: pool, WorkerID: "w1", FetchInFlight: time.Millisecond})
	late := ledger.New(ledger.Config{Pool: pool, WorkerID: "w1", FetchInFlight: time.Hour})
	oldestOther := func(l *ledger.Ledger) time.Time {
		t.Helper()
		st, err := l.LeaseState(ctx, kind, 50*time.Millisecond)
		require.NoError(t, err)
		return st.OldestOther
	}

	fetch, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = fetch.Rollback(ctx) }()
	require.NoError(t, soon.Fetching(ctx, fetch))
	var began time.Time
	require.NoError(t, fetch.QueryRow(ctx, `SELECT now()`).Scan(&began))
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_sleep(0.005)`).Scan(new(any)))

	require.True(t, oldestOther(late).IsZero(), "a fetch in flight for less than FetchInFlight counted")
	require.True(t, began.Equal(oldestOther(soon)), "a fetch in flight for longer than FetchInFlight did not count from its start (%s)", began)
	st, err := soon.LeaseStateOn(ctx, fetch, kind, 50*time.Millisecond)
	require.NoError(t, err)
	require.True(t, st.OldestOther.IsZero(), "the reader's own fetch counted")

	require.NoError(t, fetch.Commit(ctx))
	require.True(t, oldestOther(soon).IsZero(), "a fetch that ended still counts")
}
