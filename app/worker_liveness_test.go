package app_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/liveness"
	"github.com/sluice-dev/sluice/modules/demo"
)

const (
	testBeat      = 100 * time.Millisecond
	testDeadAfter = 400 * time.Millisecond
)

// runningWorker is a worker running in the background.
type runningWorker struct {
	*app.Worker
	done chan struct{}
	err  error
}

// runWorker starts a worker; it is stopped when t ends.
func runWorker(t *testing.T, cfg app.Config) *runningWorker {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = jobtest.Logger(t)
	}
	w, err := app.NewWorker(context.Background(), cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	rw := &runningWorker{Worker: w, done: make(chan struct{})}
	go func() {
		rw.err = w.Run(ctx)
		close(rw.done)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-rw.done:
		case <-time.After(time.Minute):
		}
	})
	return rw
}

func (rw *runningWorker) ended() bool {
	select {
	case <-rw.done:
		return true
	default:
		return false
	}
}

// wait waits for Run to return and returns its error.
func (rw *runningWorker) wait(t *testing.T) error {
	t.Helper()
	select {
	case <-rw.done:
		return rw.err
	case <-time.After(time.Minute):
		t.Fatal("worker did not return within a minute")
		return nil
	}
}

func waitRegistered(t *testing.T, pool *pgxpool.Pool, rw *runningWorker) {
	t.Helper()
	require.Eventually(t, func() bool {
		if rw.ended() {
			t.Fatalf("worker %s ended: %v", rw.ID(), rw.err)
		}
		return countRows(t, pool, `SELECT count(*) FROM sluice_workers WHERE id = $1`, rw.ID()) == 1
	}, 30*time.Second, 10*time.Millisecond)
}

func countRows(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// TestWorkerExitsWhenReaped: a worker whose row disappears (a reaper
// declared it dead) stops with ErrReaped and does not put its row back.
func TestWorkerExitsWhenReaped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.New(t)
	pool := openPool(t, url)
	w := runWorker(t, app.Config{Modules: jobtest.Modules(), DatabaseURL: url, ID: "victim", HeartbeatInterval: testBeat, DeadAfter: testDeadAfter})
	waitRegistered(t, pool, w)
	id := insert(t, url, demo.SleepArgs{MS: 60_000})
	waitState(t, url, id, rivertype.JobStateRunning)

	var incarnation, backend string
	require.NoError(t, pool.QueryRow(ctx, `SELECT incarnation, backend_name FROM sluice_workers WHERE id = $1`, w.ID()).
		Scan(&incarnation, &backend))
	require.NotEmpty(t, incarnation)
	require.Equal(t, liveness.WorkerAppName(w.ID()), backend)
	require.Positive(t, countRows(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1`, backend))

	_, err := pool.Exec(ctx, `DELETE FROM sluice_workers WHERE id = $1`, w.ID())
	require.NoError(t, err)
	require.ErrorIs(t, w.wait(t), app.ErrReaped)
	require.Equal(t, 0, countRows(t, pool, `SELECT count(*) FROM sluice_workers`), "the reaped worker does not register again")
}

// TestWorkerLeavesRowForReaper: a worker that stops while a job ignores
// its cancellation leaves its row, so that a live worker's reaper rescues
// the job once the row counts as dead; the job then completes on the live
// worker.
func TestWorkerLeavesRowForReaper(t *testing.T) {
	t.Parallel()
	url := testdb.New(t)
	pool := openPool(t, url)
	cfg := app.Config{Modules: jobtest.Modules(), DatabaseURL: url, HeartbeatInterval: testBeat, DeadAfter: testDeadAfter,
		ShutdownTimeout: 100 * time.Millisecond, HardStopGrace: 100 * time.Millisecond}
	first := cfg
	first.ID = "first"
	ctx, cancel := context.WithCancel(context.Background())
	first.Logger = jobtest.Logger(t)
	w, err := app.NewWorker(ctx, first)
	require.NoError(t, err)
	rw := &runningWorker{Worker: w, done: make(chan struct{})}
	go func() {
		rw.err = w.Run(ctx)
		close(rw.done)
	}()
	waitRegistered(t, pool, rw)
	id := insert(t, url, demo.SleepArgs{MS: 2000, IgnoreCancel: true})
	waitState(t, url, id, rivertype.JobStateRunning)
	cancel()
	require.NoError(t, rw.wait(t))
	require.Equal(t, 1, countRows(t, pool, `SELECT count(*) FROM sluice_workers WHERE id = 'first'`),
		"a job still running: the row stays for a reaper")

	second := cfg
	second.ID = "second"
	waitRegistered(t, pool, runWorker(t, second))
	require.Eventually(t, func() bool {
		return countRows(t, pool, `SELECT count(*) FROM sluice_workers WHERE id = 'first'`) == 0
	}, 30*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		return countRows(t, pool, `
			SELECT count(*) FROM river_job
			WHERE id = $1 AND state = 'completed' AND attempted_by = '{first,second}'
			  AND errors[1]->>'error' = 'worker first lost'`, id) == 1
	}, 60*time.Second, 20*time.Millisecond)
}

// TestWorkerTakesOverItsID: a worker started with the id of a dead one
// (a supervisor restarting it with the same --id) waits until that row
// counts as dead, reaps it itself (its job is rescued and worked again) and
// registers with a new incarnation; an id in use by a live worker is
// refused.
func TestWorkerTakesOverItsID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.New(t)
	pool := openPool(t, url)
	_, err := pool.Exec(ctx, `
		INSERT INTO sluice_workers (id, incarnation, host, pid, heartbeat_at, heartbeat_interval, dead_after)
		VALUES ('fixed', 'old', 'h', 1, now(), '100ms', '400ms')`)
	require.NoError(t, err)
	var job int64
	require.NoError(t, pool.QueryRow(ctx, `
		INSERT INTO river_job (args, kind, max_attempts, state, queue, attempt, attempted_at, attempted_by)
		VALUES ('{"ms": 1}', 'demo.sleep', 5, 'running', 'default', 1, now(), '{fixed}')
		RETURNING id`).Scan(&job))

	cfg := app.Config{Modules: jobtest.Modules(), DatabaseURL: url, ID: "fixed", HeartbeatInterval: testBeat, DeadAfter: testDeadAfter}
	live := runWorker(t, cfg)
	require.Eventually(t, func() bool {
		return countRows(t, pool, `SELECT count(*) FROM sluice_workers WHERE id = 'fixed' AND incarnation <> 'old'`) == 1
	}, 30*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		return countRows(t, pool, `
			SELECT count(*) FROM river_job
			WHERE id = $1 AND state = 'completed' AND attempt = 2 AND errors[1]->>'error' = 'worker fixed lost'`, job) == 1
	}, 60*time.Second, 20*time.Millisecond)

	// A second process with the same id while the first is alive.
	dup := runWorker(t, cfg)
	require.ErrorContains(t, dup.wait(t), `worker id "fixed" is in use by a live worker`)
	require.False(t, live.ended(), "the live worker goes on")
}

// TestDeadAfterDefaultMatchesMigration: a row inserted without dead_after
// (by hand, or by a worker of an older version) gets the code's default.
func TestDeadAfterDefaultMatchesMigration(t *testing.T) {
	t.Parallel()
	pool := testdb.NewPool(t)
	_, err := pool.Exec(context.Background(), `INSERT INTO sluice_workers (id, host, pid, heartbeat_interval) VALUES ('w', 'h', 1, '5s')`)
	require.NoError(t, err)
	var seconds float64
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT extract(epoch FROM dead_after) FROM sluice_workers`).Scan(&seconds))
	require.Equal(t, app.DefaultDeadAfter.Seconds(), seconds)
	require.GreaterOrEqual(t, app.DefaultDeadAfter, app.MinDeadAfterBeats*app.DefaultHeartbeatInterval)
}

// TestStarvedPoolIsNotReaped: jobs that hold every connection of a worker's
// pool for longer than its dead-after (long transactions) do not make its
// heartbeat go stale: the heartbeat and the reaper have a pool of their
// own, so another worker never reaps a worker that is alive.
func TestStarvedPoolIsNotReaped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.New(t)
	pool := openPool(t, url)
	starved := runWorker(t, app.Config{Modules: jobtest.Modules(), DatabaseURL: testdb.WithParam(url, "pool_max_conns", "4"), ID: "starved",
		HeartbeatInterval: testBeat, DeadAfter: testDeadAfter})
	waitRegistered(t, pool, starved)
	other := runWorker(t, app.Config{Modules: jobtest.Modules(), DatabaseURL: url, ID: "other",
		HeartbeatInterval: testBeat, DeadAfter: testDeadAfter})
	waitRegistered(t, pool, other)

	// Take every connection of the starved worker's main pool, as jobs in
	// long transactions would.
	var held []*pgxpool.Conn
	for range 4 {
		conn, err := starved.Pool().Acquire(ctx)
		require.NoError(t, err)
		held = append(held, conn)
	}
	defer func() {
		for _, c := range held {
			c.Release()
		}
	}()
	beat := func() time.Time {
		var at time.Time
		require.NoError(t, pool.QueryRow(ctx, `SELECT heartbeat_at FROM sluice_workers WHERE id = 'starved'`).Scan(&at))
		return at
	}
	first := beat()
	// Five dead-afters: long enough for the other worker's reaper (every
	// heartbeat interval) to reap a worker whose heartbeat stalled.
	deadline := time.Now().Add(5 * testDeadAfter)
	for time.Now().Before(deadline) {
		require.Equal(t, 1, countRows(t, pool, `SELECT count(*) FROM sluice_workers WHERE id = 'starved'`), "the starved worker was reaped")
		require.False(t, starved.ended(), "the starved worker stopped: %v", starved.err)
		time.Sleep(testBeat)
	}
	require.True(t, beat().After(first), "the starved worker kept heartbeating")
	// Both heartbeat within their dead-after (a beat may come late for a
	// moment on a loaded machine: the reaper allows for that, see above).
	require.Eventually(t, func() bool {
		return countRows(t, pool, `SELECT count(*) FROM sluice_workers WHERE heartbeat_at < now() - dead_after`) == 0
	}, 5*time.Second, testBeat/2, "a worker's heartbeat stalled")
}
