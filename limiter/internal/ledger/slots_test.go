package ledger_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/limiter/internal/ledger"
)

// TestReleaseFreesOnlyItsWorkersSlot: a job rescued and fetched by another
// worker holds its slot there; the late release of its first worker frees
// nothing, its new worker's release frees it, and the kind's count equals
// the slot rows throughout.
func TestReleaseFreesOnlyItsWorkersSlot(t *testing.T) {
	t.Parallel()
	const kind = "test.rescued"
	pool, a := newLedger(t, "a")
	b := ledger.New(ledger.Config{Pool: pool, WorkerID: "b"})
	setLimits(t, a, kind, "max_concurrency = 5")
	job := running(t, pool, kind, `{}`, "b", 2, time.Now())
	require.Equal(t, ledger.Slot, decideOne(t, b, job, nil).Action)
	n, rows := admitted(t, pool, kind)
	require.Equal(t, 1, rows)
	require.Equal(t, rows, n, "the count equals the rows")

	_, err := a.Release(context.Background(), ledger.Release{Ended: []ledger.Held{{ID: job.ID, Kind: kind}}}, nil)
	require.NoError(t, err)
	n, rows = admitted(t, pool, kind)
	require.Equal(t, 1, rows, "another worker's slot is not released")
	require.Equal(t, rows, n)

	_, err = b.Release(context.Background(), ledger.Release{Ended: []ledger.Held{{ID: job.ID, Kind: kind}}}, nil)
	require.NoError(t, err)
	n, rows = admitted(t, pool, kind)
	require.Zero(t, rows)
	require.Zero(t, n)
}

// TestHandOverMovesTheSlot: a slot handed over in memory moves the ended
// job's slot row to the job waiting in the same worker, which leaves the
// line, the count unchanged; a hand-over written by another worker moves
// nothing.
func TestHandOverMovesTheSlot(t *testing.T) {
	t.Parallel()
	const kind = "test.handover"
	pool, a := newLedger(t, "a")
	setLimits(t, a, kind, "max_concurrency = 1")
	first := running(t, pool, kind, `{}`, "a", 1, time.Now())
	second := running(t, pool, kind, `{}`, "a", 1, time.Now())
	require.Equal(t, ledger.Slot, decideOne(t, a, first, nil).Action)
	require.Equal(t, ledger.Wait, decideOne(t, a, second, nil).Action)

	b := ledger.New(ledger.Config{Pool: pool, WorkerID: "b"})
	_, err := b.Release(context.Background(), ledger.Release{Handed: []ledger.HandOver{{
		From: ledger.Held{ID: first.ID, Kind: kind}, To: ledger.Held{ID: second.ID, Kind: kind}}}}, nil)
	require.NoError(t, err)
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = $1`, first.ID),
		"another worker's hand-over moves nothing")

	_, err = a.Release(context.Background(), ledger.Release{Handed: []ledger.HandOver{{
		From: ledger.Held{ID: first.ID, Kind: kind}, To: ledger.Held{ID: second.ID, Kind: kind}}}}, nil)
	require.NoError(t, err)
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = $1 AND worker_id = 'a' AND NOT reserved`,
		second.ID), "the slot is the second job's")
	require.Zero(t, count(t, pool, `SELECT count(*) FROM concurrency_waiters`), "the job handed the slot left the line")
	n, rows := admitted(t, pool, kind)
	require.Equal(t, 1, rows)
	require.Equal(t, rows, n, "the count equals the rows")
}

// TestSwapGivesAHeldSlotToAnOlderJob: under a per-key limit of one, a
// younger job of a key holds the key's slot and has not started while an
// older one of the key waits in the same worker: the swap gives the older
// one the slot (and the start logged with it) and puts the younger one in
// the line in its place, the counts unchanged. A swap from a job that holds
// no slot of this worker's, or one of another key, or to one that holds
// one, moves nothing.
func TestSwapGivesAHeldSlotToAnOlderJob(t *testing.T) {
	t.Parallel()
	const kind = "test.swap"
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, "partition_fields = ARRAY['key'], key_max = 1, rate_max = 100, rate_period = interval '1 minute'")
	older := running(t, pool, kind, `{"key": "k"}`, "w1", 1, time.Now())
	younger := running(t, pool, kind, `{"key": "k"}`, "w1", 1, time.Now())
	require.Equal(t, ledger.Slot, decideOne(t, l, younger, nil).Action)
	d := decideOne(t, l, older, nil)
	require.Equal(t, ledger.Wait, d.Action, "the key's slot is the younger job's")

	other := ledger.New(ledger.Config{Pool: pool, WorkerID: "w2"})
	out, err := other.Swap(context.Background(), kind, younger.ID, older.ID, d.Reason)
	require.NoError(t, err)
	require.Equal(t, ledger.SwapNone, out, "another worker's slot does not move")

	// A worker whose copy of the limits has no partition yet takes every
	// job for one of one key: a slot of another key does not move.
	elsewhere := running(t, pool, kind, `{"key": "m"}`, "w1", 1, time.Now())
	require.Equal(t, ledger.Slot, decideOne(t, l, elsewhere, nil).Action)
	out, err = l.Swap(context.Background(), kind, elsewhere.ID, older.ID, d.Reason)
	require.NoError(t, err)
	require.Equal(t, ledger.SwapNone, out, "a slot of another key moved")
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = $1`, elsewhere.ID))

	out, err = l.Swap(context.Background(), kind, younger.ID, older.ID, d.Reason)
	require.NoError(t, err)
	require.Equal(t, ledger.SwapMoved, out)
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = $1 AND worker_id = 'w1'`, older.ID))
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_starts WHERE job_id = $1`, older.ID), "the start went with the slot")
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_waiters WHERE job_id = $1 AND worker_id = 'w1' AND reason = $2`,
		younger.ID, d.Reason), "the younger job waits in the line in this worker")
	require.Zero(t, count(t, pool, `SELECT count(*) FROM concurrency_waiters WHERE job_id = $1`, older.ID))
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE kind = $1 AND key IS NOT NULL AND job_id <> $2`,
		kind, elsewhere.ID), "one slot of the key")

	out, err = l.Swap(context.Background(), kind, younger.ID, older.ID, d.Reason)
	require.NoError(t, err)
	require.Equal(t, ledger.SwapNone, out, "a job with no slot has none to give")
}

// TestSwapGivesAHeldSlotBackToTheFront: when a job of the line older than
// the one deciding waits elsewhere (parked, or waiting in another worker),
// the younger job's held slot is not the deciding job's: the younger job
// gives it back (its slot row and its start go, the counts fall by one)
// and waits in the line, and a grant round gives the slot to the front.
func TestSwapGivesAHeldSlotBackToTheFront(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, elsewhere := range []string{"parked", "waiting in w2"} {
		t.Run(elsewhere, func(t *testing.T) {
			t.Parallel()
			const kind = "test.swapback"
			pool, l := newLedger(t, "w1")
			w2 := ledger.New(ledger.Config{Pool: pool, WorkerID: "w2"})
			setLimits(t, l, kind, "max_concurrency = 1, rate_max = 100, rate_period = interval '1 minute'")
			front := running(t, pool, kind, `{}`, "w2", 1, time.Now().Add(-time.Second))
			older := running(t, pool, kind, `{}`, "w1", 1, time.Now())
			younger := running(t, pool, kind, `{}`, "w1", 1, time.Now())
			require.Equal(t, ledger.Slot, decideOne(t, l, younger, nil).Action)
			if elsewhere == "parked" {
				exec(t, pool, `UPDATE river_job SET state = 'pending' WHERE id = $1`, front.ID)
				exec(t, pool, `INSERT INTO concurrency_parked_jobs (job_id, kind, reason, worker_id) VALUES ($1, $2, 'limit', 'w2')`,
					front.ID, kind)
				exec(t, pool, `UPDATE concurrency_limits SET has_parked = true WHERE kind = $1`, kind)
			} else {
				require.Equal(t, ledger.Wait, decideOne(t, w2, front, nil).Action, "the kind's slot is the younger job's")
			}
			d := decideOne(t, l, older, nil)
			require.Equal(t, ledger.Wait, d.Action)

			out, err := l.Swap(ctx, kind, younger.ID, older.ID, d.Reason)
			require.NoError(t, err)
			require.Equal(t, ledger.SwapGaveBack, out, "the held slot went to the deciding job past the front (%s)", elsewhere)
			require.Zero(t, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE kind = $1`, kind), "the slot was not given back")
			require.Zero(t, count(t, pool, `SELECT count(*) FROM concurrency_starts WHERE job_id = $1`, younger.ID), "its start stayed")
			require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_waiters WHERE job_id = $1 AND worker_id = 'w1'`, younger.ID),
				"the younger job does not wait in the line")
			n, rows := admitted(t, pool, kind)
			require.Zero(t, rows)
			require.Zero(t, n, "the count kept the slot given back")

			_, err = l.Release(ctx, ledger.Release{Rounds: []string{kind}}, nil)
			require.NoError(t, err)
			require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = $1`, front.ID),
				"the grant round did not give the slot to the front")
			require.Zero(t, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id IN ($1, $2)`, older.ID, younger.ID),
				"a job behind the front got the slot")
		})
	}
}

// TestSwapGivesBackASlotTakenBeforeARate: a younger job of a key took the
// key's slot before a per-key rate was set (no start logged) and has not
// begun when an older one of the key, decided under the rate, waits: the
// swap gives the slot back rather than move it, for the older one would
// start on it uncounted by the rate (torture seed 395970317: six starts of
// a key in 0.3 s under a rate of 5 in 2 s); the grant round gives the slot
// to the front with a start of the rate's.
func TestSwapGivesBackASlotTakenBeforeARate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.swaprate"
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, "partition_fields = ARRAY['key'], key_max = 1")
	older := running(t, pool, kind, `{"key": "k"}`, "w1", 2, time.Now())
	younger := running(t, pool, kind, `{"key": "k"}`, "w1", 1, time.Now().Add(-time.Second))
	require.Equal(t, ledger.Slot, decideOne(t, l, younger, nil).Action)
	require.Zero(t, count(t, pool, `SELECT count(*) FROM concurrency_starts WHERE kind = $1`, kind), "a start logged with no rate")
	setLimits(t, l, kind, "rate_max = 5, rate_period = interval '2 seconds', rate_per_key = true")
	older.HeldBehind = true
	d := decideOne(t, l, older, nil)
	require.Equal(t, ledger.Wait, d.Action, "the key's slot is the younger job's")

	out, err := l.Swap(ctx, kind, younger.ID, older.ID, d.Reason)
	require.NoError(t, err)
	require.Equal(t, ledger.SwapGaveBack, out, "a slot with no start moved to a job decided under the rate")
	require.Zero(t, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE kind = $1`, kind))
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_waiters WHERE job_id = $1 AND worker_id = 'w1'`, younger.ID))

	_, err = l.Release(ctx, ledger.Release{Rounds: []string{kind}}, nil)
	require.NoError(t, err)
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = $1`, older.ID),
		"the grant round did not give the slot to the front")
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_starts WHERE job_id = $1`, older.ID),
		"the front's grant logged no start of the rate's")
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE kind = $1`, kind), "one slot of the key")
}

// TestGrantedJobsAreFetchedInTheirLinesOrder: under a per-key rate, an
// older job of a key parked after a retry (its scheduled_at later than the
// younger jobs' of its key) and granted with them is handed out by River's
// fetch order (priority, scheduled_at, id) before them: a resumed job is
// due since its insert (torture seed 395970325: two younger jobs granted
// 40 ms after the older one were fetched and started first, the older one
// fetched 300 ms later).
func TestGrantedJobsAreFetchedInTheirLinesOrder(t *testing.T) {
	t.Parallel()
	const kind = "test.grantorder"
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, "partition_fields = '{key}', rate_max = 5, rate_period = interval '1 minute', rate_per_key = true")
	var ids []int64
	for range 3 {
		ids = append(ids, queued(t, pool, kind, `{"key": "k"}`, "pending"))
	}
	// The oldest was retried: due later than the younger ones.
	exec(t, pool, `UPDATE river_job SET scheduled_at = now() + interval '1 second', created_at = now() - interval '1 second' WHERE id = $1`, ids[0])
	exec(t, pool, `UPDATE river_job SET scheduled_at = now() - interval '1 second' + (id - $1) * interval '1 millisecond' WHERE id IN ($2, $3)`,
		ids[0], ids[1], ids[2])
	for _, id := range ids {
		exec(t, pool, `INSERT INTO concurrency_parked_jobs (job_id, kind, key, reason, worker_id)
			VALUES ($1, $2, sluice_partition_key('{"key": "k"}', '{key}'), 'key_rate', 'w1')`, id, kind)
	}
	exec(t, pool, `INSERT INTO concurrency_key_lines (kind, key, waiting) VALUES ($1, sluice_partition_key('{"key": "k"}', '{key}'), true)
		ON CONFLICT (kind, key) DO UPDATE SET waiting = true`, kind)
	_, err := l.Release(context.Background(), ledger.Release{Rounds: []string{kind}}, nil)
	require.NoError(t, err)
	require.Equal(t, 3, count(t, pool, `SELECT count(*) FROM concurrency_starts WHERE kind = $1 AND reserved`, kind), "not every job was granted")

	rows, err := pool.Query(context.Background(), `SELECT id FROM river_job WHERE kind = $1 AND state = 'available' ORDER BY priority, scheduled_at, id`, kind)
	require.NoError(t, err)
	order, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Equal(t, ids, order, "River's fetch order of the granted jobs is not their line's")
	require.Zero(t, count(t, pool, `SELECT count(*) FROM river_job WHERE kind = $1 AND scheduled_at > now()`, kind), "a granted job is not due")
}

// TestCleanUpKeepsAFetchedJobsReservedStart: a parked job granted a start
// (reserved) and fetched is running, about to claim it, when the safety
// net cleans up: its reservation stays its own, so its decision runs it
// rather than park it behind its own start.
func TestCleanUpKeepsAFetchedJobsReservedStart(t *testing.T) {
	t.Parallel()
	const kind = "test.reserved"
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, "rate_max = 1, rate_period = interval '1 minute'")
	job := running(t, pool, kind, `{}`, "w1", 1, time.Now())
	job.Dispatched = false
	exec(t, pool, `INSERT INTO concurrency_starts (kind, job_id, started_at, reserved) VALUES ($1, $2, now(), true)`, kind, job.ID)
	_, _, _, err := l.CleanUp(context.Background(), kind, time.Minute, 0, time.Minute, "test")
	require.NoError(t, err)
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_starts WHERE job_id = $1 AND reserved`, job.ID),
		"the running job's reservation is kept")
	require.Equal(t, ledger.Run, decideOne(t, l, job, nil).Action, "it claims its start")
}

// TestHeldBehindWaitsRatherThanPark: a job whose wait timed out parks;
// with a younger job of its key held back behind it in its worker (which
// holds the key's slot and has not started) it waits instead, to take
// that slot; cancelled, it parks whatever is held behind it.
func TestHeldBehindWaitsRatherThanPark(t *testing.T) {
	t.Parallel()
	const kind = "test.heldbehind"
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, "partition_fields = ARRAY['key'], key_max = 1")
	var older []ledger.Job
	for range 3 {
		older = append(older, running(t, pool, kind, `{"key": "k"}`, "w1", 1, time.Now()))
	}
	younger := running(t, pool, kind, `{"key": "k"}`, "w1", 1, time.Now())
	require.Equal(t, ledger.Slot, decideOne(t, l, younger, nil).Action)
	for i, c := range []struct {
		heldBehind, cancelled bool
		want                  ledger.Action
	}{{false, false, ledger.Parked}, {true, false, ledger.Wait}, {true, true, ledger.Parked}} {
		older := older[i]
		older.TimedOut, older.HeldBehind, older.Cancelled = true, c.heldBehind, c.cancelled
		require.Equal(t, c.want, decideOne(t, l, older, nil).Action, "held behind %t, cancelled %t", c.heldBehind, c.cancelled)
	}
}

// TestForgottenGivesBackItsStart: a job decided to run under a rate (its
// start logged) and forgotten before it began (decided again, say) gives
// back its start with its slot: the window no longer counts it, and its
// decision afresh takes the one start the rate has.
func TestForgottenGivesBackItsStart(t *testing.T) {
	t.Parallel()
	const kind = "test.forgotten"
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, "max_concurrency = 5, rate_max = 1, rate_period = interval '1 minute'")
	job := running(t, pool, kind, `{}`, "w1", 1, time.Now().Add(-time.Second))
	require.Equal(t, ledger.Slot, decideOne(t, l, job, nil).Action)
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_starts WHERE job_id = $1`, job.ID))
	_, err := l.Release(context.Background(), ledger.Release{Forgotten: []ledger.Held{{ID: job.ID, Kind: kind}}}, nil)
	require.NoError(t, err)
	require.Zero(t, count(t, pool, `SELECT count(*) FROM concurrency_starts WHERE job_id = $1`, job.ID), "its start went")
	n, rows := admitted(t, pool, kind)
	require.Zero(t, rows, "its slot went")
	require.Zero(t, n)
	require.Equal(t, ledger.Slot, decideOne(t, l, job, nil).Action, "decided afresh, it takes the rate's one start")
}

// TestSwapGivesAHeldStartToAnOlderJob: under a per-key rate alone (1 a
// minute), a younger job of the key took the key's start and has not
// begun when an older one (a retry, fetched after it) decides and waits:
// the swap moves the start to the older one (reserved, for it to claim as
// it begins) and puts the younger one in the line. With an older job of
// the key parked, the younger one gives the start back instead, for the
// grant round to give the front.
func TestSwapGivesAHeldStartToAnOlderJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, parkedOlder := range []bool{false, true} {
		t.Run(fmt.Sprintf("parked older %t", parkedOlder), func(t *testing.T) {
			t.Parallel()
			const kind = "test.swapstart"
			pool, l := newLedger(t, "w1")
			setLimits(t, l, kind, "partition_fields = '{key}', rate_max = 1, rate_period = interval '1 minute', rate_per_key = true")
			var front int64
			if parkedOlder {
				front = queued(t, pool, kind, `{"key": "k"}`, "pending")
				exec(t, pool, `INSERT INTO concurrency_parked_jobs (job_id, kind, key, reason, worker_id)
					VALUES ($1, $2, sluice_partition_key('{"key": "k"}', '{key}'), 'key_rate', 'w1')`, front, kind)
			}
			older := running(t, pool, kind, `{"key": "k"}`, "w1", 2, time.Now())
			younger := running(t, pool, kind, `{"key": "k"}`, "w1", 1, time.Now().Add(-time.Second))
			if !parkedOlder {
				require.Equal(t, ledger.Run, decideOne(t, l, younger, nil).Action, "the key's start is the younger job's")
			} else {
				// The line's front is parked: the younger job took its start
				// before (a grant, say).
				exec(t, pool, `INSERT INTO concurrency_starts (kind, key, job_id, started_at)
					VALUES ($1, sluice_partition_key('{"key": "k"}', '{key}'), $2, now())`, kind, younger.ID)
			}
			// The younger job holds the start in its worker, not begun: the
			// older one waits (its window frees only in a minute), to take it.
			older.HeldBehind = true
			d := decideOne(t, l, older, nil)
			require.Equal(t, ledger.Wait, d.Action, "the key's start is taken")

			out, err := l.Swap(ctx, kind, younger.ID, older.ID, d.Reason)
			require.NoError(t, err)
			require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_waiters WHERE job_id = $1 AND worker_id = 'w1'`, younger.ID),
				"the younger job does not wait in the line")
			if parkedOlder {
				require.Equal(t, ledger.SwapGaveBack, out)
				require.Zero(t, count(t, pool, `SELECT count(*) FROM concurrency_starts WHERE kind = $1`, kind), "the start was not given back")
				return
			}
			require.Equal(t, ledger.SwapMoved, out, "the start did not move to the older job")
			require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_starts WHERE job_id = $1 AND reserved`, older.ID))
			require.Zero(t, count(t, pool, `SELECT count(*) FROM concurrency_starts WHERE job_id = $1`, younger.ID))
			require.Zero(t, count(t, pool, `SELECT count(*) FROM concurrency_waiters WHERE job_id = $1`, older.ID))
		})
	}
}

// TestAStolenGrantNotFetchedParksAgain: under a limit of 1, a younger job
// resumed with the kind's slot reserved for it and not fetched yet loses
// it to an older job of the line decided meanwhile (a retry): the older
// one takes the slot, and the younger one is parked again, its place
// kept (not left available and waiting, a second resumed job for one
// slot). Fetched already, it waits in the line as a job resumed ahead.
func TestAStolenGrantNotFetchedParksAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, fetched := range []bool{false, true} {
		t.Run(fmt.Sprintf("fetched %t", fetched), func(t *testing.T) {
			t.Parallel()
			const kind = "test.stolen"
			pool, l := newLedger(t, "w1")
			setLimits(t, l, kind, "max_concurrency = 1")
			older := running(t, pool, kind, `{}`, "w1", 2, time.Now())
			state := "available"
			if fetched {
				state = "running"
			}
			younger := queued(t, pool, kind, `{}`, state)
			exec(t, pool, `INSERT INTO concurrency_executions (job_id, kind, worker_id, reserved, admitted_at) VALUES ($1, $2, '', true, now())`,
				younger, kind)
			exec(t, pool, `UPDATE concurrency_limits SET admitted = 1 WHERE kind = $1`, kind)

			require.Equal(t, ledger.Slot, decideOne(t, l, older, nil).Action, "the older job did not take the younger one's grant")
			var got string
			require.NoError(t, pool.QueryRow(ctx, `SELECT state::text FROM river_job WHERE id = $1`, younger).Scan(&got))
			if fetched {
				require.Equal(t, "running", got)
				require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_waiters WHERE job_id = $1 AND worker_id IS NULL AND ahead`, younger))
				return
			}
			require.Equal(t, "pending", got, "the younger job, its grant taken before it was fetched, is not parked again")
			require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_parked_jobs WHERE job_id = $1`, younger))
			require.Zero(t, count(t, pool, `SELECT count(*) FROM concurrency_waiters WHERE job_id = $1`, younger))
			n, rows := admitted(t, pool, kind)
			require.Equal(t, 1, rows)
			require.Equal(t, 1, n, "the slot changed hands: the count stays")
		})
	}
}

// TestAStealFindsTheNewestJobWithBothReserved: under a per-kind limit and
// a per-key rate, the newest job of the key with a start reserved was
// granted while waiting in a worker (its slot its own, not reserved); an
// older job with both a slot and a start reserved is on its way. A retry
// older than both, held by the key's rate, takes the grant of the one on
// its way, the newest with both reserved.
func TestAStealFindsTheNewestJobWithBothReserved(t *testing.T) {
	t.Parallel()
	const kind = "test.stealboth"
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, "max_concurrency = 4, partition_fields = '{key}', rate_max = 2, rate_period = interval '1 minute', rate_per_key = true")
	retry := running(t, pool, kind, `{"key": "k"}`, "w1", 2, time.Now())
	onItsWay := queued(t, pool, kind, `{"key": "k"}`, "available")
	waiting := running(t, pool, kind, `{"key": "k"}`, "w1", 1, time.Now())
	key := `sluice_partition_key('{"key": "k"}', '{key}')`
	exec(t, pool, `INSERT INTO concurrency_executions (job_id, kind, key, worker_id, reserved, admitted_at)
		VALUES ($1, $3, `+key+`, '', true, now()), ($2, $3, `+key+`, 'w1', false, now())`, onItsWay, waiting.ID, kind)
	exec(t, pool, `INSERT INTO concurrency_starts (kind, key, job_id, started_at, reserved)
		VALUES ($1, `+key+`, $2, now(), true), ($1, `+key+`, $3, now(), true)`, kind, onItsWay, waiting.ID)
	exec(t, pool, `UPDATE concurrency_limits SET admitted = 2 WHERE kind = $1`, kind)
	exec(t, pool, `INSERT INTO concurrency_key_lines (kind, key, slots, waiting) VALUES ($1, `+key+`, 2, false)`, kind)

	require.Equal(t, ledger.Slot, decideOne(t, l, retry, nil).Action, "the retry did not take the grant of the job on its way")
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = $1`, retry.ID))
	require.Zero(t, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = $1`, onItsWay))
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_starts WHERE job_id = $1 AND reserved`, waiting.ID),
		"the start of the job granted in its worker was taken")
}

// TestAStealUnderAFullKindWithJobsParked: under a per-kind limit of 1
// over keys, the kind's one slot is reserved for a younger job of key k on
// its way, and a job of another key is parked (it waits for the kind).
// An older job of k (a retry) fetched with the younger one takes its
// grant: the grant was k's turn, and the older job of k goes first in it;
// the younger one waits. With an older job of k parked it does too: the
// younger one would pass that job as much as the retry does, and the
// retry too.
func TestAStealUnderAFullKindWithJobsParked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, olderParked := range []bool{false, true} {
		t.Run(fmt.Sprintf("older parked %t", olderParked), func(t *testing.T) {
			t.Parallel()
			const kind = "test.stealfull"
			pool, l := newLedger(t, "w1")
			setLimits(t, l, kind, "max_concurrency = 1, partition_fields = '{key}', key_max = 1")
			key := func(k string) string { return `sluice_partition_key('{"key": "` + k + `"}', '{key}')` }
			if olderParked {
				front := queued(t, pool, kind, `{"key": "k"}`, "pending")
				exec(t, pool, `INSERT INTO concurrency_parked_jobs (job_id, kind, key, reason, worker_id) VALUES ($1, $2, `+key("k")+`, 'limit', 'w1')`,
					front, kind)
			}
			other := queued(t, pool, kind, `{"key": "o"}`, "pending")
			exec(t, pool, `INSERT INTO concurrency_parked_jobs (job_id, kind, key, reason, worker_id) VALUES ($1, $2, `+key("o")+`, 'limit', 'w1')`,
				other, kind)
			retry := running(t, pool, kind, `{"key": "k"}`, "w1", 2, time.Now())
			younger := running(t, pool, kind, `{"key": "k"}`, "w1", 1, time.Now())
			exec(t, pool, `INSERT INTO concurrency_executions (job_id, kind, key, worker_id, reserved, admitted_at)
				VALUES ($1, $2, `+key("k")+`, '', true, now())`, younger.ID, kind)
			exec(t, pool, `UPDATE concurrency_limits SET admitted = 1, has_parked = true WHERE kind = $1`, kind)
			exec(t, pool, `INSERT INTO concurrency_key_lines (kind, key, slots, waiting) VALUES ($1, `+key("k")+`, 1, false), ($1, `+key("o")+`, 0, true)`, kind)
			exec(t, pool, `UPDATE river_job SET metadata = '{"sluice_parking": {}}' WHERE id = $1`, younger.ID)
			retry.Dispatched, younger.Dispatched = false, false

			out, err := l.Decide(ctx, []ledger.Job{retry, younger}, nil, time.Second, nil)
			require.NoError(t, err)
			require.Equal(t, ledger.Slot, out.Decisions[0].Action, "the retry did not take the grant of the younger job of its key")
			require.NotEqual(t, ledger.Slot, out.Decisions[1].Action)
			require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = $1`, retry.ID))
		})
	}
}

// TestARetryTakesAGrantGivenBeforeItCameBack: slots reserved for younger
// jobs by a round that ran before an older job of their line came back (a
// retry) go to the retry first. Fetched together with two of them, under a
// full per-kind limit and a long line parked behind, the retry takes the
// newest one's grant and starts, the other younger job starts on its own,
// and the newest waits in the line again, whatever is ahead of the retry:
// nothing, an older job granted and not fetched yet, or an older job
// parked (which the younger job would pass as much as the retry does).
// Torture seed 564674972: the retry parked at its fetch (long line) behind
// an older job, while both younger jobs began.
func TestARetryTakesAGrantGivenBeforeItCameBack(t *testing.T) {
	t.Parallel()
	for _, ahead := range []string{"nothing", "granted", "parked"} {
		t.Run(ahead, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			const kind = "test.givenbefore"
			pool, l := newLedger(t, "w1")
			setLimits(t, l, kind, "max_concurrency = 20")
			reserve := func(id int64) {
				exec(t, pool, `INSERT INTO concurrency_executions (job_id, kind, reserved) VALUES ($1, $2, true)`, id, kind)
			}
			park := func(id int64) {
				exec(t, pool, `INSERT INTO concurrency_parked_jobs (job_id, kind, reason, worker_id) VALUES ($1, $2, 'limit', 'w2')`, id, kind)
			}
			limit := 2
			switch ahead {
			case "granted":
				reserve(queued(t, pool, kind, `{}`, "available"))
				limit = 3
			case "parked":
				park(queued(t, pool, kind, `{}`, "pending"))
			}
			retry := running(t, pool, kind, `{}`, "w1", 2, time.Now())
			retry.Dispatched = false
			batch := []ledger.Job{retry}
			for range 2 {
				y := running(t, pool, kind, `{}`, "w1", 1, time.Now())
				y.Dispatched = false
				reserve(y.ID)
				batch = append(batch, y)
			}
			for range 30 { // a long line behind them: a job behind an older one parks at its fetch
				park(queued(t, pool, kind, `{}`, "pending"))
			}
			setLimits(t, l, kind, fmt.Sprintf("max_concurrency = %d", limit)) // recounted: every slot taken

			out, err := l.Decide(ctx, batch, nil, time.Second, nil)
			require.NoError(t, err)
			require.Len(t, out.Decisions, 3)
			require.Equal(t, ledger.Slot, out.Decisions[0].Action, "the retry (%s): younger jobs began on grants given before it came back", out.Decisions[0].Reason)
			require.Equal(t, ledger.Slot, out.Decisions[1].Action, "the older of the younger jobs (%s)", out.Decisions[1].Reason)
			require.NotEqual(t, ledger.Slot, out.Decisions[2].Action, "the newest job kept its grant")
			require.NotEqual(t, ledger.Run, out.Decisions[2].Action, "the newest job kept its grant")
			n, rows := admitted(t, pool, kind)
			require.Equal(t, limit, n, "the slots changed hands: the count stays")
			require.Equal(t, limit, rows)
			require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = $1 AND NOT reserved`, retry.ID))
		})
	}
}

// TestAChangeHoldsItsRoomForAJobDecidedBeforeIt: under a per-key rate, job
// A was decided in w1 (its start logged) and has not begun when a per-kind
// limit of 1 is set beside the rate; B, a younger job of A's key, is
// parked. The change's grant round gives the new slot to no one: A, which
// holds a start but no slot, holds its line as a job fetched and not
// decided does, until its worker decides it again (the decision takes the
// slot and the mark) or RecheckHold passes (a job that began is never
// decided again). Seeds 780682432 and 798829501: the round gave the new
// room to younger parked jobs, which were fetched and began while the
// older one waited to be decided again.
func TestAChangeHoldsItsRoomForAJobDecidedBeforeIt(t *testing.T) {
	t.Parallel()
	const kind = "test.change.recheck"
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, "partition_fields = '{key}', rate_max = 5, rate_period = interval '1 minute', rate_per_key = true")
	a := running(t, pool, kind, `{"key": "a"}`, "w1", 1, time.Now())
	require.Equal(t, ledger.Run, decideOne(t, l, a, nil).Action)
	b := queued(t, pool, kind, `{"key": "a"}`, "pending")
	exec(t, pool, `INSERT INTO concurrency_parked_jobs (job_id, kind, reason, worker_id, key) VALUES ($1, $2, 'key_rate', 'w1', '"a"')`, b, kind)
	marked := func() int {
		return count(t, pool, `SELECT count(*) FROM concurrency_fetches
			WHERE job_id = $1 AND fetched_at > statement_timestamp() - interval '2 seconds'`, a.ID)
	}

	setLimits(t, l, kind, "max_concurrency = 1")
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM river_job WHERE id = $1 AND state = 'pending'`, b),
		"the change gave its room to a younger job of A's line")
	require.Equal(t, 1, marked(), "A holds no place in its line")
	time.Sleep(ledger.RecheckHold + 50*time.Millisecond)
	require.Zero(t, marked(), "A's mark outlasts RecheckHold: a job that began would hold its line")

	a.Recheck = true
	require.Equal(t, ledger.Slot, decideOne(t, l, a, nil).Action, "A decided again takes the slot")
	require.Zero(t, count(t, pool, `SELECT count(*) FROM concurrency_fetches WHERE job_id = $1`, a.ID), "its decision left its mark")

	// A job that holds all the new limits ask is not marked.
	setLimits(t, l, kind, "max_concurrency = 2")
	require.Zero(t, count(t, pool, `SELECT count(*) FROM concurrency_fetches WHERE job_id = $1`, a.ID),
		"A holds a slot and a start: nothing to decide again")
}

// TestOlderJobsOfOneDecisionTakeTheGrantsTheyNeed: under a per-kind limit
// of 2, both slots are reserved for younger jobs granted and on their way
// (available, not fetched) when two older jobs, retries come back
// together, are fetched and decided in one batch. Each takes the newest
// grant left: both start, and both younger jobs are parked again. Seed
// 66145254: the batch's oldest job took one grant, the others waited for
// their turn behind it and parked, while the younger jobs were fetched and
// started ahead of them.
func TestOlderJobsOfOneDecisionTakeTheGrantsTheyNeed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.steals"
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, "max_concurrency = 2")
	older := []ledger.Job{
		running(t, pool, kind, `{}`, "w1", 2, time.Now()),
		running(t, pool, kind, `{}`, "w1", 2, time.Now()),
	}
	var younger []int64
	for range 2 {
		id := queued(t, pool, kind, `{}`, "available")
		exec(t, pool, `INSERT INTO concurrency_executions (job_id, kind, reserved) VALUES ($1, $2, true)`, id, kind)
		younger = append(younger, id)
	}
	setLimits(t, l, kind, "max_concurrency = 2") // recounted: both slots taken
	n, _ := admitted(t, pool, kind)
	require.Equal(t, 2, n)

	out, err := l.Decide(ctx, older, nil, time.Second, nil)
	require.NoError(t, err)
	for i, d := range out.Decisions {
		require.Equal(t, ledger.Slot, d.Action, "older job %d (%s)", older[i].ID, d.Reason)
	}
	for _, id := range younger {
		require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM river_job j JOIN concurrency_parked_jobs p ON p.job_id = j.id
			WHERE j.id = $1 AND j.state = 'pending'`, id), "younger job %d was not parked again", id)
	}
	n, rows := admitted(t, pool, kind)
	require.Equal(t, []int{2, 2}, []int{n, rows}, "the slots changed hands: the counts stay")
}

// TestCleanUpLeavesASlotBeingHandedOver: a worker hands the slot of a job
// that ended to the next job of its line in memory, and writes the move a
// moment after River's completer wrote the job's end. The safety net
// running in between finds the slot held for a job no longer running: it
// keeps it (a decision meanwhile still counts it, and admits no job past
// the limit), and the move written after it keeps it for the job that
// runs on it. A slot still held for a finished job at a later clean-up,
// the grace after, is freed (seed 652387540).
func TestCleanUpLeavesASlotBeingHandedOver(t *testing.T) {
	t.Parallel()
	const kind = "test.handover_cleanup"
	ctx := context.Background()
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, "max_concurrency = 1")
	ended := running(t, pool, kind, `{}`, "w1", 1, time.Now())
	require.Equal(t, ledger.Slot, decideOne(t, l, ended, nil).Action)
	next := running(t, pool, kind, `{}`, "w1", 1, time.Now())
	// River's completer writes the end; the hand-over to next is in memory.
	exec(t, pool, `UPDATE river_job SET state = 'completed', finalized_at = now() WHERE id = $1`, ended.ID)

	_, _, _, err := l.CleanUp(ctx, kind, time.Minute, time.Minute, time.Minute, "test")
	require.NoError(t, err)
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = $1`, ended.ID),
		"a slot found held for a finished job the first time is kept")
	other := running(t, pool, kind, `{}`, "w2", 1, time.Now())
	require.NotEqual(t, ledger.Slot, decideOne(t, ledger.New(ledger.Config{Pool: pool, WorkerID: "w2"}), other, nil).Action,
		"the slot kept still counts: no job past the limit")

	_, err = l.Release(ctx, ledger.Release{Handed: []ledger.HandOver{{
		From: ledger.Held{ID: ended.ID, Kind: kind}, To: ledger.Held{ID: next.ID, Kind: kind}}}}, nil)
	require.NoError(t, err)
	_, _, _, err = l.CleanUp(ctx, kind, time.Minute, 0, time.Minute, "test")
	require.NoError(t, err)
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = $1 AND stale_since IS NULL`, next.ID),
		"the moved slot is next's, and not marked stale")

	// next ends, and no move follows: found twice, the grace apart, its
	// slot goes.
	exec(t, pool, `UPDATE river_job SET state = 'completed', finalized_at = now() WHERE id = $1`, next.ID)
	_, _, _, err = l.CleanUp(ctx, kind, time.Minute, 0, time.Minute, "test")
	require.NoError(t, err)
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = $1`, next.ID))
	_, _, _, err = l.CleanUp(ctx, kind, time.Minute, 0, time.Minute, "test")
	require.NoError(t, err)
	require.Equal(t, 0, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = $1`, next.ID),
		"a slot of a finished job found twice is freed")
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = $1`, other.ID),
		"and granted to the job that waited for it")
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_limits WHERE kind = $1 AND admitted = 1`, kind),
		"counted once")
}

// TestAChangeFromNoLimitHoldsItsRoomForAJobRunningFree: with no limit,
// job A, which had parked before, was fetched by w2 and decided to run
// with no slot, and has not begun when a per-kind limit of 1 is set; B, a
// younger job of the kind, is fetched by w1 after the change. A holds no
// row the ledger could tell it by, so the change marks it as fetched and
// not decided (for RecheckHold at most): B waits behind it, and A, decided
// again by its worker, takes the slot (seed 421705582: B took the new
// slot and began while A, fetched 56 ms before it, was decided again).
func TestAChangeFromNoLimitHoldsItsRoomForAJobRunningFree(t *testing.T) {
	t.Parallel()
	const kind = "test.change.fromnone"
	pool, w1 := newLedger(t, "w1")
	w2 := ledger.New(ledger.Config{Pool: pool, WorkerID: "w2"})
	a := running(t, pool, kind, `{}`, "w2", 1, time.Now())
	require.Equal(t, ledger.Run, decideOne(t, w2, a, nil).Action, "no limit: it runs")

	setLimits(t, w1, kind, "max_concurrency = 1")
	b := running(t, pool, kind, `{}`, "w1", 1, time.Now())
	require.Equal(t, ledger.Wait, decideOne(t, w1, b, nil).Action, "the younger job took the slot ahead of A")
	a.Recheck = true
	require.Equal(t, ledger.Slot, decideOne(t, w2, a, nil).Action, "A decided again takes the slot")
}

// waitForALockWait waits until a backend of pool's database waits for a
// lock (a row, an advisory lock) held by the test.
func waitForALockWait(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	require.Eventually(t, func() bool {
		return count(t, pool, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`) > 0
	}, 10*time.Second, 5*time.Millisecond, "no backend waits for the lock the test holds")
}

// TestAStealOfAStartClaimedMeanwhileDecidesAgain: under a kind-wide rate
// of 3, three younger jobs waiting in w1 were granted the window's three
// starts (reserved). An older job (a retry) is decided: held by the rate,
// it takes the newest grant (a steal). Meanwhile w1 claims that grant as
// it wakes its job (LedgerClaimStarts, without the kind's lock), between
// the decision's read and its write. The decision must not take a start
// that is no longer reserved: it is made again, takes the next grant, and
// the window still holds three starts. Seed 836093428: the retry began as
// a fourth start beside the three granted.
func TestAStealOfAStartClaimedMeanwhileDecidesAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.steal.claimed"
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, "rate_max = 3, rate_period = interval '1 minute'")
	retry := running(t, pool, kind, `{}`, "w1", 2, time.Now())
	retry.Dispatched = false
	var granted []int64
	for range 3 {
		j := running(t, pool, kind, `{}`, "w1", 1, time.Now())
		exec(t, pool, `INSERT INTO concurrency_starts (kind, job_id, started_at, reserved) VALUES ($1, $2, now(), true)`, kind, j.ID)
		granted = append(granted, j.ID)
	}
	newest := granted[2]

	// The claim of the newest grant, begun and not committed yet.
	claim, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer claim.Rollback(ctx) //nolint:errcheck // committed below
	_, err = claim.Exec(ctx, `UPDATE concurrency_starts SET reserved = false, started_at = clock_timestamp() WHERE job_id = $1`, newest)
	require.NoError(t, err)

	type result struct {
		out *ledger.Decided
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := l.Decide(ctx, []ledger.Job{retry}, nil, time.Second, nil)
		done <- result{out, err}
	}()
	waitForALockWait(t, pool) // the decision reached the newest grant's row
	require.NoError(t, claim.Commit(ctx))
	res := <-done
	require.NoError(t, res.err)

	require.Equal(t, 3, count(t, pool, `SELECT count(*) FROM concurrency_starts WHERE kind = $1`, kind),
		"the window holds more starts than the rate")
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_starts WHERE job_id = $1 AND NOT reserved`, newest),
		"the start claimed by its job was taken from it")
	require.Equal(t, ledger.Run, res.out.Decisions[0].Action, "the retry did not take the next grant on its way")
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_starts WHERE job_id = $1`, retry.ID))
	require.Zero(t, count(t, pool, `SELECT count(*) FROM concurrency_starts WHERE job_id = $1`, granted[1]),
		"the retry took a grant other than the newest left")
}

// TestHeldBehindIsToldUnderTheLock: whether a job is held behind (a
// younger job of its key in its worker holds a grant it has not begun on)
// is asked as the decision reads the line under the kind's lock, not as
// the job is sent: a grant that came to the younger job while the
// decision waited for the lock makes the job wait (and take it, Swap)
// rather than park. Seed 836093428: the job parked, its decision sent
// before the grant, and the younger ones began as it did.
func TestHeldBehindIsToldUnderTheLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.heldbehind.locked"
	pool, l := newLedger(t, "w1")
	setLimits(t, l, kind, "partition_fields = ARRAY['key'], key_max = 1")
	older := running(t, pool, kind, `{"key": "k"}`, "w1", 1, time.Now())
	younger := running(t, pool, kind, `{"key": "k"}`, "w1", 1, time.Now())
	require.Equal(t, ledger.Slot, decideOne(t, l, younger, nil).Action)
	older.TimedOut = true // it parks unless held behind

	// Another transaction holds the kind's lock (a grant round, say).
	round, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer round.Rollback(ctx) //nolint:errcheck // committed below
	_, err = round.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('sluice.limit_row:' || $1::text, 0))`, kind)
	require.NoError(t, err)

	var heldNow atomic.Bool
	type result struct {
		out *ledger.Decided
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := l.Decide(ctx, []ledger.Job{older}, nil, time.Second, func(j ledger.Job) bool {
			return j.ID == older.ID && heldNow.Load()
		})
		done <- result{out, err}
	}()
	waitForALockWait(t, pool) // the decision waits for the kind's lock
	heldNow.Store(true)       // the younger job's grant came meanwhile
	require.NoError(t, round.Commit(ctx))
	res := <-done
	require.NoError(t, res.err)
	require.Equal(t, ledger.Wait, res.out.Decisions[0].Action, "held behind was asked before the decision held the lock")
}
