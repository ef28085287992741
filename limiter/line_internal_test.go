package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/testdb"
)

// newTestLimiter is a Limiter of worker id on a pool of a fresh database.
func newTestLimiter(t *testing.T, id string) (*pgxpool.Pool, *Limiter) {
	t.Helper()
	pool, err := db.Open(context.Background(), testdb.New(t), 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	l, err := New(Config{Pool: pool, WorkerID: id})
	require.NoError(t, err)
	return pool, l
}

// TestLineLetsGoWhatAnUnlimitedJobHeld: a job that claimed a grant and is
// decided again (its wait ended as the grant came) after its kind's limits
// were cleared runs without a limit, and the slot it held goes back: a job
// running without a slot never releases one, so the row and the count
// would stay taken.
func TestLineLetsGoWhatAnUnlimitedJobHeld(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.unlimited"
	pool, l := newTestLimiter(t, "w1")
	require.NoError(t, l.SetConcurrency(ctx, kind, 1))
	// Job 42 waited in w1 and claimed the slot a grant round gave it.
	_, err := pool.Exec(ctx, `INSERT INTO concurrency_executions (job_id, kind, worker_id) VALUES (42, $1, 'w1')`, kind)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE concurrency_limits SET admitted = 1 WHERE kind = $1`, kind)
	require.NoError(t, err)
	_, err = l.ClearLimits(ctx, kind, Facets{})
	require.NoError(t, err)
	held := func() (rows, admitted int) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM concurrency_executions WHERE job_id = 42),
			COALESCE((SELECT admitted FROM concurrency_limits WHERE kind = $1), 0)`, kind).Scan(&rows, &admitted))
		return rows, admitted
	}
	rows, admitted := held()
	require.Equal(t, 1, rows, "a cleared limit leaves the slot of a running job to its release")
	require.Equal(t, 1, admitted)

	fetched := time.Now().Add(-time.Minute) // its attempt began before it claimed the grant
	req := &admitRequest{ctx: ctx, job: &rivertype.JobRow{ID: 42, Kind: kind, AttemptedAt: &fetched}, deadline: time.Now().Add(time.Second),
		done: make(chan struct{}), timedOut: true}
	l.lineChunk([]*admitRequest{req})
	require.NoError(t, req.err)
	require.Equal(t, admitRun, req.decision, "no limit: it runs, without a slot")
	l.Flush() // the give-back is written in the background
	rows, admitted = held()
	require.Zero(t, rows, "the slot it held went back")
	require.Zero(t, admitted)
}

// TestLineDecidesARetryAfresh: a job retried at once is fetched again
// before the release of its first attempt is written (the torture test's
// seed 871459821, on a loaded machine): the first attempt's slot row and
// start are still there. The new attempt is decided afresh and logs a
// start of its own, so the rate window counts it; it did not (it ran on
// the old attempt's slot, uncounted: 4 starts in a window of 3).
func TestLineDecidesARetryAfresh(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.retried"
	pool, l := newTestLimiter(t, "w1")
	require.NoError(t, l.SetConcurrency(ctx, kind, 5))
	require.NoError(t, l.SetRate(ctx, kind, Rate{Max: 10, Per: time.Minute}, nil))
	// Attempt 1 of job 7 took a slot and a start 2 s ago, and ended.
	for _, sql := range []string{
		`INSERT INTO concurrency_executions (job_id, kind, worker_id, admitted_at) VALUES (7, $1, 'w1', now() - interval '2 seconds')`,
		`UPDATE concurrency_limits SET admitted = 1 WHERE kind = $1`,
		`INSERT INTO concurrency_starts (kind, job_id, started_at) VALUES ($1, 7, now() - interval '2 seconds')`,
	} {
		_, err := pool.Exec(ctx, sql, kind)
		require.NoError(t, err)
	}
	starts := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM concurrency_starts WHERE job_id = 7`).Scan(&n))
		return n
	}
	require.Equal(t, 1, starts())

	fetched := time.Now().Add(-100 * time.Millisecond) // attempt 2, fetched after attempt 1 ended
	req := &admitRequest{ctx: ctx, job: &rivertype.JobRow{ID: 7, Kind: kind, Attempt: 2, AttemptedAt: &fetched},
		deadline: time.Now().Add(time.Second), done: make(chan struct{})}
	l.lineChunk([]*admitRequest{req})
	require.NoError(t, req.err)
	require.Equal(t, admitSlot, req.decision, "room in the limit and the rate: it starts with a slot")
	require.Equal(t, 2, starts(), "attempt 2 logged a start of its own")
	var rows, admitted int
	require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM concurrency_executions WHERE job_id = 7),
		(SELECT admitted FROM concurrency_limits WHERE kind = $1)`, kind).Scan(&rows, &admitted))
	require.Equal(t, 1, rows, "one slot row per job")
	require.Equal(t, rows, admitted, "the count equals the rows")
}

// TestReleaseRacesLimitRowCreation: slots of a kind without a limit row
// (its limits were cleared while jobs held them) are released while an
// operator sets a limit on the kind, over and over: the new row counts the
// slots it finds, and a release that found no row to lock must still
// lower that count. At the end the count equals the slot rows.
func TestReleaseRacesLimitRowCreation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.rowless"
	pool, l := newTestLimiter(t, "w1")
	admin, err := New(Config{Pool: pool, WorkerID: "cli"})
	require.NoError(t, err)
	for i := range int64(150) {
		_, err := pool.Exec(ctx, `DELETE FROM concurrency_limits WHERE kind = $1`, kind)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `INSERT INTO concurrency_executions (job_id, kind, worker_id) VALUES ($1, $2, 'w1')`, i+1, kind)
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() { done <- admin.SetConcurrency(ctx, kind, 5) }()
		l.releaseBatch([]*releaseRequest{{ctx: ctx, job: &rivertype.JobRow{ID: i + 1, Kind: kind}, kind: kind}})
		require.NoError(t, <-done)
		var admitted, rows int
		require.NoError(t, pool.QueryRow(ctx, `SELECT admitted, (SELECT count(*) FROM concurrency_executions WHERE kind = $1)
			FROM concurrency_limits WHERE kind = $1`, kind).Scan(&admitted, &rows))
		require.Equal(t, rows, admitted, "round %d: the count equals the slot rows", i)
	}
}

// TestCleanUpWaitsForALimitRowInTheMaking: the safety net frees the stale
// slot of a kind that has no limit row while another transaction is
// giving the kind one (SetConcurrency: the new row counts the slot rows it
// finds). It waits for that transaction, then frees the slot under the
// new row and lowers its count: it does not delete a row the new count
// includes (admitted 1, no row, until a later recount).
func TestCleanUpWaitsForALimitRowInTheMaking(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.rowless"
	pool, l := newTestLimiter(t, "w1")
	// A slot left by job 42 (no longer in River) of a kind whose limits
	// were cleared while it ran.
	_, err := pool.Exec(ctx, `INSERT INTO concurrency_executions (job_id, kind, worker_id) VALUES (42, $1, 'w1')`, kind)
	require.NoError(t, err)

	// A limit being set: the row-creation lock taken, the row inserted
	// (counting the slot), not committed yet.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	q := db.New(tx)
	require.NoError(t, q.LockLimitRowCreation(ctx, []string{kind}))
	_, err = tx.Exec(ctx, `INSERT INTO concurrency_limits (kind, max_concurrency) VALUES ($1, 1)`, kind)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		_, _, err := l.cleanUpKind(ctx, kind, l.logger, "test")
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("the clean-up did not wait for the limit row being created (err %v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, tx.Commit(ctx))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the clean-up did not finish")
	}
	var rows, admitted int
	require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM concurrency_executions WHERE kind = $1),
		(SELECT admitted FROM concurrency_limits WHERE kind = $1)`, kind).Scan(&rows, &admitted))
	require.Zero(t, rows, "the stale slot is still there")
	require.Equal(t, rows, admitted, "the count does not match the slot rows")
}

// TestLineFrontReadsOnlyWhatARoundCanUse: under a per-key limit a key's
// front is read as deep as its free slots while no job of the key is
// parked: a key holding both its slots with three jobs waiting gives no
// row, one holding one slot gives its oldest waiter; once a job of the key
// is parked (the lookahead may resume it, and a parked job late in its
// parking is passed over), and without a per-key limit (key_max 0), the
// depth asked for.
func TestLineFrontReadsOnlyWhatARoundCanUse(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.front"
	pool, _ := newTestLimiter(t, "w1")
	ids := make([]int64, 6)
	for i, job := range runningJobs(t, pool, kind, len(ids)) {
		ids[i] = job.ID
	}
	// Jobs 0 and 1 hold key k's two slots; 2, 3 and 4 wait in w1.
	_, err := pool.Exec(ctx, `INSERT INTO concurrency_executions (job_id, kind, worker_id, key) VALUES ($1, $3, 'w1', 'k'), ($2, $3, 'w1', 'k')`,
		ids[0], ids[1], kind)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO concurrency_waiters (job_id, kind, key, worker_id, reason)
		SELECT id, $2, 'k', 'w1', 'key_limit' FROM unnest($1::bigint[]) AS id`, ids[2:5], kind)
	require.NoError(t, err)
	front := func(keyMax, depth int32) []int64 {
		rows, err := db.New(pool).LineFront(ctx, db.LineFrontParams{Kind: kind, Keys: []string{"k"}, PerKey: depth, KeyMax: keyMax})
		require.NoError(t, err)
		var out []int64
		for _, r := range rows {
			out = append(out, r.JobID)
		}
		return out
	}
	require.Empty(t, front(2, 4), "a key without room and nothing parked: nothing to read")
	require.Equal(t, ids[2:5], front(0, 4), "no per-key limit: the depth asked for")

	_, err = pool.Exec(ctx, `DELETE FROM concurrency_executions WHERE job_id = $1`, ids[1])
	require.NoError(t, err)
	require.Equal(t, ids[2:3], front(2, 4), "one free slot: the oldest waiter")

	// Job 5 parks: the depth asked for, the parked job last.
	_, err = pool.Exec(ctx, `UPDATE river_job SET state = 'pending' WHERE id = $1`, ids[5])
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO concurrency_parked_jobs (job_id, kind, key, reason) VALUES ($1, $2, 'k', 'key_limit')`, ids[5], kind)
	require.NoError(t, err)
	require.Equal(t, []int64{ids[2], ids[3], ids[4], ids[5]}, front(2, 4), "a parked job waits: as deep as asked")
	require.Equal(t, ids[2:4], front(2, 2))
}

// runningJobs inserts n running River jobs of kind, fetched now.
func runningJobs(t *testing.T, pool *pgxpool.Pool, kind string, n int) []*rivertype.JobRow {
	t.Helper()
	jobs := make([]*rivertype.JobRow, n)
	for i := range jobs {
		at := time.Now()
		jobs[i] = &rivertype.JobRow{Kind: kind, AttemptedAt: &at}
		require.NoError(t, pool.QueryRow(context.Background(), `INSERT INTO river_job (args, kind, max_attempts, state, queue, attempted_at, attempt)
			VALUES ('{}', $1, 5, 'running', 'default', now(), 1) RETURNING id`, kind).Scan(&jobs[i].ID))
	}
	return jobs
}

// oneSlotTwoWorkers is a kind limited to 1 with n running jobs, the first
// holding the slot in worker w1 (l1), and a second worker w2 (l2, its test
// signals on).
func oneSlotTwoWorkers(t *testing.T, kind string, n int) (pool *pgxpool.Pool, l1, l2 *Limiter, jobs []*rivertype.JobRow) {
	t.Helper()
	ctx := context.Background()
	pool, l1 = newTestLimiter(t, "w1")
	l2, err := New(Config{Pool: pool, WorkerID: "w2"})
	require.NoError(t, err)
	l2.TestSignals.Init(t)
	require.NoError(t, l1.SetConcurrency(ctx, kind, 1))
	jobs = runningJobs(t, pool, kind, n)
	_, err = pool.Exec(ctx, `INSERT INTO concurrency_executions (job_id, kind, worker_id) VALUES ($1, $2, 'w1')`, jobs[0].ID, kind)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE concurrency_limits SET admitted = 1 WHERE kind = $1`, kind)
	require.NoError(t, err)
	return pool, l1, l2, jobs
}

// decideToWait has l decide job (with ctx), which must wait.
func decideToWait(t *testing.T, ctx context.Context, l *Limiter, job *rivertype.JobRow) *admitRequest {
	t.Helper()
	req := &admitRequest{ctx: ctx, job: job, deadline: time.Now().Add(time.Minute), done: make(chan struct{})}
	l.lineChunk([]*admitRequest{req})
	require.NoError(t, req.err)
	require.Equal(t, admitWait, req.decision)
	return req
}

// followAsync follows req's decision in l in the background: its outcome.
func followAsync(t *testing.T, l *Limiter, req *admitRequest) <-chan admission {
	out := make(chan admission, 1)
	go func() {
		dec, err := l.follow(req)
		assert.NoError(t, err)
		out <- dec
	}()
	return out
}

// TestGrantWakesItsWorker: a grant round in one worker that gives a slot to
// a job waiting in another notifies that worker, whose line poller claims
// it at the notification (not at a poll) and the job runs with the slot.
func TestGrantWakesItsWorker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.notified"
	pool, l1, l2, jobs := oneSlotTwoWorkers(t, kind, 2)

	// The second waits for the first's slot in w2.
	decided := followAsync(t, l2, decideToWait(t, ctx, l2, jobs[1]))
	l2.TestSignals.GrantListening.WaitOrTimeout()

	l1.releaseBatch([]*releaseRequest{{ctx: ctx, job: jobs[0], kind: kind}})
	require.Equal(t, jobs[1].ID, l2.TestSignals.GrantHeard.WaitOrTimeout(), "claimed at the notification")
	select {
	case dec := <-decided:
		require.Equal(t, admitSlot, dec)
	case <-time.After(10 * time.Second):
		t.Fatal("the granted job did not run")
	}
	var worker string
	require.NoError(t, pool.QueryRow(ctx, `SELECT worker_id FROM concurrency_executions WHERE job_id = $1 AND NOT reserved`, jobs[1].ID).Scan(&worker))
	require.Equal(t, "w2", worker)
	l1.Flush()
	l2.Flush()
}

// TestGrantHeardBeforeItsWait: a notification can name a job whose
// decision to wait committed but which does not wait in its worker yet;
// the poller keeps it, and the job claims its grant as soon as it waits
// (not at the next claim for all, 50 ms on).
func TestGrantHeardBeforeItsWait(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.heard"
	_, l1, l2, jobs := oneSlotTwoWorkers(t, kind, 3)

	// The youngest waits in w2 (its poller listens); the middle one is
	// decided to wait, and is granted the slot before it waits.
	youngestCtx, stopYoungest := context.WithCancel(ctx)
	youngestDone := followAsync(t, l2, decideToWait(t, youngestCtx, l2, jobs[2]))
	l2.TestSignals.GrantListening.WaitOrTimeout()
	middle := decideToWait(t, ctx, l2, jobs[1])
	l1.releaseBatch([]*releaseRequest{{ctx: ctx, job: jobs[0], kind: kind}})
	require.Eventually(t, func() bool {
		l2.waits.mu.Lock()
		gl := l2.waits.listener
		l2.waits.mu.Unlock()
		return gl != nil && gl.heard.has(jobs[1].ID)
	}, 5*time.Second, time.Millisecond, "the notification was not heard")

	middleDone := followAsync(t, l2, middle)
	require.Equal(t, jobs[1].ID, l2.TestSignals.GrantHeard.WaitOrTimeout(), "claimed as heard once it waited")
	require.Equal(t, admitSlot, <-middleDone)
	select {
	case <-youngestDone:
		t.Fatal("the youngest job was decided, the slot being taken")
	default:
	}
	stopYoungest() // it parks, its worker stopping
	require.Equal(t, admitParked, <-youngestDone)
	l1.Flush()
	l2.Flush()
}

// TestGrantWaitsForAParkingInProgress (the torture test's seed 399460107):
// under a per-kind limit alone, a grant round that finds the oldest job
// of the line still completing its parking (its worker committed it;
// River's completion has not made it pending yet) grants nothing past it:
// a younger parked job granted then would start before it. Once River's
// completion makes it pending, the next round resumes it first.
func TestGrantWaitsForAParkingInProgress(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.parking"
	pool, l := newTestLimiter(t, "w1")
	require.NoError(t, l.SetConcurrency(ctx, kind, 2))
	// Job 1 is completing its parking: running, marked, recorded. Jobs 2
	// and 3, younger, are parked.
	_, err := pool.Exec(ctx, `
		INSERT INTO river_job (id, args, kind, max_attempts, state, queue, priority, attempt, attempted_at, attempted_by, metadata)
		VALUES (1, '{}', $1, 5, 'running', 'default', 1, 1, now(), '{w1}', '{"sluice_park": true}'),
		       (2, '{}', $1, 5, 'pending', 'default', 1, 0, NULL, '{}', '{}'),
		       (3, '{}', $1, 5, 'pending', 'default', 1, 0, NULL, '{}', '{}')`, kind)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO concurrency_parked_jobs (job_id, kind, reason, worker_id)
		VALUES (1, $1, 'limit', 'w1'), (2, $1, 'limit', 'w1'), (3, $1, 'limit', 'w1')`, kind)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE concurrency_limits SET has_parked = true WHERE kind = $1`, kind)
	require.NoError(t, err)
	state := func(id int) string {
		var s string
		require.NoError(t, pool.QueryRow(ctx, `SELECT state::text FROM river_job WHERE id = $1`, id).Scan(&s))
		return s
	}
	l.releaseBatch([]*releaseRequest{{ctx: ctx, kind: kind}})
	require.Equal(t, "pending", state(2), "nothing is granted past a parking in progress")
	require.Equal(t, "pending", state(3))

	// River's completion lands: the job is parked in place.
	_, err = pool.Exec(ctx, `UPDATE river_job SET state = 'completed', finalized_at = now() WHERE id = 1`)
	require.NoError(t, err)
	require.Equal(t, "pending", state(1))
	l.releaseBatch([]*releaseRequest{{ctx: ctx, kind: kind}})
	require.Equal(t, "available", state(1), "the oldest is resumed first")
	require.Equal(t, "available", state(2))
	require.Equal(t, "pending", state(3), "two slots")
}
