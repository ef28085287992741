package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/limiter/internal/ledger"
	"github.com/sluice-dev/sluice/limiter/internal/local"
)

// TestAGrantWhoseStartWentIsDecidedAgain: under a rate, jobs A and B wait
// in this worker's line and are granted their starts; an older job's
// decision took B's reserved start back (LedgerStealGrants) before the
// worker claimed it. A's claim finds its start, and A begins; B's finds
// none, and B goes to be decided again rather than begin on a start the
// window does not count (seed 66145208: six starts of a key in 1.85 s under
// 5 in 2 s). A job whose grant was not claimed with it (the claim failed)
// claims its start as it begins, and does not begin when it went.
func TestAGrantWhoseStartWentIsDecidedAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.grant.claim"
	pool, l := workerW1(t)
	require.NoError(t, l.SetRate(ctx, kind, Rate{Max: 5, Per: 2 * time.Second}, nil))

	waiting := func() int64 {
		var id int64
		require.NoError(t, pool.QueryRow(ctx, `INSERT INTO river_job (args, kind, max_attempts, state, queue, attempt, attempted_at, attempted_by)
			VALUES ('{}', $1, 5, 'running', 'default', 1, now(), '{w1}') RETURNING id`, kind).Scan(&id))
		return id
	}
	reserve := func(id int64) {
		_, err := pool.Exec(ctx, `INSERT INTO concurrency_starts (kind, job_id, started_at, reserved) VALUES ($1, $2, now(), true)`, kind, id)
		require.NoError(t, err)
	}
	q := l.queues.of(kind)
	a, b, c := waiting(), waiting(), waiting()
	q.Fetch([]local.Fetched{{ID: a}, {ID: b}, {ID: c}})
	for _, id := range []int64{a, b, c} {
		require.True(t, q.Line(id, false, "rate"))
	}
	reserve(a) // B's was taken back

	woke := l.grantJobs([]jobGrant{{id: a, slot: local.NoSlot}, {id: b, slot: local.NoSlot}}, nil)
	require.Equal(t, []int64{a}, woke, "only A's start was there to claim")
	require.Equal(t, local.Working, q.Get(a).State())
	require.Equal(t, local.Deciding, q.Get(b).State(), "B, its start gone, is decided again")
	var reserved bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT reserved FROM concurrency_starts WHERE job_id = $1`, a).Scan(&reserved))
	require.False(t, reserved, "A's start is logged as it begins")

	// C's grant came without its claim: it claims at its begin.
	require.True(t, q.Grant(c, local.NoSlot, false, 0))
	require.True(t, q.Get(c).Granted())
	require.False(t, l.startedAfterGrant(ctx, q, q.Get(c)), "C's start went: it must not begin")
	reserve(c)
	require.True(t, l.startedAfterGrant(ctx, q, q.Get(c)), "C's start is there: it begins")
}

// TestAGrantGivenBackIsNotStartedOn: a job deciding again (its limits
// changed before it began) hears of a grant (its start, claimed) while the
// ledger decides it. A decision to wait that gave back a grant the job
// held leaves it in the line: the grant heard may be the one given back
// (torture seed 797934157: the job began on a start the recheck had taken
// back, one start more in the rate's window than the rate). A decision
// to wait that gave nothing back lets it start with the grant, which came
// after the decision read the line.
func TestAGrantGivenBackIsNotStartedOn(t *testing.T) {
	t.Parallel()
	const kind = "test.grant.givenback"
	_, l := workerW1(t)
	q := l.queues.of(kind)
	for id, gaveBack := range map[int64]bool{1: true, 2: false} {
		q.Fetch([]local.Fetched{{ID: id}})
		require.False(t, q.Grant(id, local.NoSlot, true, 0), "a grant to a deciding job is kept for its decision")
		l.apply(q, ledger.Decision{Job: id, Kind: kind, Action: ledger.Wait, Reason: ledger.ReasonRate, GaveBack: gaveBack})
		want := local.Working
		if gaveBack {
			want = local.Lined
		}
		require.Equal(t, want, q.Get(id).State(), "job %d (its decision gave a grant back: %t)", id, gaveBack)
	}
}

// workerW1 is a Limiter of worker "w1" on a fresh database (flushed as
// the test ends), and its pool.
func workerW1(t *testing.T) (*pgxpool.Pool, *Limiter) {
	t.Helper()
	pool, err := pgkit.Open(context.Background(), testdb.New(t), 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	l, err := New(Config{Pool: pool, WorkerID: "w1"})
	require.NoError(t, err)
	t.Cleanup(l.Flush)
	return pool, l
}
