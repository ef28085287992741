package ledger_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/limiter/internal/ledger"
)

// newLedger is a ledger of worker on a fresh database.
func newLedger(t *testing.T, worker string) (*pgxpool.Pool, *ledger.Ledger) {
	t.Helper()
	pool := testdb.NewPool(t)
	return pool, ledger.New(ledger.Config{Pool: pool, WorkerID: worker})
}

// leaseHolder returns the ledgers of two workers on one database: w1,
// which holds leased slots of kind (leased of a per-kind limit of limit),
// and w2, which holds none.
func leaseHolder(t *testing.T, kind string, limit, leased int32) (pool *pgxpool.Pool, holder, other *ledger.Ledger) {
	t.Helper()
	pool, holder = newLedger(t, "w1")
	other = ledger.New(ledger.Config{Pool: pool, WorkerID: "w2"})
	setLimits(t, holder, kind, fmt.Sprintf("max_concurrency = %d", limit))
	granted, _, offPath, err := holder.Lease(context.Background(), kind, leased)
	require.NoError(t, err)
	require.False(t, offPath)
	require.Equal(t, leased, granted)
	return pool, holder, other
}

// setLimits writes kind's limit row (set: its columns, as SQL) through a
// change of limits, as the CLI does.
func setLimits(t *testing.T, l *ledger.Ledger, kind, set string) *ledger.Granted {
	t.Helper()
	g, err := l.Change(context.Background(), kind, func(tx *ledger.Tx) error {
		_, err := tx.Pgx().Exec(tx.Context(), `INSERT INTO concurrency_limits (kind, max_concurrency) VALUES ($1, 0)
			ON CONFLICT (kind) DO NOTHING`, kind)
		if err != nil {
			return err
		}
		_, err = tx.Pgx().Exec(tx.Context(), `UPDATE concurrency_limits SET `+set+` WHERE kind = $1`, kind)
		return err
	}, nil)
	require.NoError(t, err)
	return g
}

// exec runs sql.
func exec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	_, err := pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err)
}

// count runs a counting query.
func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// running inserts a River job of kind, running in worker since its fetch
// at fetched, and returns it as the ledger decides it.
func running(t *testing.T, pool *pgxpool.Pool, kind, args, worker string, attempt int, fetched time.Time) ledger.Job {
	t.Helper()
	var id int64
	require.NoError(t, pool.QueryRow(context.Background(), `INSERT INTO river_job (args, kind, max_attempts, state, queue, attempt,
		attempted_at, attempted_by) VALUES ($1, $2, 5, 'running', 'default', $3, $4, ARRAY[$5]) RETURNING id`,
		args, kind, attempt, fetched, worker).Scan(&id))
	return ledger.Job{ID: id, Kind: kind, Args: []byte(args), FetchedAt: fetched, Attempt: attempt, Dispatched: true}
}

// queued inserts a job of kind with args in state (available, pending),
// never fetched, and returns its id.
func queued(t *testing.T, pool *pgxpool.Pool, kind, args, state string) int64 {
	t.Helper()
	var id int64
	require.NoError(t, pool.QueryRow(context.Background(), `INSERT INTO river_job (args, kind, max_attempts, state, queue)
		VALUES ($1, $2, 5, $3, 'default') RETURNING id`, args, kind, state).Scan(&id))
	return id
}

// admitted is kind's count of slots and its slot rows.
func admitted(t *testing.T, pool *pgxpool.Pool, kind string) (count, rows int) {
	t.Helper()
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT COALESCE((SELECT admitted FROM concurrency_limits WHERE kind = $1), 0),
		(SELECT count(*) FROM concurrency_executions WHERE kind = $1)`, kind).Scan(&count, &rows))
	return count, rows
}

// decideOne decides job and returns its decision.
func decideOne(t *testing.T, l *ledger.Ledger, job ledger.Job, guess map[string]ledger.Limits) ledger.Decision {
	t.Helper()
	d, err := l.Decide(context.Background(), []ledger.Job{job}, guess, time.Second, nil)
	require.NoError(t, err)
	require.Len(t, d.Decisions, 1)
	return d.Decisions[0]
}

// parkAllForTheKind records every job of kind the test inserted as
// parked in w1 for the kind's limit, under the key of its args' "key"
// field, and flags the kind as having jobs parked, as the decisions that
// parked them would have.
func parkAllForTheKind(t *testing.T, pool *pgxpool.Pool, kind string) {
	t.Helper()
	exec(t, pool, `INSERT INTO concurrency_parked_jobs (job_id, kind, reason, worker_id, key)
		SELECT j.id, j.kind, 'limit', 'w1', sluice_partition_key(j.args, '{key}') FROM river_job j WHERE j.kind = $1`, kind)
	exec(t, pool, `UPDATE concurrency_limits SET has_parked = true WHERE kind = $1`, kind)
}

// TestDecideLetsGoWhatAnUnlimitedJobHeld: a job that holds a slot and is
// decided again (its wait ended as its grant came) after its kind's limits
// were cleared runs without a limit, and the slot it held goes back: a job
// running without a slot never releases one, so the row and the count
// would stay taken.
func TestDecideLetsGoWhatAnUnlimitedJobHeld(t *testing.T) {
	t.Parallel()
	const kind = "test.unlimited"
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, "max_concurrency = 1")
	job := running(t, pool, kind, `{}`, "w1", 1, time.Now().Add(-time.Minute))
	exec(t, pool, `INSERT INTO concurrency_executions (job_id, kind, worker_id) VALUES ($1, $2, 'w1')`, job.ID, kind)
	exec(t, pool, `UPDATE concurrency_limits SET admitted = 1 WHERE kind = $1`, kind)
	setLimits(t, l, kind, "max_concurrency = 0")
	_, rows := admitted(t, pool, kind)
	require.Equal(t, 1, rows, "a cleared limit leaves the slot of a running job to its release")

	job.TimedOut = true
	d := decideOne(t, l, job, nil)
	require.Equal(t, ledger.Run, d.Action, "no limit: it runs, without a slot")
	n, rows := admitted(t, pool, kind)
	require.Zero(t, rows, "the slot it held went back")
	require.Zero(t, n)
}

// TestRecheckUnderABreakerParks: a job that took a slot and has not begun
// when its kind becomes a circuit breaker is decided again (Recheck): it
// parks, and its slot goes back in the same transaction. So it does when
// it is decided again without Recheck (its wait ended as a grant came,
// before its worker heard of the breaker): the ledger decides by the
// limits it reads.
func TestRecheckUnderABreakerParks(t *testing.T) {
	t.Parallel()
	for _, recheck := range []bool{true, false} {
		kind := "test.breaker." + map[bool]string{true: "recheck", false: "plain"}[recheck]
		pool, l := newLedger(t, "w1")
		setLimits(t, l, kind, "max_concurrency = 2")
		job := running(t, pool, kind, `{}`, "w1", 1, time.Now().Add(-time.Second))
		require.Equal(t, ledger.Slot, decideOne(t, l, job, nil).Action, "room: it takes a slot")
		setLimits(t, l, kind, "max_concurrency = -1")
		n, rows := admitted(t, pool, kind)
		require.Equal(t, 1, rows, "a breaker leaves the slot of a decided job")
		require.Equal(t, 1, n)

		job.Recheck = recheck
		d := decideOne(t, l, job, nil)
		require.Equal(t, ledger.Parked, d.Action, "decided again under a breaker (recheck %t): it parks", recheck)
		require.Equal(t, ledger.ReasonBreaker, d.Reason)
		n, rows = admitted(t, pool, kind)
		require.Zero(t, rows, "its slot went back")
		require.Zero(t, n)
		require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_parked_jobs WHERE job_id = $1`, job.ID))
	}
}

// TestRecheckUnderANewRate: a job that took a slot and has not begun when
// a rate is set on its kind holds no start of it. Decided again (Recheck,
// or for its own reasons: its worker had not heard of the rate) with room
// in the window, it keeps a slot and logs a start; with the window full,
// its slot goes back (the count with it) and it waits for the window like
// any new job.
func TestRecheckUnderANewRate(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ full, recheck bool }{{false, true}, {true, true}, {false, false}, {true, false}} {
		full := c.full
		kind := "test.rate." + map[bool]string{true: "full", false: "room"}[full] + map[bool]string{true: ".recheck", false: ""}[c.recheck]
		pool, l := newLedger(t, "w1")
		setLimits(t, l, kind, "max_concurrency = 2")
		job := running(t, pool, kind, `{}`, "w1", 1, time.Now().Add(-time.Second))
		require.Equal(t, ledger.Slot, decideOne(t, l, job, nil).Action, "room: it takes a slot")
		setLimits(t, l, kind, "rate_max = 1, rate_period = interval '1 minute'")
		if full {
			other := running(t, pool, kind, `{}`, "w1", 1, time.Now())
			exec(t, pool, `INSERT INTO concurrency_starts (kind, job_id, started_at) VALUES ($1, $2, now())`, kind, other.ID)
		}
		job.Recheck = c.recheck
		d := decideOne(t, l, job, nil)
		n, rows := admitted(t, pool, kind)
		if !full {
			require.Equal(t, ledger.Slot, d.Action, "room in the window: it starts")
			require.Equal(t, 1, rows)
			require.Equal(t, 1, n)
			require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_starts WHERE job_id = $1`, job.ID), "its start logged")
			continue
		}
		require.Contains(t, []ledger.Action{ledger.Wait, ledger.Parked}, d.Action, "the window is full: it does not start")
		require.Equal(t, ledger.ReasonRate, d.Reason)
		require.True(t, d.GaveBack, "the decision does not say it gave the job's slot back")
		require.Zero(t, rows, "its slot went back")
		require.Zero(t, n)
	}
}

// TestKeysNotServedGoInTheOrderTheyCame: under a per-kind limit of 1 over
// keys, key "zz" begins to wait before key "aa"; neither was served. The
// slot that frees goes to "zz", the first to come, not to the first by
// name.
func TestKeysNotServedGoInTheOrderTheyCame(t *testing.T) {
	t.Parallel()
	const kind = "test.arrival"
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, "max_concurrency = 1, partition_fields = '{key}', key_max = 1")
	holder := running(t, pool, kind, `{"key": "a0"}`, "w1", 1, time.Now().Add(-time.Second))
	require.Equal(t, ledger.Slot, decideOne(t, l, holder, nil).Action)
	guess := map[string]ledger.Limits{kind: {Kind: kind, Max: 1, KeyMax: 1, Fields: []string{"key"}}}
	first := running(t, pool, kind, `{"key": "zz"}`, "w1", 1, time.Now().Add(-500*time.Millisecond))
	require.Equal(t, ledger.Wait, decideOne(t, l, first, guess).Action, "the limit is full: it waits")
	second := running(t, pool, kind, `{"key": "aa"}`, "w1", 1, time.Now())
	require.Equal(t, ledger.Wait, decideOne(t, l, second, guess).Action)

	g, err := l.Release(context.Background(), ledger.Release{Ended: []ledger.Held{{ID: holder.ID, Kind: kind, Key: "a0"}}}, nil)
	require.NoError(t, err)
	require.Equal(t, []int64{first.ID}, g.LocalOrder, "the slot goes to the key that came first")
}

// TestKeysTakeTurnsInTheOrderTheyBeganWaiting: under a per-kind limit of
// 1 over keys (1 per key), keys take their turns as a queue, each from its
// last turn or, never served, its arrival. Z's three jobs and then K's
// first wait behind a holder; Z is served first (it came first), then K,
// then Z again (served before K was). K's job ends with nothing of K
// waiting, so K's row goes; K's next job comes after Z's last turn, and
// waits for Z's third job: a key back after its row went is not a key
// never served (torture seed 996502126: such a key took three turns ahead
// of a key that waited). A key served at its decision goes to the back
// then: A, served as its two jobs took both slots of a limit of 2, and B,
// which came after, take their turns A, then B.
func TestKeysTakeTurnsInTheOrderTheyBeganWaiting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("a key back after its row went", func(t *testing.T) {
		t.Parallel()
		const kind = "test.turns.back"
		pool, l := newLedger(t, "w1")
		setLimits(t, l, kind, "max_concurrency = 1, partition_fields = '{key}', key_max = 1")
		guess := map[string]ledger.Limits{kind: {Kind: kind, Max: 1, KeyMax: 1, Fields: []string{"key"}}}
		job := func(key string) ledger.Job {
			return running(t, pool, kind, `{"key": "`+key+`"}`, "w1", 1, time.Now())
		}
		release := func(j ledger.Job, key string) []int64 {
			t.Helper()
			g, err := l.Release(ctx, ledger.Release{Ended: []ledger.Held{{ID: j.ID, Kind: kind, Key: `"` + key + `"`}}}, nil)
			require.NoError(t, err)
			return g.LocalOrder
		}
		holder := job("H")
		require.Equal(t, ledger.Slot, decideOne(t, l, holder, guess).Action)
		var z []ledger.Job
		for range 3 {
			z = append(z, job("Z"))
			require.Equal(t, ledger.Wait, decideOne(t, l, z[len(z)-1], guess).Action)
		}
		k1 := job("K")
		require.Equal(t, ledger.Wait, decideOne(t, l, k1, guess).Action)

		require.Equal(t, []int64{z[0].ID}, release(holder, "H"), "Z came first")
		require.Equal(t, []int64{k1.ID}, release(z[0], "Z"), "K waited since before Z's turn")
		require.Equal(t, []int64{z[1].ID}, release(k1, "K"), "Z's turn")
		require.Zero(t, count(t, pool, `SELECT count(*) FROM concurrency_key_lines WHERE kind = $1 AND key = '"K"'`, kind),
			"K's row stayed with nothing of K waiting: the test no longer tests a key back after its row went")
		k2 := job("K")
		require.Equal(t, ledger.Wait, decideOne(t, l, k2, guess).Action)
		require.Equal(t, []int64{z[2].ID}, release(z[1], "Z"),
			"K, back after its row went, took a second turn ahead of Z, which began waiting for its turn before K came back")
		require.Equal(t, []int64{k2.ID}, release(z[2], "Z"))
	})
	t.Run("a key served at its decision", func(t *testing.T) {
		t.Parallel()
		const kind = "test.turns.decision"
		pool, l := newLedger(t, "w1")
		setLimits(t, l, kind, "max_concurrency = 2, partition_fields = '{key}', key_max = 2")
		a1 := running(t, pool, kind, `{"key": "A"}`, "w1", 1, time.Now().Add(-time.Second))
		a2 := running(t, pool, kind, `{"key": "A"}`, "w1", 1, time.Now().Add(-time.Second))
		require.Equal(t, ledger.Slot, decideOne(t, l, a1, nil).Action)
		require.Equal(t, ledger.Slot, decideOne(t, l, a2, nil).Action)
		a3 := running(t, pool, kind, `{"key": "A"}`, "w1", 1, time.Now().Add(-500*time.Millisecond))
		require.Equal(t, ledger.Wait, decideOne(t, l, a3, nil).Action, "the limit is full: it waits")
		b1 := running(t, pool, kind, `{"key": "B"}`, "w1", 1, time.Now())
		require.Equal(t, ledger.Wait, decideOne(t, l, b1, nil).Action)

		g, err := l.Release(ctx, ledger.Release{Ended: []ledger.Held{{ID: a1.ID, Kind: kind, Key: `"A"`}}}, nil)
		require.NoError(t, err)
		require.Equal(t, []int64{a3.ID}, g.LocalOrder, "A, served before B came, goes first")
		g, err = l.Release(ctx, ledger.Release{Ended: []ledger.Held{{ID: a2.ID, Kind: kind, Key: `"A"`}}}, nil)
		require.NoError(t, err)
		require.Equal(t, []int64{b1.ID}, g.LocalOrder, "B's turn: A was served again")
	})
}

// TestDecideARetryAfresh: a job retried at once is fetched again before
// the release of its first attempt is written: the first attempt's slot
// row and start are still there. The new attempt is decided afresh and
// logs a start of its own, so the rate window counts it, on the one slot
// row of the job.
func TestDecideARetryAfresh(t *testing.T) {
	t.Parallel()
	const kind = "test.retried"
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, "max_concurrency = 5, rate_max = 10, rate_period = interval '1 minute'")
	job := running(t, pool, kind, `{}`, "w1", 2, time.Now().Add(-100*time.Millisecond))
	exec(t, pool, `INSERT INTO concurrency_executions (job_id, kind, worker_id, admitted_at) VALUES ($1, $2, 'w1', now() - interval '2 seconds')`,
		job.ID, kind)
	exec(t, pool, `UPDATE concurrency_limits SET admitted = 1 WHERE kind = $1`, kind)
	exec(t, pool, `INSERT INTO concurrency_starts (kind, job_id, started_at) VALUES ($1, $2, now() - interval '2 seconds')`, kind, job.ID)

	d := decideOne(t, l, job, nil)
	require.Equal(t, ledger.Slot, d.Action, "room in the limit and the rate: it starts with a slot")
	require.Equal(t, 2, count(t, pool, `SELECT count(*) FROM concurrency_starts WHERE job_id = $1`, job.ID),
		"attempt 2 logged a start of its own")
	n, rows := admitted(t, pool, kind)
	require.Equal(t, 1, rows, "one slot row per job")
	require.Equal(t, rows, n, "the count equals the rows")
}

// TestReleaseRacesLimitRowCreation: slots of a kind without a limit row
// (its limits were cleared while jobs held them) are released while a
// limit is set on the kind, over and over: the new row counts the slots
// it finds, and a release must lower that count or free its slot before
// the row is made. At the end of each round the count equals the rows.
func TestReleaseRacesLimitRowCreation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.rowless"
	pool, l := newLedger(t, "w1")
	admin := ledger.New(ledger.Config{Pool: pool, WorkerID: "cli"})
	for i := range int64(100) {
		exec(t, pool, `DELETE FROM concurrency_limits WHERE kind = $1`, kind)
		exec(t, pool, `INSERT INTO concurrency_executions (job_id, kind, worker_id) VALUES ($1, $2, 'w1')`, i+1, kind)
		done := make(chan struct{})
		go func() {
			defer close(done)
			setLimits(t, admin, kind, "max_concurrency = 5")
		}()
		_, err := l.Release(ctx, ledger.Release{Ended: []ledger.Held{{ID: i + 1, Kind: kind}}}, nil)
		require.NoError(t, err)
		<-done
		n, rows := admitted(t, pool, kind)
		require.Equal(t, rows, n, "round %d: the count equals the slot rows", i)
	}
}

// TestCleanUpWaitsForALimitRowInTheMaking: the safety net frees the stale
// slot of a kind that has no limit row while another transaction gives the
// kind one by plain SQL (its insert counts the slot rows it finds, under
// the kind's ledger lock, which the row's trigger takes). The clean-up
// waits for that transaction, then keeps the slot (found stale once) with
// its count under the new row; a second clean-up frees it and lowers the
// count.
func TestCleanUpWaitsForALimitRowInTheMaking(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.rowless"
	pool, l := newLedger(t, "w1")
	// A slot left by job 42 (no longer in River) of a kind whose limits
	// were cleared while it ran.
	exec(t, pool, `INSERT INTO concurrency_executions (job_id, kind, worker_id) VALUES (42, $1, 'w1')`, kind)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	_, err = tx.Exec(ctx, `INSERT INTO concurrency_limits (kind, max_concurrency) VALUES ($1, 1)`, kind)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		_, _, _, err := l.CleanUp(ctx, kind, 30*time.Second, 0, 15*time.Second, "test")
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("the clean-up did not wait for the limit row being made (err %v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, tx.Commit(ctx))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the clean-up did not finish")
	}
	n, rows := admitted(t, pool, kind)
	require.Equal(t, rows, n, "the count does not match the slot rows")
	// Found a second time (the grace is 0 here), the stale slot goes.
	_, _, _, err = l.CleanUp(ctx, kind, 30*time.Second, 0, 15*time.Second, "test")
	require.NoError(t, err)
	n, rows = admitted(t, pool, kind)
	require.Zero(t, rows, "the stale slot is still there")
	require.Equal(t, rows, n, "the count does not match the slot rows")
}

// TestGrantWaitsForAParkingInProgress (the torture test's seed 399460107):
// under a per-kind limit alone, a grant round that finds the oldest job of
// the line still completing its parking (its worker committed it; River's
// completion has not made it pending yet) grants nothing past it: a
// younger parked job granted then would start before it. Once River's
// completion makes it pending, the next round resumes it first.
func TestGrantWaitsForAParkingInProgress(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.parking"
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, "max_concurrency = 2")
	// Job 1 is completing its parking: running, marked, recorded. Jobs 2
	// and 3, younger, are parked.
	exec(t, pool, `
		INSERT INTO river_job (id, args, kind, max_attempts, state, queue, priority, attempt, attempted_at, attempted_by, metadata)
		VALUES (1, '{}', $1, 5, 'running', 'default', 1, 1, now(), '{w1}', '{"sluice_park": true}'),
		       (2, '{}', $1, 5, 'pending', 'default', 1, 0, NULL, '{}', '{}'),
		       (3, '{}', $1, 5, 'pending', 'default', 1, 0, NULL, '{}', '{}')`, kind)
	exec(t, pool, `INSERT INTO concurrency_parked_jobs (job_id, kind, reason, worker_id)
		VALUES (1, $1, 'limit', 'w1'), (2, $1, 'limit', 'w1'), (3, $1, 'limit', 'w1')`, kind)
	exec(t, pool, `UPDATE concurrency_limits SET has_parked = true WHERE kind = $1`, kind)
	state := func(id int) string {
		var s string
		require.NoError(t, pool.QueryRow(ctx, `SELECT state::text FROM river_job WHERE id = $1`, id).Scan(&s))
		return s
	}
	round := ledger.Release{Rounds: []string{kind}}
	_, err := l.Release(ctx, round, nil)
	require.NoError(t, err)
	require.Equal(t, "pending", state(2), "nothing is granted past a parking in progress")
	require.Equal(t, "pending", state(3))

	// River's completion lands: the job is parked in place.
	exec(t, pool, `UPDATE river_job SET state = 'completed', finalized_at = now() WHERE id = 1`)
	require.Equal(t, "pending", state(1))
	_, err = l.Release(ctx, round, nil)
	require.NoError(t, err)
	require.Equal(t, "available", state(1), "the oldest is resumed first")
	require.Equal(t, "available", state(2))
	require.Equal(t, "pending", state(3), "two slots")
}

// TestAPartitionClearedLeavesTheKeysParkedJobsWaitingForTheKind: a job
// parked for its key's limit waits for the kind once the partition is
// cleared (a per-kind limit left alone), and the kind stays off the leased
// path while it is parked: a change of limits grants nothing past a parking
// in progress, and the kind's count of jobs waiting for it (has_parked)
// counted only parkings for the kind itself, so the workers leased slots
// to jobs younger than it (torture seed 738679279: three jobs fetched 100
// ms after it started on leased slots while it completed its parking).
func TestAPartitionClearedLeavesTheKeysParkedJobsWaitingForTheKind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.unpartitioned"
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, "max_concurrency = 20, partition_fields = '{key}', key_max = 1")
	// Job 1, of key a, is completing its parking for its key's limit.
	exec(t, pool, `
		INSERT INTO river_job (id, args, kind, max_attempts, state, queue, priority, attempt, attempted_at, attempted_by, metadata)
		VALUES (1, '{"key": "a"}', $1, 5, 'running', 'default', 1, 1, now(), '{w1}', '{"sluice_park": true}')`, kind)
	exec(t, pool, `INSERT INTO concurrency_parked_jobs (job_id, kind, reason, worker_id, key) VALUES (1, $1, 'key_limit', 'w1', 'a')`, kind)

	setLimits(t, l, kind, "partition_fields = NULL, key_max = NULL")
	require.Equal(t, 0, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE kind = $1`, kind),
		"nothing is granted past a parking in progress")
	st, err := l.LeaseState(ctx, kind, 50*time.Millisecond)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.OldestParked)
	require.True(t, st.OffPath, "the leased path is open while an older job is parked")
}

// TestKeysDoNotShareALock: under per-key limits alone, a decision, a
// release and a grant round of one key's line (a recheck) do not wait for
// a transaction that holds another key's lock (its row in
// concurrency_key_lines); a decision of the same key does. A kind-wide limit beside the partition makes every decision of
// the kind take the kind's lock, exclusive.
func TestKeysDoNotShareALock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.keys"
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, "partition_fields = '{tenant}', key_max = 1")
	limits, err := l.ReadLimits(ctx)
	require.NoError(t, err)
	require.Equal(t, ledger.Keys, limits[kind].Regime())

	// Another transaction holds key "b" (and, as every transaction of the
	// kind's keys does, the kind's lock shared).
	exec(t, pool, `INSERT INTO concurrency_key_lines (kind, key) VALUES ($1, '"b"')`, kind)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock_shared(hashtextextended('sluice.limit_row:' || $1, 0))`, kind)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM concurrency_key_lines WHERE kind = $1 AND key = '"b"' FOR UPDATE`, kind)
	require.NoError(t, err)

	a := running(t, pool, kind, `{"tenant": "a"}`, "w1", 1, time.Now())
	quick, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	d, err := l.Decide(quick, []ledger.Job{a}, limits, time.Second, nil)
	require.NoError(t, err, "key a waited for key b's lock")
	require.Equal(t, ledger.Slot, d.Decisions[0].Action)
	_, err = l.Release(quick, ledger.Release{Ended: []ledger.Held{{ID: a.ID, Kind: kind, Key: `"a"`}}}, limits)
	require.NoError(t, err, "key a's release waited for key b's lock")
	_, err = l.Release(quick, ledger.Release{KeyRounds: map[string][]string{kind: {`"a"`}}}, limits)
	require.NoError(t, err, "a grant round of key a's line (a recheck) waited for key b's lock")

	b := running(t, pool, kind, `{"tenant": "b"}`, "w1", 1, time.Now())
	decided := make(chan error, 1)
	go func() {
		_, err := l.Decide(ctx, []ledger.Job{b}, limits, time.Second, nil)
		decided <- err
	}()
	select {
	case err := <-decided:
		t.Fatalf("key b's decision did not wait for key b's lock (err %v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, <-decided)

	// With a per-kind limit, the kind's lock is exclusive: a transaction
	// holding it holds up every key.
	setLimits(t, l, kind, "max_concurrency = 5")
	limits, err = l.ReadLimits(ctx)
	require.NoError(t, err)
	require.Equal(t, ledger.KindWide, limits[kind].Regime())
	held, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer held.Rollback(ctx) //nolint:errcheck
	_, err = held.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('sluice.limit_row:' || $1, 0))`, kind)
	require.NoError(t, err)
	c := running(t, pool, kind, `{"tenant": "c"}`, "w1", 1, time.Now())
	go func() {
		_, err := l.Decide(ctx, []ledger.Job{c}, limits, time.Second, nil)
		decided <- err
	}()
	select {
	case err := <-decided:
		t.Fatalf("a decision under a kind-wide limit did not wait for the kind's lock (err %v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, held.Rollback(ctx))
	require.NoError(t, <-decided)
}

// TestLoweredKeyLimitTakesBackGrants: a per-key limit lowered while slots
// are reserved for resumed jobs of a key (granted, not claimed yet) takes
// back the grants beyond the new limit, newest first: their jobs wait in
// the line again, and the key's count follows its rows.
func TestLoweredKeyLimitTakesBackGrants(t *testing.T) {
	t.Parallel()
	const kind = "test.lowered"
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, "partition_fields = '{tenant}', key_max = 3")
	held := running(t, pool, kind, `{"tenant": "a"}`, "w1", 1, time.Now())
	exec(t, pool, `INSERT INTO concurrency_executions (job_id, kind, worker_id, key) VALUES ($1, $2, 'w1', '"a"')`, held.ID, kind)
	var granted []int64
	for range 2 {
		var id int64
		require.NoError(t, pool.QueryRow(context.Background(), `INSERT INTO river_job (args, kind, max_attempts, state, queue)
			VALUES ('{"tenant": "a"}', $1, 5, 'available', 'default') RETURNING id`, kind).Scan(&id))
		exec(t, pool, `INSERT INTO concurrency_executions (job_id, kind, reserved, key) VALUES ($1, $2, true, '"a"')`, id, kind)
		granted = append(granted, id)
	}
	setLimits(t, l, kind, "key_max = 2")
	require.Equal(t, 2, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE kind = $1`, kind), "one grant taken back")
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = $1`, granted[0]), "the oldest kept")
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_waiters WHERE job_id = $1 AND worker_id IS NULL`, granted[1]),
		"the newest waits in the line again")
	require.Equal(t, 2, count(t, pool, `SELECT slots FROM concurrency_key_lines WHERE kind = $1 AND key = '"a"'`, kind))
}

// TestWaitingPublishedBeforeAnyLease: a worker whose jobs wait for a leased
// slot before it leased any publishes them all the same, and the worker
// holding the kind's slots sees them (its younger jobs let them go first);
// publishing none waiting clears them.
func TestWaitingPublishedBeforeAnyLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.leased"
	pool, holder, waiter := leaseHolder(t, kind, 2, 2)

	fetched := time.Now().Add(-time.Second).Truncate(time.Millisecond)
	job := running(t, pool, kind, `{}`, "w2", 1, fetched)
	require.NoError(t, waiter.PublishWaiting(ctx, kind, []int64{job.ID}, nil))
	st, err := holder.LeaseState(ctx, kind, 50*time.Millisecond)
	require.NoError(t, err)
	require.WithinDuration(t, fetched, st.OldestOther, time.Millisecond, "the holder does not see the job waiting in w2")

	require.NoError(t, waiter.PublishWaiting(ctx, kind, nil, nil))
	st, err = holder.LeaseState(ctx, kind, 50*time.Millisecond)
	require.NoError(t, err)
	require.True(t, st.OldestOther.IsZero(), "jobs no longer waiting still published")
	require.Equal(t, 0, count(t, pool, `SELECT count(*) FROM concurrency_leases WHERE worker_id = 'w1' AND slots <> 2`))
}

// TestRepartitionTakesBackGrants: a grant not claimed yet was given in the
// order of the lines it was given in; when the kind's partition changes
// it goes back, and the room goes to the front of the new line: here an
// older job that waited in its key's line while a younger job of another
// key was granted its start.
func TestRepartitionTakesBackGrants(t *testing.T) {
	t.Parallel()
	const kind = "test.repartition"
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, "partition_fields = '{tenant}', rate_max = 1, rate_period = '10 seconds', rate_per_key = true")
	older := running(t, pool, kind, `{"tenant": "a"}`, "w1", 1, time.Now())
	exec(t, pool, `INSERT INTO concurrency_waiters (job_id, kind, key, worker_id, reason) VALUES ($1, $2, '"a"', 'w1', 'key_rate')`,
		older.ID, kind)
	younger := running(t, pool, kind, `{"tenant": "b"}`, "w1", 1, time.Now())
	exec(t, pool, `UPDATE river_job SET state = 'available' WHERE id = $1`, younger.ID)
	exec(t, pool, `INSERT INTO concurrency_starts (kind, key, job_id, started_at, reserved) VALUES ($1, '"b"', $2, now(), true)`,
		kind, younger.ID)

	setLimits(t, l, kind, "partition_fields = NULL, rate_per_key = false")
	require.Zero(t, count(t, pool, `SELECT count(*) FROM concurrency_starts WHERE job_id = $1`, younger.ID),
		"the younger job kept the grant of its old line")
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_waiters WHERE job_id = $1 AND worker_id IS NULL`, younger.ID),
		"the younger job does not wait in the line again")
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_starts WHERE job_id = $1`, older.ID),
		"the older job was not granted the start")
}

// TestAStartLoggedEarlierIsLoggedAgain: a job decided again that holds a
// start logged earlier in its attempt (a grant that crossed its wait was
// claimed then) runs, and its start is logged again: it counts in its
// rate window from about when the job begins, not from its grant.
func TestAStartLoggedEarlierIsLoggedAgain(t *testing.T) {
	t.Parallel()
	const kind = "test.restamp"
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, "rate_max = 2, rate_period = '10 seconds'")
	job := running(t, pool, kind, `{}`, "w1", 1, time.Now().Add(-time.Second))
	exec(t, pool, `UPDATE river_job SET attempted_at = now() - interval '1 second' WHERE id = $1`, job.ID)
	exec(t, pool, `INSERT INTO concurrency_starts (kind, job_id, started_at) VALUES ($1, $2, now() - interval '500 milliseconds')`,
		kind, job.ID)
	require.Equal(t, ledger.Run, decideOne(t, l, job, nil).Action)
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_starts WHERE job_id = $1`, job.ID), "a second start logged")
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_starts WHERE job_id = $1
		AND started_at > clock_timestamp() - interval '200 milliseconds'`, job.ID), "its start was not logged again")
}

// TestRecheckUnderALoweredLimit: jobs that took slots and have not begun
// when their kind's limit is lowered below the slots taken are decided
// again (Recheck): each gives its slot back and waits while the slots
// taken exceed the new limit (here the first to be decided again); once
// they fit, the others keep theirs.
func TestRecheckUnderALoweredLimit(t *testing.T) {
	t.Parallel()
	const kind = "test.lowered.recheck"
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, "max_concurrency = 3")
	var jobs []ledger.Job
	for range 3 {
		j := running(t, pool, kind, `{}`, "w1", 1, time.Now().Add(-time.Second))
		require.Equal(t, ledger.Slot, decideOne(t, l, j, nil).Action)
		jobs = append(jobs, j)
	}
	setLimits(t, l, kind, "max_concurrency = 2")
	n, _ := admitted(t, pool, kind)
	require.Equal(t, 3, n, "the slots taken stay counted")

	youngest := jobs[2]
	youngest.Recheck = true
	d := decideOne(t, l, youngest, nil)
	require.Equal(t, ledger.Wait, d.Action, "a job began on a slot beyond the lowered limit")
	require.Equal(t, ledger.ReasonLimit, d.Reason)
	n, _ = admitted(t, pool, kind)
	require.Equal(t, 2, n, "its slot did not go back")

	oldest := jobs[0]
	oldest.Recheck = true
	require.Equal(t, ledger.Slot, decideOne(t, l, oldest, nil).Action, "a job within the lowered limit lost its slot")
}

// TestRecheckUnderALoweredLimitKeepsTheOlderSlot: two jobs holding slots
// in one worker, not begun, decided again together after their limit was
// lowered below the slots taken (per key from 3 to 1; per kind from 2 to
// 1): the younger gives its slot back and the older keeps its own, as a
// lowering takes back the newest grants first (torture seed 601894557:
// the older, decided first, gave its slot back while the younger still
// counted, and the younger began).
func TestRecheckUnderALoweredLimitKeepsTheOlderSlot(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, before, after string }{
		{"per key", "partition_fields = '{key}', key_max = 3", "key_max = 1"},
		{"per kind", "max_concurrency = 2", "max_concurrency = 1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			kind := "test.lowered.older." + strings.ReplaceAll(c.name, " ", "")
			pool, l := newLedger(t, "w1")
			setLimits(t, l, kind, c.before)
			older := running(t, pool, kind, `{"key": "k"}`, "w1", 1, time.Now().Add(-time.Second))
			younger := running(t, pool, kind, `{"key": "k"}`, "w1", 1, time.Now().Add(-time.Second))
			require.Equal(t, ledger.Slot, decideOne(t, l, older, nil).Action)
			require.Equal(t, ledger.Slot, decideOne(t, l, younger, nil).Action)
			setLimits(t, l, kind, c.after)

			older.Recheck, younger.Recheck = true, true
			d, err := l.Decide(context.Background(), []ledger.Job{older, younger}, nil, time.Second, nil)
			require.NoError(t, err)
			require.Len(t, d.Decisions, 2)
			got := map[int64]ledger.Action{}
			for _, x := range d.Decisions {
				got[x.Job] = x.Action
			}
			require.Equal(t, ledger.Slot, got[older.ID], "the older job lost its slot to the younger one")
			require.NotEqual(t, ledger.Slot, got[younger.ID], "the younger job kept a slot beyond the lowered limit")
			require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE kind = $1`, kind), "slots left")
		})
	}
}

// TestLookaheadCountsAKeysJobsAheadAlready: under a per-key limit of 1,
// key k1's slot is taken, a younger job of k1 was resumed ahead already,
// and an older one parked since. When a slot of another key turns over,
// the lookahead resumes no more of k1: the job ahead already uses its
// budget, though it stands behind the parked one in the line.
func TestLookaheadCountsAKeysJobsAheadAlready(t *testing.T) {
	t.Parallel()
	pool, parked := lookaheadBehindParked(t, "test.lookaheadkey", 1)
	require.Zero(t, count(t, pool, `SELECT count(*) FROM river_job WHERE id = ANY($1) AND state <> 'pending'`, parked),
		"k1 had a job ahead already: the lookahead resumed another")
}

// TestLookaheadCountsAKeysJobsAheadPastItsFront: a round reads a key's
// line only as deep as twice its limit and 8 (key_max 1: 10 jobs), and a
// job of the key resumed ahead already still takes the key's lookahead
// when it stands past that depth (12 parked jobs older than it): no
// parked job is resumed beside it, and the key's line, read in part,
// still waits.
func TestLookaheadCountsAKeysJobsAheadPastItsFront(t *testing.T) {
	t.Parallel()
	const kind = "test.lookaheaddeep"
	pool, parked := lookaheadBehindParked(t, kind, 12)
	require.Zero(t, count(t, pool, `SELECT count(*) FROM river_job WHERE id = ANY($1) AND state <> 'pending'`, parked),
		"k1 had a job ahead already, past the front the round read: the lookahead resumed another")
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_key_lines
		WHERE kind = $1 AND key = sluice_partition_key('{"key": "k1"}', '{key}') AND waiting`, kind),
		"k1's line was read in part: its jobs still wait")
}

// lookaheadBehindParked sets up kind under a per-kind limit of 3 and a
// per-key limit of 1 with the slots of keys k0 and k1 taken, n jobs of k1
// parked (returned) and a younger one of k1 resumed ahead already, and
// releases k0's slot: the grant round's lookahead runs.
func lookaheadBehindParked(t *testing.T, kind string, n int) (*pgxpool.Pool, []int64) {
	t.Helper()
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, "max_concurrency = 3, partition_fields = '{key}', key_max = 1")
	h0 := running(t, pool, kind, `{"key": "k0"}`, "w1", 1, time.Now())
	h1 := running(t, pool, kind, `{"key": "k1"}`, "w1", 1, time.Now())
	require.Equal(t, ledger.Slot, decideOne(t, l, h0, nil).Action)
	require.Equal(t, ledger.Slot, decideOne(t, l, h1, nil).Action)
	var parked []int64
	for range n {
		id := queued(t, pool, kind, `{"key": "k1"}`, "pending")
		exec(t, pool, `INSERT INTO concurrency_parked_jobs (job_id, kind, key, reason, worker_id)
			VALUES ($1, $2, sluice_partition_key('{"key": "k1"}', '{key}'), 'key_limit', 'w1')`, id, kind)
		parked = append(parked, id)
	}
	ahead := queued(t, pool, kind, `{"key": "k1"}`, "available")
	exec(t, pool, `INSERT INTO concurrency_waiters (job_id, kind, key, worker_id, reason, ahead)
		VALUES ($1, $2, sluice_partition_key('{"key": "k1"}', '{key}'), NULL, 'key_limit', true)`, ahead, kind)
	exec(t, pool, `UPDATE concurrency_key_lines SET waiting = true WHERE kind = $1 AND key = sluice_partition_key('{"key": "k1"}', '{key}')`, kind)

	_, err := l.Release(context.Background(), ledger.Release{Ended: []ledger.Held{{ID: h0.ID, Kind: kind, Key: `"k0"`}}}, nil)
	require.NoError(t, err)
	return pool, parked
}

// TestARepartitionKeysTheStartsLogged: under a rate of 3 a minute over the
// kind, two jobs of key a start; the rate becomes 2 a minute per key. The
// starts logged before count in key a's window: a third job of a waits (or
// parks), while one of key b starts.
func TestARepartitionKeysTheStartsLogged(t *testing.T) {
	t.Parallel()
	const kind = "test.repartitionstarts"
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, "rate_max = 3, rate_period = interval '1 minute'")
	for range 2 {
		j := running(t, pool, kind, `{"key": "a"}`, "w1", 1, time.Now())
		require.Equal(t, ledger.Run, decideOne(t, l, j, nil).Action)
	}
	setLimits(t, l, kind, "partition_fields = '{key}', rate_max = 2, rate_per_key = true")
	third := running(t, pool, kind, `{"key": "a"}`, "w1", 1, time.Now())
	require.NotEqual(t, ledger.Run, decideOne(t, l, third, nil).Action, "key a started a third job in a window of 2")
	other := running(t, pool, kind, `{"key": "b"}`, "w1", 1, time.Now())
	require.Equal(t, ledger.Run, decideOne(t, l, other, nil).Action, "key b's window is empty")
}

// TestALoweredRateTakesBackGrants: a rate lowered, or made kind-wide,
// while starts are reserved for resumed jobs (granted under the old rate,
// not claimed yet) takes back the newest of them beyond the new rate's
// room, the starts logged in its window counted (with the slots reserved
// for them): their jobs wait in the line again, and the kind's counts
// follow its rows. Seed 914198574: a per-key rate of 5/2s became 2/1s for
// the kind while four keys each had a start reserved; all four started
// within 40 ms.
func TestALoweredRateTakesBackGrants(t *testing.T) {
	t.Parallel()
	const kind = "test.loweredrate"
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, "max_concurrency = 4, partition_fields = '{tenant}', key_max = 1, rate_max = 5, rate_period = '2 seconds', rate_per_key = true")
	var granted []int64
	for _, tenant := range []string{"a", "b", "c", "d"} {
		id := queued(t, pool, kind, `{"tenant": "`+tenant+`"}`, "available")
		exec(t, pool, `INSERT INTO concurrency_executions (job_id, kind, reserved, key) VALUES ($1, $2, true, $3)`, id, kind, `"`+tenant+`"`)
		exec(t, pool, `INSERT INTO concurrency_starts (kind, key, job_id, started_at, reserved) VALUES ($1, $2, $3, now(), true)`,
			kind, `"`+tenant+`"`, id)
		granted = append(granted, id)
	}

	setLimits(t, l, kind, "rate_max = 2, rate_period = '1 second', rate_per_key = false")
	require.Equal(t, 2, count(t, pool, `SELECT count(*) FROM concurrency_starts WHERE kind = $1`, kind),
		"the starts reserved beyond the new rate were not taken back")
	for i, id := range granted {
		kept := count(t, pool, `SELECT count(*) FROM concurrency_starts WHERE job_id = $1 AND reserved`, id)
		slot := count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = $1 AND reserved`, id)
		waits := count(t, pool, `SELECT count(*) FROM concurrency_waiters WHERE job_id = $1 AND worker_id IS NULL`, id)
		if i < 2 {
			require.Equal(t, []int{1, 1, 0}, []int{kept, slot, waits}, "job %d (the oldest two keep their grants)", id)
		} else {
			require.Equal(t, []int{0, 0, 1}, []int{kept, slot, waits}, "job %d (the newest two wait in the line again)", id)
		}
	}
	count0, rows := admitted(t, pool, kind)
	require.Equal(t, rows, count0, "the kind's count follows its slot rows")
	require.Equal(t, 2, rows)

	// Per key: a start logged in the window counts.
	const keyed = "test.loweredrate.key"
	setLimits(t, l, keyed, "partition_fields = '{tenant}', rate_max = 3, rate_period = '10 seconds', rate_per_key = true")
	started := running(t, pool, keyed, `{"tenant": "a"}`, "w1", 1, time.Now()).ID
	exec(t, pool, `INSERT INTO concurrency_starts (kind, key, job_id, started_at, reserved) VALUES ($1, '"a"', $2, now(), false)`,
		keyed, started)
	a := queued(t, pool, keyed, `{"tenant": "a"}`, "available")
	b := queued(t, pool, keyed, `{"tenant": "b"}`, "available")
	for _, j := range []struct {
		id  int64
		key string
	}{{a, `"a"`}, {b, `"b"`}} {
		exec(t, pool, `INSERT INTO concurrency_starts (kind, key, job_id, started_at, reserved) VALUES ($1, $2, $3, now(), true)`,
			keyed, j.key, j.id)
	}
	setLimits(t, l, keyed, "rate_max = 1")
	require.Zero(t, count(t, pool, `SELECT count(*) FROM concurrency_starts WHERE job_id = $1`, a),
		"key a's window holds a start already: its reserved one was not taken back")
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_waiters WHERE job_id = $1 AND key = '"a"'`, a))
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_starts WHERE job_id = $1 AND reserved`, b),
		"key b's reserved start, within its new rate, was taken back")
}

// TestAKeyCompletingItsParkingIsOwedItsTurn: under a per-kind limit of 1
// over keys, key B's only job is completing its parking (running, marked,
// recorded: River's completer has not written it yet) and key A has a job
// parked. When A had a turn since B began waiting, the free slot is B's:
// reserved for its job, which is marked, and River's completion then
// parks it and resumes it at once (available, its parking record gone,
// the slot still reserved for it, due since its insert as any job a grant
// resumes). When A had no turn since, A's job gets
// the slot, and B's waits for its parking. A grant taken back before the
// completion (a circuit breaker) leaves the job parked, not waiting; a
// job cancelled before it gives the slot back as it is cancelled, unless a
// ledger transaction holds the kind's lock: River's completion never waits
// for it, and the safety net frees the slot.
func TestAKeyCompletingItsParkingIsOwedItsTurn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, c := range []struct {
		name     string
		aServed  string // when A last had a turn, as SQL
		revoke   bool
		toB      bool
		endState string
		locked   bool // a ledger transaction holds the kind's lock as the completion lands
	}{
		{"A served since", "now() - interval '100 milliseconds'", false, true, "available", false},
		{"A served before B came", "now() - interval '2 seconds'", false, false, "pending", false},
		{"grant taken back", "now() - interval '100 milliseconds'", true, true, "pending", false},
		{"cancelled", "now() - interval '100 milliseconds'", false, true, "cancelled", false},
		{"cancelled under the kind's lock", "now() - interval '100 milliseconds'", false, true, "cancelled", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			const kind = "test.owed"
			pool, l := newLedger(t, "w1")
			setLimits(t, l, kind, "max_concurrency = 1, partition_fields = '{key}', key_max = 2")
			exec(t, pool, `
				INSERT INTO river_job (id, args, kind, max_attempts, state, queue, priority, attempt, attempted_at, attempted_by, metadata,
				                       created_at, scheduled_at)
				VALUES (1, '{"key": "A"}', $1, 5, 'pending', 'default', 1, 0, NULL, '{}', '{}', now(), now()),
				       (2, '{"key": "B"}', $1, 5, 'running', 'default', 1, 1, now(), '{w1}', '{"sluice_park": true}',
				        now() - interval '10 seconds', now() - interval '1 second')`, kind)
			parkAllForTheKind(t, pool, kind)
			exec(t, pool, `INSERT INTO concurrency_key_lines (kind, key, slots, waiting, served_at, arrived_at)
				VALUES ($1, sluice_partition_key('{"key": "A"}', '{key}'), 0, true, `+c.aServed+`, now() - interval '3 seconds'),
				       ($1, sluice_partition_key('{"key": "B"}', '{key}'), 0, true, NULL, now() - interval '1 second')`, kind)
			state := func(id int) (s string, marked bool) {
				require.NoError(t, pool.QueryRow(ctx, `SELECT state::text, metadata ? 'sluice_park' FROM river_job WHERE id = $1`, id).Scan(&s, &marked))
				return s, marked
			}
			_, err := l.Release(ctx, ledger.Release{Rounds: []string{kind}}, nil)
			require.NoError(t, err)
			reserved := count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = 2 AND reserved`)
			if !c.toB {
				s, _ := state(1)
				require.Equal(t, "available", s, "A had no turn since B began waiting: A's job gets the slot")
				require.Zero(t, reserved)
			} else {
				s, _ := state(1)
				require.Equal(t, "pending", s, "A had a turn since B began waiting: no second one ahead of B")
				require.Equal(t, 1, reserved, "B's job, completing its parking, has the slot")
				require.Equal(t, "granted", func() string {
					var m string
					require.NoError(t, pool.QueryRow(ctx, `SELECT metadata->>'sluice_park' FROM river_job WHERE id = 2`).Scan(&m))
					return m
				}())
			}
			if c.revoke {
				// A circuit breaker takes the grant back: the job stays parked,
				// not a job of the line on its way.
				setLimits(t, l, kind, "max_concurrency = -1")
				require.Zero(t, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = 2`))
				require.Zero(t, count(t, pool, `SELECT count(*) FROM concurrency_waiters WHERE job_id = 2`))
			}
			if c.endState == "cancelled" {
				exec(t, pool, `UPDATE river_job SET metadata = metadata || '{"cancel_attempted_at": "2026-01-01T00:00:00Z"}' WHERE id = 2`)
			}
			if c.locked {
				holder, err := pool.Begin(ctx)
				require.NoError(t, err)
				defer func() { _ = holder.Rollback(ctx) }()
				_, err = holder.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('sluice.limit_row:' || $1::text, 0))`, kind)
				require.NoError(t, err)
			}
			// River's completion of job 2 lands (never waiting for the
			// kind's lock).
			done, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			_, err = pool.Exec(done, `UPDATE river_job SET state = 'completed', finalized_at = now() WHERE id = 2`)
			require.NoError(t, err)
			s, marked := state(2)
			require.Equal(t, c.endState, s)
			if c.locked {
				require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = 2`),
					"the kind's lock is held: the slot is left for the safety net")
				return
			}
			if c.endState == "cancelled" {
				// Its reserved slot went back with the cancel, counts and all.
				require.Zero(t, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = 2`))
				require.Zero(t, count(t, pool, `SELECT COALESCE(sum(slots), 0) FROM concurrency_key_lines WHERE kind = $1`, kind))
				n, rows := admitted(t, pool, kind)
				require.Zero(t, n)
				require.Zero(t, rows)
				return
			}
			require.False(t, marked, "the mark goes with the completion")
			require.Equal(t, map[bool]int{true: 0, false: 1}[c.endState == "available"],
				count(t, pool, `SELECT count(*) FROM concurrency_parked_jobs WHERE job_id = 2`), "a job resumed leaves the parked jobs")
			var attempt int
			var due bool
			require.NoError(t, pool.QueryRow(ctx, `SELECT attempt, scheduled_at = created_at FROM river_job WHERE id = 2`).Scan(&attempt, &due))
			require.Zero(t, attempt, "parking is not an attempt")
			// Scheduled after its insert (a retry, say): resumed by its grant,
			// it is due since its insert, in its line's order for River's
			// fetch, as a parked job a grant resumes is; parked, it keeps its
			// own.
			require.Equal(t, c.endState == "available", due, "job 2 (%s) due since its insert", c.endState)
		})
	}
}

// TestAnOwedTurnOutlastsTheRoundsFirstTurn: under a per-kind limit of 2
// over keys, key A (never served: first in the round's order) has two
// jobs parked, and key B, served before, has its only job completing its
// parking. The round's first turn gives A's first job a slot (A had no
// turn since B began waiting); its second turn would give A another, and
// B is owed its turn before that: B's job gets the slot, reserved, and A's
// second job stays parked (seed 120235358: a key held back behind its
// parkings saw other keys served twice).
func TestAnOwedTurnOutlastsTheRoundsFirstTurn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.owed2"
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, "max_concurrency = 2, partition_fields = '{key}', key_max = 2")
	exec(t, pool, `
		INSERT INTO river_job (id, args, kind, max_attempts, state, queue, priority, attempt, attempted_at, attempted_by, metadata)
		VALUES (1, '{"key": "A"}', $1, 5, 'pending', 'default', 1, 0, NULL, '{}', '{}'),
		       (2, '{"key": "B"}', $1, 5, 'running', 'default', 1, 1, now(), '{w1}', '{"sluice_park": true}'),
		       (3, '{"key": "A"}', $1, 5, 'pending', 'default', 1, 0, NULL, '{}', '{}')`, kind)
	parkAllForTheKind(t, pool, kind)
	exec(t, pool, `INSERT INTO concurrency_key_lines (kind, key, slots, waiting, served_at, arrived_at)
		VALUES ($1, sluice_partition_key('{"key": "A"}', '{key}'), 0, true, NULL, now() - interval '3 seconds'),
		       ($1, sluice_partition_key('{"key": "B"}', '{key}'), 0, true, now() - interval '2 seconds', now() - interval '4 seconds')`, kind)
	_, err := l.Release(ctx, ledger.Release{Rounds: []string{kind}}, nil)
	require.NoError(t, err)
	state := func(id int) string {
		var s string
		require.NoError(t, pool.QueryRow(ctx, `SELECT state::text FROM river_job WHERE id = $1`, id).Scan(&s))
		return s
	}
	require.Equal(t, "available", state(1), "A's first turn")
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = 2 AND reserved`),
		"B's job, completing its parking, has the second slot")
	require.Equal(t, "pending", state(3), "A has no second turn ahead of B's")
}

// TestAKeyArrivedAfterAnOwedOneWaits: under a per-kind limit of 1 over
// keys, key B's only job is completing its parking, B never served; key A
// arrives after B began waiting (never served either, as far as the
// ledger knows: a key whose line emptied loses its row and when it was
// served) with a job parked. The free slot is B's, reserved for its job:
// A's job waits (seed 120235358: keys that had been served as B's job
// waited came back with new rows and took their second turns ahead of it).
// A key that arrived before B began waiting takes the slot.
func TestAKeyArrivedAfterAnOwedOneWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, c := range []struct {
		name     string
		aArrived string
		toB      bool
	}{
		{"A arrived after B", "now() - interval '1 second'", true},
		{"A arrived before B", "now() - interval '3 seconds'", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			const kind = "test.owed3"
			pool, l := newLedger(t, "w1")
			setLimits(t, l, kind, "max_concurrency = 1, partition_fields = '{key}', key_max = 2")
			exec(t, pool, `
				INSERT INTO river_job (id, args, kind, max_attempts, state, queue, priority, attempt, attempted_at, attempted_by, metadata)
				VALUES (1, '{"key": "B"}', $1, 5, 'running', 'default', 1, 1, now(), '{w1}', '{"sluice_park": true}'),
				       (2, '{"key": "A"}', $1, 5, 'pending', 'default', 1, 0, NULL, '{}', '{}')`, kind)
			parkAllForTheKind(t, pool, kind)
			exec(t, pool, `INSERT INTO concurrency_key_lines (kind, key, slots, waiting, served_at, arrived_at)
				VALUES ($1, sluice_partition_key('{"key": "B"}', '{key}'), 0, true, NULL, now() - interval '2 seconds'),
				       ($1, sluice_partition_key('{"key": "A"}', '{key}'), 0, true, NULL, `+c.aArrived+`)`, kind)
			_, err := l.Release(ctx, ledger.Release{Rounds: []string{kind}}, nil)
			require.NoError(t, err)
			var a string
			require.NoError(t, pool.QueryRow(ctx, `SELECT state::text FROM river_job WHERE id = 2`).Scan(&a))
			reserved := count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = 1 AND reserved`)
			if c.toB {
				require.Equal(t, "pending", a, "A came after B began waiting: no turn ahead of B's")
				require.Equal(t, 1, reserved, "B's job, completing its parking, has the slot")
			} else {
				require.Equal(t, "available", a, "A was waiting before B: its turn comes first")
				require.Zero(t, reserved)
			}
		})
	}
}

// TestARateSetEndsTheWaitsAhead: a job resumed ahead of a free slot
// waits for one as long as it takes (its slot turns over). A change that
// sets a rate on its kind ends that (seed 16190584: jobs resumed ahead,
// then held by a rate of 2 in 2 s, took every River slot of both workers
// for seconds, and a job of another kind granted a slot was not fetched):
// decided again, it waits as any job does, and its worker's look at the
// ledger (GrantedTo) sees it is ahead no more. A job that came ahead under
// a rate already (its grant taken by an older job of its line) stays
// ahead: it waits on in the line.
func TestARateSetEndsTheWaitsAhead(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, before, after string
		ahead               bool
	}{
		{"no change", "max_concurrency = 1", "max_concurrency = 1", true},
		{"a rate set", "max_concurrency = 1", "rate_max = 5, rate_period = '1 minute'", false},
		{"a per-key rate set", "max_concurrency = 1",
			"partition_fields = '{key}', rate_max = 5, rate_period = '1 minute', rate_per_key = true", false},
		{"a rate before", "max_concurrency = 1, rate_max = 5, rate_period = '1 minute'", "rate_max = 4", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			kind := "test.aheadrate." + strings.ReplaceAll(tc.name, " ", "")
			pool, l := newLedger(t, "w1")
			setLimits(t, l, kind, tc.before)
			holder := running(t, pool, kind, `{"key": "a"}`, "w1", 1, time.Now())
			require.Equal(t, ledger.Slot, decideOne(t, l, holder, nil).Action)
			ahead := running(t, pool, kind, `{"key": "a"}`, "w1", 1, time.Now())
			exec(t, pool, `INSERT INTO concurrency_waiters (job_id, kind, key, worker_id, reason, ahead)
				VALUES ($1, $2, NULL, 'w1', 'limit', true)`, ahead.ID, kind)
			setLimits(t, l, kind, tc.after)
			grants, err := l.GrantedTo(context.Background(), []int64{ahead.ID})
			require.NoError(t, err)
			require.Len(t, grants, 1)
			require.Equal(t, tc.ahead, grants[0].Ahead, "the worker's look: still ahead")
			d := decideOne(t, l, ahead, nil)
			require.Equal(t, tc.ahead, d.Ahead, "decided again, it waits without a deadline")
			if tc.ahead {
				require.Equal(t, ledger.Wait, d.Action)
			}
		})
	}
}

// TestALongLineParksOnlyTheJobsBehindIt: under a per-key limit of 1, a
// job fetched behind as many jobs of its key waiting in the workers as
// the wait cap (8) parks at once (LongLine); a job older than all of them
// (back from a retry as the line grew) does not: it waits at the front,
// where it takes the slot of a younger job of its key granted one
// meanwhile in its worker (seed 375253967: it parked, and the younger job
// started 2 ms later).
func TestALongLineParksOnlyTheJobsBehindIt(t *testing.T) {
	t.Parallel()
	const kind = "test.longline.older"
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, "max_concurrency = 0, partition_fields = '{key}', key_max = 1")
	older := running(t, pool, kind, `{"key": "a"}`, "w1", 2, time.Now())
	keyLineOf(t, pool, l, kind, 8)
	behind := running(t, pool, kind, `{"key": "a"}`, "w1", 1, time.Now())
	behind.Dispatched = false // decided at its fetch
	d := decideOne(t, l, behind, nil)
	require.Equal(t, ledger.Parked, d.Action, "a job behind a long line waited")
	require.True(t, d.LongLine)

	older.Dispatched = false
	d = decideOne(t, l, older, nil)
	require.Equal(t, ledger.Wait, d.Action, "a job older than its whole line parked for the line's length")
	require.False(t, d.LongLine)
}

// TestALongLineIsMeasuredAgainstTheWorkersRiverSlots: a line is long at
// four times the slots its jobs wait for (8 at least), or at an eighth of
// the River slots of the worker that fetches the job, whichever is more:
// under a per-key limit of 1 with 8 jobs of the key waiting, a job fetched
// by a worker of 64 River slots parks at once (and stays in the line),
// one fetched by a worker of 100 waits, until 12 are in the line.
func TestALongLineIsMeasuredAgainstTheWorkersRiverSlots(t *testing.T) {
	t.Parallel()
	const kind = "test.longline.slots"
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, "max_concurrency = 0, partition_fields = '{key}', key_max = 1")
	keyLineOf(t, pool, l, kind, 8)
	fetched := func(slots int) ledger.Decision {
		j := running(t, pool, kind, `{"key": "a"}`, "w1", 1, time.Now())
		j.Dispatched, j.Slots = false, slots
		return decideOne(t, l, j, nil)
	}
	d := fetched(64)
	require.Equal(t, ledger.Parked, d.Action, "a job behind 8 waiting, fetched by a worker of 64 River slots, waited")
	require.True(t, d.LongLine)
	for i := range 3 {
		d = fetched(100)
		require.Equal(t, ledger.Wait, d.Action, "job %d behind %d in the line, fetched by a worker of 100 River slots, parked", i, 9+i)
	}
	d = fetched(100)
	require.Equal(t, ledger.Parked, d.Action, "a job behind 12 in the line, fetched by a worker of 100 River slots, waited")
	require.True(t, d.LongLine)

	for _, tc := range []struct {
		keyMax int32
		slots  int
		want   int
	}{{1, 0, 8}, {1, 64, 8}, {1, 100, 12}, {1, 1000, 125}, {1, 10000, 256}, {4, 0, 16}, {4, 64, 16}, {4, 200, 25}} {
		lim := ledger.Limits{Kind: kind, Present: true, Fields: []string{"key"}, KeyMax: tc.keyMax}
		require.Equal(t, tc.want, lim.WaitCap(tc.slots), "wait cap of a per-key limit of %d with %d River slots", tc.keyMax, tc.slots)
	}
}

// keyLineOf decides, in worker w1, a job of kind's key "a" that takes the
// key's one slot and n more that wait in its line behind it.
func keyLineOf(t *testing.T, pool *pgxpool.Pool, l *ledger.Ledger, kind string, n int) {
	t.Helper()
	holder := running(t, pool, kind, `{"key": "a"}`, "w1", 1, time.Now())
	require.Equal(t, ledger.Slot, decideOne(t, l, holder, nil).Action)
	for i := range n {
		j := running(t, pool, kind, `{"key": "a"}`, "w1", 1, time.Now())
		require.Equal(t, ledger.Wait, decideOne(t, l, j, nil).Action, "waiting job %d", i)
	}
}

// TestAJobAheadStepsBackBehindAnOlderOneOnItsWay: under a per-key limit
// of 1, key k1's slot is reserved for its older job, granted and not
// fetched yet (available: on its way), and a younger job of k1 resumed
// ahead is fetched first. The younger steps back (its worker's River slot
// is for the older one) rather than wait in the line; with no job of its
// key on its way (the older one fetched: running) it waits ahead.
func TestAJobAheadStepsBackBehindAnOlderOneOnItsWay(t *testing.T) {
	t.Parallel()
	const kind = "test.stepback"
	pool, l, older := olderOnItsWay(t, kind, 1)
	ahead := running(t, pool, kind, `{"key": "k1"}`, "w1", 1, time.Now())
	exec(t, pool, `INSERT INTO concurrency_waiters (job_id, kind, key, worker_id, reason, ahead)
		VALUES ($1, $2, sluice_partition_key('{"key": "k1"}', '{key}'), NULL, 'key_limit', true)`, ahead.ID, kind)

	require.Equal(t, ledger.StepBack, decideOne(t, l, ahead, nil).Action,
		"the older job of its key is on its way to the reserved slot: the younger steps back")

	exec(t, pool, `UPDATE river_job SET state = 'running', attempt = 1, attempted_at = now(), attempted_by = ARRAY['w2'] WHERE id = $1`, older)
	d := decideOne(t, l, ahead, nil)
	require.Equal(t, ledger.Wait, d.Action, "the older job was fetched: the younger waits ahead")
	require.True(t, d.Ahead)
}

// TestAJobWaitsBehindAnOlderOneOnItsWay: under a per-key limit of 2, key
// k1's older job was granted a slot (reserved, not fetched yet) and the
// key has room for one more; a younger job of k1, fetched first, does not
// start past the older one on its way: it waits in the line.
func TestAJobWaitsBehindAnOlderOneOnItsWay(t *testing.T) {
	t.Parallel()
	const kind = "test.behindtransit"
	pool, l, _ := olderOnItsWay(t, kind, 2)
	younger := running(t, pool, kind, `{"key": "k1"}`, "w1", 1, time.Now())

	d := decideOne(t, l, younger, nil)
	require.Equal(t, ledger.Wait, d.Action, "an older job of its key is on its way to its slot: the younger waits")
	require.Equal(t, ledger.ReasonKeyFIFO, d.Reason)
}

// olderOnItsWay sets up kind under a per-key limit of keyMax with one job
// of key k1 granted a slot and not fetched yet (available, its slot
// reserved: on its way), and returns it.
func olderOnItsWay(t *testing.T, kind string, keyMax int) (*pgxpool.Pool, *ledger.Ledger, int64) {
	t.Helper()
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, fmt.Sprintf("partition_fields = '{key}', key_max = %d", keyMax))
	older := queued(t, pool, kind, `{"key": "k1"}`, "available")
	exec(t, pool, `INSERT INTO concurrency_executions (job_id, kind, key, worker_id, reserved)
		VALUES ($1, $2, sluice_partition_key('{"key": "k1"}', '{key}'), NULL, true)`, older, kind)
	exec(t, pool, `INSERT INTO concurrency_key_lines (kind, key, slots)
		VALUES ($1, sluice_partition_key('{"key": "k1"}', '{key}'), 1)`, kind)
	return pool, l, older
}

// TestReapParksAPublishedJobUnderItsKey: a dead worker's job that its
// lease keeper published as waiting (for a leased slot, or for its
// decision) is parked by the reap under its key by the kind's partition
// now, when the kind was partitioned since: parked with no key, its key's
// line would not hold it, and younger jobs of the key were let go first
// (torture seed 682034841).
func TestReapParksAPublishedJobUnderItsKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.reap.published"
	pool, live := newLedger(t, "w1")
	dead := ledger.New(ledger.Config{Pool: pool, WorkerID: "w2"})
	setLimits(t, live, kind, "max_concurrency = 2")
	job := running(t, pool, kind, `{"key": "a"}`, "w2", 1, time.Now())
	require.NoError(t, dead.PublishWaiting(ctx, kind, []int64{job.ID}, nil))
	setLimits(t, live, kind, "partition_fields = '{key}', key_max = 1")

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	r, err := live.Reap(ctx, tx, "w2", []string{kind})
	require.NoError(t, err)
	require.NotNil(t, r)
	var key *string
	require.NoError(t, tx.QueryRow(ctx, `SELECT key FROM concurrency_parked_jobs WHERE job_id = $1`, job.ID).Scan(&key))
	require.NotNil(t, key, "parked with no key")
	require.Equal(t, `"a"`, *key)
}

// TestAJobAheadStepsBackForAnotherKeysGrant (seed 124141674): under a
// kind-wide limit with keys, a job resumed ahead of a free slot and
// fetched steps back when every slot of the kind is taken and one was
// granted to a job of another key (its key's turn) that waits to be
// fetched: its worker's River slot is for that one, and it moves just
// past the granted job in River's fetch order. Without it, jobs resumed
// ahead filled both workers' River slots for a second, while the kind's
// slots were all reserved for jobs River could not fetch. Not when the
// granted job was fetched, when the kind has room, nor under a per-key
// limit alone.
func TestAJobAheadStepsBackForAnotherKeysGrant(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, limits string
		grantState   string
		dispatched   bool
		back         bool
	}{
		{"the kind full", "max_concurrency = 1, admitted = 1", "available", false, true},
		{"the kind full, dispatched", "max_concurrency = 1, admitted = 1", "available", true, true},
		{"the grant fetched", "max_concurrency = 1, admitted = 1", "running", false, false},
		{"the kind with room", "max_concurrency = 2, admitted = 1", "available", false, false},
		{"a per-key limit alone", "max_concurrency = 0", "available", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			kind := "test.aheadkind." + strings.ReplaceAll(tc.name, " ", "")
			pool, l := newLedger(t, "w1")
			setLimits(t, l, kind, "max_concurrency = 1, partition_fields = '{key}', key_max = 2")
			ahead := running(t, pool, kind, `{"key": "a"}`, "w1", 1, time.Now())
			ahead.Dispatched = tc.dispatched
			exec(t, pool, `UPDATE river_job SET scheduled_at = now() - interval '1 hour' WHERE id = $1`, ahead.ID)
			exec(t, pool, `INSERT INTO concurrency_waiters (job_id, kind, key, worker_id, reason, ahead)
				VALUES ($1, $2, 'a', 'w1', 'limit', true)`, ahead.ID, kind)
			granted := queued(t, pool, kind, `{"key": "b"}`, tc.grantState)
			exec(t, pool, `UPDATE river_job SET scheduled_at = now() - interval '1 second' WHERE id = $1`, granted)
			exec(t, pool, `INSERT INTO concurrency_executions (job_id, kind, key, reserved) VALUES ($1, $2, 'b', true)`, granted, kind)
			exec(t, pool, `INSERT INTO concurrency_key_lines (kind, key, slots) VALUES ($1, 'b', 1)`, kind)
			exec(t, pool, `UPDATE concurrency_limits SET `+tc.limits+` WHERE kind = $1`, kind)

			grants, err := l.GrantedTo(context.Background(), []int64{ahead.ID})
			require.NoError(t, err)
			require.Len(t, grants, 1)
			require.Equal(t, tc.back, grants[0].Behind, "the worker's look: behind a grant on its way")
			d := decideOne(t, l, ahead, nil)
			if !tc.back {
				require.NotEqual(t, ledger.StepBack, d.Action)
				return
			}
			require.Equal(t, ledger.StepBack, d.Action)
			want := "available"
			if tc.dispatched {
				want = "running" // River's completion makes it available (sluice_park "ahead")
			}
			require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM river_job a, river_job g
				WHERE a.id = $1 AND g.id = $2 AND a.state = $3 AND a.scheduled_at > g.scheduled_at`, ahead.ID, granted, want),
				"the job stepped back %s, fetched after the granted one", want)
			require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_waiters
				WHERE job_id = $1 AND worker_id IS NULL AND ahead`, ahead.ID), "it keeps its place in the line")
		})
	}
}

// waitBehindAHolder sets kind up under a per-kind limit of 1 over keys (1
// per key): key a's holder takes the slot, and then key k's job and key
// c's job wait for it, in that order. It returns the pool, the ledger of
// w1, its guess of the limits and the three jobs.
func waitBehindAHolder(t *testing.T, kind string) (pool *pgxpool.Pool, l *ledger.Ledger, guess map[string]ledger.Limits,
	holder, k, c ledger.Job) {
	t.Helper()
	pool, l = newLedger(t, "w1")
	setLimits(t, l, kind, "max_concurrency = 1, partition_fields = '{key}', key_max = 1")
	guess = map[string]ledger.Limits{kind: {Kind: kind, Max: 1, KeyMax: 1, Fields: []string{"key"}}}
	holder = running(t, pool, kind, `{"key": "a"}`, "w1", 1, time.Now().Add(-time.Second))
	require.Equal(t, ledger.Slot, decideOne(t, l, holder, guess).Action)
	k = running(t, pool, kind, `{"key": "k"}`, "w1", 1, time.Now().Add(-900*time.Millisecond))
	require.Equal(t, ledger.Wait, decideOne(t, l, k, guess).Action, "the limit is full: it waits")
	c = running(t, pool, kind, `{"key": "c"}`, "w1", 1, time.Now().Add(-800*time.Millisecond))
	require.Equal(t, ledger.Wait, decideOne(t, l, c, guess).Action)
	return pool, l, guess, holder, k, c
}

// TestAGrantGivenBackForANewRateKeepsItsTurn: under a per-kind limit of 1
// over keys, key k's job is granted the slot that frees at k's turn, with
// key c's job waiting since before it. A rate per key is set before k's
// job begins: its grant holds no start, so its decision gives the slot
// back and decides it afresh. The window has room and so has the limit:
// it starts at once, on the turn its key was given, rather than wait
// behind c, which k was served before (torture seed 339187757: a job
// granted as its parking completed waited behind six other keys' turns).
// With the window full it waits, and its slot is c's.
func TestAGrantGivenBackForANewRateKeepsItsTurn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, full := range []bool{false, true} {
		t.Run(map[bool]string{false: "room", true: "window full"}[full], func(t *testing.T) {
			t.Parallel()
			const kind = "test.turn.kept"
			pool, l, guess, holder, k, _ := waitBehindAHolder(t, kind)

			g, err := l.Release(ctx, ledger.Release{Ended: []ledger.Held{{ID: holder.ID, Kind: kind, Key: `"a"`}}}, nil)
			require.NoError(t, err)
			require.Equal(t, []int64{k.ID}, g.LocalOrder, "k came first: the slot is its")

			setLimits(t, l, kind, "rate_max = 1, rate_period = interval '1 minute', rate_per_key = true")
			if full {
				other := running(t, pool, kind, `{"key": "k"}`, "w2", 1, time.Now())
				exec(t, pool, `INSERT INTO concurrency_starts (kind, key, job_id, started_at) VALUES ($1, '"k"', $2, now())`, kind, other.ID)
			}
			guess[kind] = ledger.Limits{Kind: kind, Max: 1, KeyMax: 1, Fields: []string{"key"}, RateMax: 1, RatePeriod: time.Minute, RatePerKey: true}
			k.Dispatched = false // its wait ended as its grant came
			d := decideOne(t, l, k, guess)
			if full {
				require.Contains(t, []ledger.Action{ledger.Wait, ledger.Parked}, d.Action, "its key's window is full")
				require.Equal(t, ledger.ReasonKeyRate, d.Reason)
				return
			}
			require.Equal(t, ledger.Slot, d.Action, "its grant went back for the rate, and the limits have room: it keeps its key's turn (reason %q)", d.Reason)
			require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_starts WHERE job_id = $1`, k.ID), "its start logged")
			n, rows := admitted(t, pool, kind)
			require.Equal(t, 1, rows)
			require.Equal(t, 1, n)
		})
	}
}

// TestAJobSteppingBackIsGrantedAtItsKeysTurn: under a per-kind limit of 1
// over keys, key k's job waits first, key c's after it. k's job, resumed
// ahead, is stepping back from its worker (marked, River's completion of
// it not written yet) when the slot frees: the round reserves the slot for
// it, at its key's turn, as for a parking still completing, and c waits
// on. Passed over, its key lost its turn to every other key for as long
// as River's completer took (torture seed 926243880: 240 ms, 15 starts of
// other keys where 14 are allowed).
func TestAJobSteppingBackIsGrantedAtItsKeysTurn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.stepping.back"
	pool, l, guess, holder, k, _ := waitBehindAHolder(t, kind)
	// k's job steps back, as LedgerStepBackDispatched leaves it.
	exec(t, pool, `UPDATE river_job SET metadata = metadata || '{"sluice_park": "ahead"}' WHERE id = $1`, k.ID)
	exec(t, pool, `UPDATE concurrency_waiters SET worker_id = NULL, ahead = true WHERE job_id = $1`, k.ID)

	g, err := l.Release(ctx, ledger.Release{Ended: []ledger.Held{{ID: holder.ID, Kind: kind, Key: `"a"`}}}, nil)
	require.NoError(t, err)
	require.Empty(t, g.LocalOrder, "the slot is k's: c waits on")
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = $1 AND reserved AND worker_id IS NULL`, k.ID),
		"a slot reserved for the job stepping back")
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_waiters WHERE job_id = $1`, k.ID), "it stays in the line until it is fetched")

	// River's completion makes it available; fetched again, it claims its slot.
	exec(t, pool, `UPDATE river_job SET state = 'available', metadata = metadata - 'sluice_park' WHERE id = $1`, k.ID)
	exec(t, pool, `UPDATE river_job SET state = 'running', attempted_at = now() WHERE id = $1`, k.ID)
	k.FetchedAt = time.Now()
	require.Equal(t, ledger.Slot, decideOne(t, l, k, guess).Action, "fetched again, it starts on the slot reserved for it")
	n, rows := admitted(t, pool, kind)
	require.Equal(t, 1, rows)
	require.Equal(t, 1, n)
}
