package ledger_test

import (
	"context"
	"testing"
	"time"

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
// no slot of this worker's, or to one that holds one, moves nothing.
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
	ok, err := other.Swap(context.Background(), kind, younger.ID, older.ID, d.Reason)
	require.NoError(t, err)
	require.False(t, ok, "another worker's slot does not move")

	ok, err = l.Swap(context.Background(), kind, younger.ID, older.ID, d.Reason)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = $1 AND worker_id = 'w1'`, older.ID))
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_starts WHERE job_id = $1`, older.ID), "the start went with the slot")
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_waiters WHERE job_id = $1 AND worker_id = 'w1' AND reason = $2`,
		younger.ID, d.Reason), "the younger job waits in the line in this worker")
	require.Zero(t, count(t, pool, `SELECT count(*) FROM concurrency_waiters WHERE job_id = $1`, older.ID))
	require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE kind = $1 AND key IS NOT NULL`, kind), "one slot of the key")

	ok, err = l.Swap(context.Background(), kind, younger.ID, older.ID, d.Reason)
	require.NoError(t, err)
	require.False(t, ok, "a job with no slot has none to give")
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
	_, _, _, err := l.CleanUp(context.Background(), kind, time.Minute, time.Minute, "test")
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
