package liveness

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/internal/testlog"
	"github.com/sluice-dev/sluice/kinds"
	"github.com/sluice-dev/sluice/limiter"
	"github.com/sluice-dev/sluice/modules/demo"
)

// member is the liveness part of a worker, without River's client working:
// its pool (with the worker's settings and connection check), heartbeat and
// reaper.
type member struct {
	live *liveness
	pool *pgxpool.Pool
	hb   *heartbeat
	rp   *reaper
}

func newMember(t *testing.T, url, id string, interval, deadAfter time.Duration) *member {
	t.Helper()
	ctx := context.Background()
	logger := testlog.Logger(t).With("member", id)
	live := newLiveness(Config{ID: id, HeartbeatInterval: interval, DeadAfter: deadAfter, Logger: logger})
	config, err := testdb.PoolConfig(url)
	require.NoError(t, err)
	live.configurePool(config)
	pool, err := pgkit.OpenConfig(ctx, config, url, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	lim, err := limiter.New(limiter.Config{Pool: pool, Logger: logger, WorkerID: id})
	require.NoError(t, err)
	registry, err := kinds.New(kinds.Of[demo.SleepArgs]())
	require.NoError(t, err)
	metrics, err := newReaperMetrics(nil)
	require.NoError(t, err)
	m := &member{
		live: live,
		pool: pool,
		hb:   newHeartbeat(db.New(pool), live, interval, 0, nil, logger),
	}
	m.rp = &reaper{pool: pool, limiter: lim, registry: registry, live: live, logger: logger, metrics: metrics}
	ok, err := m.hb.register(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	return m
}

// seasoned makes the member look as if it had been heartbeating without a
// gap for d.
func (m *member) seasoned(d time.Duration) {
	m.live.mu.Lock()
	defer m.live.mu.Unlock()
	m.live.streakStart = time.Now().Add(-d)
	m.live.lastBeat = time.Now()
}

func mustExec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	_, err := pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err)
}

func countOf(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// insertJob inserts a River job in state, attempted by attemptedBy.
func insertJob(t *testing.T, pool *pgxpool.Pool, state string, attemptedBy ...string) int64 {
	t.Helper()
	var id int64
	require.NoError(t, pool.QueryRow(context.Background(), `
		INSERT INTO river_job (args, kind, max_attempts, state, queue, attempt, attempted_at, attempted_by)
		VALUES ('{"ms": 1}', 'demo.sleep', 5, $1::river_job_state, 'default', $2, now(), $3)
		RETURNING id`, state, len(attemptedBy), attemptedBy).Scan(&id))
	return id
}

func jobStateOf(t *testing.T, pool *pgxpool.Pool, id int64) string {
	t.Helper()
	var s string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT state::text FROM river_job WHERE id = $1`, id).Scan(&s))
	return s
}

// TestReaperReapsDeadWorker: once its own worker has heartbeated for the
// dead worker's dead-after, the reaper makes the dead worker's running job
// retryable, frees its slot and resumes a parked job into it, fails its
// maintenance run, terminates its backends and deletes its row; the dead
// worker then finds itself reaped (heartbeat and new connections).
func TestReaperReapsDeadWorker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.New(t)
	admin, err := pgkit.Open(ctx, url, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(admin.Close)

	// The reaper's own beat, set by seasoned, counts for two intervals: 800
	// ms between seasoned and the pass's look, on a loaded machine too.
	me := newMember(t, url, "me", 400*time.Millisecond, time.Second)
	dead := newMember(t, url, "dead", 100*time.Millisecond, time.Second)
	job := insertJob(t, admin, "running", "dead")
	other := insertJob(t, admin, "running", "me")
	mustExec(t, admin, `INSERT INTO concurrency_executions (job_id, kind, worker_id) VALUES ($1, 'demo.sleep', 'dead')`, job)
	var parked int64
	require.NoError(t, admin.QueryRow(ctx, `WITH j AS (
	        INSERT INTO river_job (state, kind, args, queue, priority, max_attempts)
	        VALUES ('pending', 'demo.sleep', '{"ms": 1}', 'default', 1, 25) RETURNING id)
	    INSERT INTO concurrency_parked_jobs (job_id, kind, reason) SELECT id, 'demo.sleep', 'limit' FROM j RETURNING job_id`).Scan(&parked))
	mustExec(t, admin, `INSERT INTO concurrency_limits (kind, max_concurrency) VALUES ('demo.sleep', 1)`)
	mustExec(t, admin, `INSERT INTO maintenance_runs (kind, job_id, worker_id) VALUES ('ci.drop_canceling_builds', $1, 'dead')`, job)
	// A session of the dead worker, idle (like a stopped process's).
	conn, err := dead.pool.Acquire(ctx)
	require.NoError(t, err)
	var deadPid int
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&deadPid))
	conn.Release()

	// A worker of the same id in another database is not touched.
	twin := newMember(t, testdb.New(t), "dead", 100*time.Millisecond, time.Second)
	conn, err = twin.pool.Acquire(ctx)
	require.NoError(t, err)
	var twinPid int
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&twinPid))
	conn.Release()

	// Not dead yet: nothing to reap.
	me.seasoned(time.Hour)
	n, err := me.rp.pass(ctx)
	require.NoError(t, err)
	require.Zero(t, n)

	mustExec(t, admin, `UPDATE sluice_workers SET heartbeat_at = now() - interval '1 hour' WHERE id = 'dead'`)
	// The reaper's own worker has not heartbeated for the dead worker's
	// dead-after (1s) yet: it waits.
	me.seasoned(500 * time.Millisecond)
	n, err = me.rp.pass(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, 1, countOf(t, admin, `SELECT count(*) FROM sluice_workers WHERE id = 'dead'`))

	me.seasoned(1100 * time.Millisecond)
	n, err = me.rp.pass(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)

	require.Equal(t, 0, countOf(t, admin, `SELECT count(*) FROM sluice_workers WHERE id = 'dead'`))
	require.Equal(t, "retryable", jobStateOf(t, admin, job))
	require.Equal(t, "running", jobStateOf(t, admin, other))
	var lastErr string
	require.NoError(t, admin.QueryRow(ctx, `SELECT errors[array_upper(errors, 1)]->>'error' FROM river_job WHERE id = $1`, job).Scan(&lastErr))
	require.Equal(t, "worker dead lost", lastErr)
	require.Equal(t, 0, countOf(t, admin, `SELECT count(*) FROM concurrency_executions WHERE job_id = $1`, job))
	require.Equal(t, 0, countOf(t, admin, `SELECT count(*) FROM concurrency_parked_jobs`), "the parked job took the freed slot")
	require.Equal(t, 1, countOf(t, admin, `SELECT count(*) FROM concurrency_executions e JOIN river_job j ON j.id = e.job_id
	                                        WHERE e.reserved AND j.id = $1 AND j.state = 'available'`, parked), "the same job, available again")
	require.Equal(t, 1, countOf(t, admin, `SELECT admitted FROM concurrency_limits WHERE kind = 'demo.sleep'`))
	require.Equal(t, 0, countOf(t, admin, `SELECT has_parked::int FROM concurrency_limits WHERE kind = 'demo.sleep'`))
	require.Equal(t, 1, countOf(t, admin, `SELECT count(*) FROM maintenance_runs
	                                        WHERE worker_id = 'dead' AND status = 'failed' AND details->>'error' = 'worker dead lost'`))
	require.Equal(t, 0, countOf(t, admin, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, deadPid),
		"the dead worker's backend is terminated")
	require.Equal(t, 1, countOf(t, admin, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, twinPid),
		"its namesake in another database is not")
	require.Equal(t, 1.0, testutil.ToFloat64(me.rp.metrics.workers))
	require.Equal(t, 1.0, testutil.ToFloat64(me.rp.metrics.jobs.WithLabelValues("demo.sleep", "retryable")))
	require.Equal(t, 1.0, testutil.ToFloat64(me.rp.metrics.slots.WithLabelValues("demo.sleep")))
	require.GreaterOrEqual(t, testutil.ToFloat64(me.rp.metrics.backends), 1.0)

	// The dead worker comes back: its heartbeat finds its row gone, and it
	// cannot open a connection any more.
	// (A first beat may fail on its terminated connection.)
	require.Eventually(t, func() bool { return errors.Is(dead.hb.beat(ctx), ErrReaped) }, 10*time.Second, 10*time.Millisecond)
	require.True(t, dead.live.isReaped())
	dead.pool.Reset()
	require.ErrorIs(t, dead.pool.Ping(ctx), ErrReaped)
	// The reaper's worker is still fine.
	require.NoError(t, me.hb.beat(ctx))
	require.NoError(t, me.pool.Ping(ctx))
}

// TestReaperNeverReapsItself: a reaper whose own row is stale (its worker
// was paused) reaps nothing, neither itself nor others, and a reaper never
// selects its own row.
func TestReaperNeverReapsItself(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.New(t)
	admin, err := pgkit.Open(ctx, url, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(admin.Close)

	me := newMember(t, url, "me", 400*time.Millisecond, time.Second)
	newMember(t, url, "other", 100*time.Millisecond, time.Second)
	mustExec(t, admin, `UPDATE sluice_workers SET heartbeat_at = now() - interval '1 hour'`)
	me.seasoned(time.Hour)
	n, err := me.rp.pass(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "a reaper whose own row is dead reaps nothing")
	require.Equal(t, 2, countOf(t, admin, `SELECT count(*) FROM sluice_workers`))

	// Its own row fresh again: it reaps the other one, never itself.
	require.NoError(t, me.hb.beat(ctx))
	me.seasoned(time.Hour)
	n, err = me.rp.pass(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	var left string
	require.NoError(t, admin.QueryRow(ctx, `SELECT id FROM sluice_workers`).Scan(&left))
	require.Equal(t, "me", left)

	// A gap in its own heartbeats (paused) ends its streak: nothing until
	// it has beaten again for dead-after.
	me.live.mu.Lock()
	me.live.lastBeat = time.Now().Add(-time.Second)
	me.live.mu.Unlock()
	require.Zero(t, me.live.streak(time.Now()))
	me.live.beatSucceeded(time.Now())
	require.Less(t, me.live.streak(time.Now()), 100*time.Millisecond)
}

// TestReapersRace: three reapers at once over many dead workers: each dead
// worker is reaped exactly once, each of its jobs rescued once.
func TestReapersRace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.New(t)
	admin, err := pgkit.Open(ctx, url, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(admin.Close)

	var reapers []*member
	for i := range 3 {
		m := newMember(t, url, fmt.Sprintf("reaper-%d", i), 100*time.Millisecond, time.Second)
		m.seasoned(time.Hour)
		reapers = append(reapers, m)
	}
	const deadWorkers = 12
	var jobIDs []int64
	for i := range deadWorkers {
		id := fmt.Sprintf("dead-%d", i)
		mustExec(t, admin, `INSERT INTO sluice_workers (id, host, pid, heartbeat_at, heartbeat_interval, dead_after)
		                    VALUES ($1, 'h', $2, now() - interval '1 hour', '100ms', '1s')`, id, i)
		for range 3 {
			jobIDs = append(jobIDs, insertJob(t, admin, "running", id))
		}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := 0
	for _, m := range reapers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				m.seasoned(time.Hour)
				n, err := m.rp.pass(ctx)
				if err != nil {
					t.Errorf("pass: %v", err)
					return
				}
				mu.Lock()
				total += n
				mu.Unlock()
				if countOf(t, admin, `SELECT count(*) FROM sluice_workers WHERE id LIKE 'dead-%'`) == 0 {
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	require.Equal(t, deadWorkers, total)
	require.Equal(t, 0, countOf(t, admin, `SELECT count(*) FROM sluice_workers WHERE id LIKE 'dead-%'`))
	require.Equal(t, len(jobIDs), countOf(t, admin, `
		SELECT count(*) FROM river_job
		WHERE state = 'retryable' AND cardinality(errors) = 1 AND (metadata->>'river:rescue_count')::int = 1`))
}

// gateArgs are demo.sleep args (a kind the reaper knows, so it retries the
// job), worked in these tests by a worker whose attempts block until the
// test opens their gate.
type gateArgs struct {
	MS int `json:"ms"`
}

func (gateArgs) Kind() string { return "demo.sleep" }

type gateWorker struct {
	river.WorkerDefaults[gateArgs]
	started chan int // attempt numbers
	release chan struct{}
}

func (w *gateWorker) Work(ctx context.Context, job *river.Job[gateArgs]) error {
	w.started <- job.Attempt
	<-w.release
	return nil
}

// startGateClient starts a River client with id on pool working gateArgs
// from queue.
func startGateClient(t *testing.T, pool *pgxpool.Pool, id, queue string) (*river.Client[pgx.Tx], *gateWorker) {
	t.Helper()
	gw := &gateWorker{started: make(chan int, 10), release: make(chan struct{})}
	workers := river.NewWorkers()
	river.AddWorker(workers, gw)
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Schema:                 pgkit.SchemasOf(pool).River,
		ID:                     id,
		FetchCooldown:          10 * time.Millisecond,
		FetchPollInterval:      20 * time.Millisecond,
		LeaderElectionDisabled: true,
		Logger:                 testlog.Logger(t),
		Queues:                 map[string]river.QueueConfig{queue: {MaxWorkers: 2}},
		TestOnly:               true,
		Workers:                workers,
	})
	require.NoError(t, err)
	require.NoError(t, client.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = client.StopAndCancel(ctx)
	})
	return client, gw
}

func waitStarted(t *testing.T, gw *gateWorker) int {
	t.Helper()
	select {
	case attempt := <-gw.started:
		return attempt
	case <-time.After(30 * time.Second):
		t.Fatal("job did not start")
		return 0
	}
}

// TestFenceDropsZombieCompletion runs River's own completer against the
// fence: worker Z works attempt 1 of a job, Z is reaped (the job rescued,
// Z's row gone), worker B works attempt 2; then Z's attempt 1 returns and
// River completes it (JobSetStateIfRunningMany updates any running job,
// whatever its attempt). With the fence the completion is dropped and B's
// attempt completes the job; without it (the trigger dropped), Z's late
// completion marks the job completed while B still works it.
func TestFenceDropsZombieCompletion(t *testing.T) {
	t.Parallel()
	for _, fenced := range []bool{true, false} {
		t.Run(fmt.Sprintf("fenced=%v", fenced), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			url := testdb.New(t)
			admin, err := pgkit.Open(ctx, url, 10*time.Second)
			require.NoError(t, err)
			t.Cleanup(admin.Close)
			if !fenced {
				mustExec(t, admin, `DROP TRIGGER sluice_worker_fence ON river_job`)
			}
			z := newMember(t, url, "zombie", 100*time.Millisecond, time.Second)
			b := newMember(t, url, "b", 100*time.Millisecond, time.Second)
			// Z's connections stay usable after its reap (no connection
			// check): only the trigger stands between it and the job.
			z.live.registered.Store(false)

			zClient, zGate := startGateClient(t, z.pool, "zombie", river.QueueDefault)
			inserter, err := river.NewClient(riverpgxv5.New(admin), &river.Config{Schema: pgkit.SchemasOf(admin).River})
			require.NoError(t, err)
			res, err := inserter.Insert(ctx, gateArgs{}, &river.InsertOpts{MaxAttempts: 5})
			require.NoError(t, err)
			job := res.Job.ID
			require.Equal(t, 1, waitStarted(t, zGate))

			// Reap Z (as a reaper on B would) and make the job available,
			// in a queue only B works.
			mustExec(t, admin, `UPDATE sluice_workers SET heartbeat_at = now() - interval '1 hour' WHERE id = 'zombie'`)
			b.seasoned(time.Hour)
			n, err := b.rp.pass(ctx)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			require.Equal(t, "retryable", jobStateOf(t, admin, job))
			mustExec(t, admin, `UPDATE river_job SET state = 'available', queue = 'b' WHERE id = $1`, job)

			_, bGate := startGateClient(t, b.pool, "b", "b")
			require.Equal(t, 2, waitStarted(t, bGate))

			// Z's attempt 1 returns; stopping Z's client flushes River's
			// completion of it.
			close(zGate.release)
			stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			require.NoError(t, zClient.Stop(stopCtx))

			var state string
			var attempt int
			var by []string
			require.NoError(t, admin.QueryRow(ctx, `SELECT state::text, attempt, attempted_by FROM river_job WHERE id = $1`, job).
				Scan(&state, &attempt, &by))
			require.Equal(t, []string{"zombie", "b"}, by)
			require.Equal(t, 2, attempt)
			if !fenced {
				require.Equal(t, "completed", state, "River's completion overwrites the attempt running on B")
				return
			}
			require.Equal(t, "running", state, "the zombie's completion is dropped")
			close(bGate.release)
			require.Eventually(t, func() bool { return jobStateOf(t, admin, job) == "completed" }, 30*time.Second, 20*time.Millisecond)
		})
	}
}

// TestFenceRules: which sessions the fence stops. A reaped worker's session
// may neither finish a job whose current attempt is another worker's nor
// free another worker's (or a resumed job's) slot; it may finish its own
// current attempt and free its own slot. Registered workers (River's
// rescuer, the reaper) and sessions that name no worker (CLI, psql) are
// never stopped. A process that reused the id with a new incarnation does
// not make the old one's sessions valid.
func TestFenceRules(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.New(t)
	admin, err := pgkit.Open(ctx, url, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(admin.Close)

	z := newMember(t, url, "z", 100*time.Millisecond, time.Second)
	b := newMember(t, url, "b", 100*time.Millisecond, time.Second)
	z.live.registered.Store(false) // keep its connections usable
	mustExec(t, admin, `DELETE FROM sluice_workers WHERE id = 'z'`)

	complete := func(pool *pgxpool.Pool, id int64) {
		t.Helper()
		mustExec(t, pool, `UPDATE river_job SET state = 'completed', finalized_at = now() WHERE id = $1 AND state = 'running'`, id)
	}
	bJob := insertJob(t, admin, "running", "z", "b")
	complete(z.pool, bJob)
	require.Equal(t, "running", jobStateOf(t, admin, bJob), "a reaped worker cannot finish another worker's attempt")
	zJob := insertJob(t, admin, "running", "z")
	complete(z.pool, zJob)
	require.Equal(t, "completed", jobStateOf(t, admin, zJob), "its own current attempt it may finish")
	complete(b.pool, bJob)
	require.Equal(t, "completed", jobStateOf(t, admin, bJob))
	other := insertJob(t, admin, "running", "b")
	complete(admin, other)
	require.Equal(t, "completed", jobStateOf(t, admin, other), "a session naming no worker is not fenced")
	rescued := insertJob(t, admin, "running", "gone")
	mustExec(t, b.pool, `UPDATE river_job SET state = 'retryable' WHERE id = $1`, rescued)
	require.Equal(t, "retryable", jobStateOf(t, admin, rescued), "a live worker may rescue another's job")

	j1, j2, j3 := insertJob(t, admin, "running", "z", "b"), insertJob(t, admin, "running", "z"), insertJob(t, admin, "running", "c")
	mustExec(t, admin, `INSERT INTO concurrency_executions (job_id, kind, worker_id, reserved)
	                    VALUES ($1, 'demo.sleep', 'b', false), ($2, 'demo.sleep', 'z', false), ($3, 'demo.sleep', 'c', false)`, j1, j2, j3)
	deleteSlots := func(pool *pgxpool.Pool, ids ...int64) []int64 {
		t.Helper()
		rows, err := pool.Query(ctx, "DELETE FROM concurrency_executions WHERE job_id = ANY($1) RETURNING job_id", ids)
		require.NoError(t, err)
		deleted, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		return deleted
	}
	require.Equal(t, []int64{j2}, deleteSlots(z.pool, j1, j2), "the reaped worker frees only its own slot, not the next attempt's")
	require.Len(t, deleteSlots(b.pool, j1, j3), 2, "a live worker frees its own slot and another's")

	// The id reused by a new process: the old incarnation stays fenced.
	mustExec(t, admin, `INSERT INTO sluice_workers (id, incarnation, host, pid, heartbeat_interval) VALUES ('z', 'new', 'h', 1, '1s')`)
	again := insertJob(t, admin, "running", "z", "b")
	complete(z.pool, again)
	require.Equal(t, "running", jobStateOf(t, admin, again))
}

// TestAfterConnectWaitsForReap: a reap in progress blocks the dead
// worker's new connections, which are refused once it commits.
func TestAfterConnectWaitsForReap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.New(t)
	admin, err := pgkit.Open(ctx, url, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(admin.Close)
	z := newMember(t, url, "z", 100*time.Millisecond, time.Second)

	tx, err := admin.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM sluice_workers WHERE id = 'z' FOR UPDATE`)
	require.NoError(t, err)
	z.pool.Reset()
	pinged := make(chan error, 1)
	go func() { pinged <- z.pool.Ping(ctx) }()
	select {
	case err := <-pinged:
		t.Fatalf("a connection of the worker being reaped was opened: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	_, err = tx.Exec(ctx, `DELETE FROM sluice_workers WHERE id = 'z'`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	select {
	case err := <-pinged:
		require.True(t, errors.Is(err, ErrReaped), "%v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the connection attempt did not end")
	}
	require.True(t, z.live.isReaped())
}

// TestReapChecksInsideItsTransaction: a reaper that found a worker dead, but
// whose reap begins after that worker heartbeated again (its pool was
// starved for a while, say), leaves it alone: the row is checked dead in
// the reap's own transaction before any of its backends is terminated.
func TestReapChecksInsideItsTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.New(t)
	admin, err := pgkit.Open(ctx, url, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(admin.Close)

	me := newMember(t, url, "me", 100*time.Millisecond, time.Second)
	me.seasoned(time.Minute)
	alive := newMember(t, url, "alive", 100*time.Millisecond, time.Second)
	conn, err := alive.pool.Acquire(ctx)
	require.NoError(t, err)
	var pid int
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	conn.Release()
	job := insertJob(t, admin, "running", "alive")

	// What DeadWorkers returned a moment ago; the worker has heartbeated
	// since (its row is fresh).
	require.NoError(t, alive.hb.beat(ctx))
	reaped, err := me.rp.reap(ctx, deadWorker{ID: "alive", Incarnation: alive.live.incarnation, BackendName: alive.live.backendName})
	require.NoError(t, err)
	require.False(t, reaped)
	require.Equal(t, 1, countOf(t, admin, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid), "its backend was not terminated")
	require.Equal(t, 1, countOf(t, admin, `SELECT count(*) FROM sluice_workers WHERE id = 'alive'`))
	require.Equal(t, "running", jobStateOf(t, admin, job))
	require.NoError(t, alive.hb.beat(ctx), "the worker goes on")
}

// TestReapResignsDeadLeader: a dead worker that was River's leader holds
// the leader row until its term expires (River's leader TTL, 15s; here an
// hour), and with it River's leader-only maintenance, among which the
// scheduler that makes the jobs a reap rescued available. The reap resigns
// its leadership as River's client would: the row goes and the resignation
// is announced, so that a live worker's elector (a River client denied the
// leadership until then) takes over at once. The leadership of a worker
// that is not reaped is left alone.
func TestReapResignsDeadLeader(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.New(t)
	admin, err := pgkit.Open(ctx, url, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(admin.Close)

	me := newMember(t, url, "me", 100*time.Millisecond, time.Second)
	newMember(t, url, "dead", 100*time.Millisecond, time.Second)
	mustExec(t, admin, `INSERT INTO river_leader (elected_at, expires_at, leader_id) VALUES (now(), now() + interval '1 hour', 'dead')`)

	// A live worker's River client, with leader election: denied while the
	// dead worker's term lasts.
	workers := river.NewWorkers()
	river.AddWorker(workers, &gateWorker{started: make(chan int, 1), release: make(chan struct{})})
	client, err := river.NewClient(riverpgxv5.New(admin), &river.Config{
		Schema:   pgkit.SchemasOf(admin).River,
		ID:       "follower",
		Logger:   testlog.Logger(t),
		Queues:   map[string]river.QueueConfig{"leadership_test": {MaxWorkers: 1}},
		TestOnly: true,
		Workers:  workers,
	})
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = client.Stop(stopCtx)
	})
	time.Sleep(500 * time.Millisecond) // its first bid, denied
	require.Equal(t, 1, countOf(t, admin, `SELECT count(*) FROM river_leader WHERE leader_id = 'dead'`))

	channel := pgkit.SchemasOf(admin).River + ".river_leadership"
	listener, err := admin.Acquire(ctx)
	require.NoError(t, err)
	defer listener.Release()
	_, err = listener.Exec(ctx, `LISTEN `+pgx.Identifier{channel}.Sanitize())
	require.NoError(t, err)

	mustExec(t, admin, `UPDATE sluice_workers SET heartbeat_at = now() - interval '1 hour' WHERE id = 'dead'`)
	require.NoError(t, me.hb.beat(ctx)) // the reaper's own row alive
	me.seasoned(time.Hour)
	n, err := me.rp.pass(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Zero(t, countOf(t, admin, `SELECT count(*) FROM river_leader WHERE leader_id = 'dead'`), "the dead leader's row is gone")
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	note, err := listener.Conn().WaitForNotification(waitCtx)
	require.NoError(t, err, "the resignation is announced")
	require.Equal(t, channel, note.Channel)
	require.JSONEq(t, `{"leader_id": "dead", "action": "resigned"}`, note.Payload)
	require.Eventually(t, func() bool {
		return countOf(t, admin, `SELECT count(*) FROM river_leader WHERE leader_id = 'follower'`) == 1
	}, 30*time.Second, 10*time.Millisecond, "the live worker's elector takes the leadership on the resignation")

	// Another dead worker's reap leaves the live leader alone.
	newMember(t, url, "dead2", 100*time.Millisecond, time.Second)
	mustExec(t, admin, `UPDATE sluice_workers SET heartbeat_at = now() - interval '1 hour' WHERE id = 'dead2'`)
	require.NoError(t, me.hb.beat(ctx))
	me.seasoned(time.Hour)
	n, err = me.rp.pass(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, 1, countOf(t, admin, `SELECT count(*) FROM river_leader WHERE leader_id = 'follower'`))
}
