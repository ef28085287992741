package app_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/limiter"
	"github.com/sluice-dev/sluice/modules/demo"
)

func TestRunOne(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	cfg := app.Config{Modules: jobtest.Modules(), DatabaseURL: url, Logger: jobtest.Logger(t)}

	t.Run("completes", func(t *testing.T) {
		t.Parallel()
		res, err := app.RunOne(ctx, cfg, demo.SleepArgs{MS: 10}, app.RunOptions{})
		require.NoError(t, err)
		require.True(t, res.Succeeded())
		require.Equal(t, "demo.sleep", res.Kind)
		require.Nil(t, res.Maintenance)
		require.Equal(t, rivertype.JobStateCompleted, jobState(t, url, res.JobID))
	})

	t.Run("cancelled context cancels the job", func(t *testing.T) {
		t.Parallel()
		runCtx, cancel := context.WithCancel(ctx)
		cancel()
		_, err := app.RunOne(runCtx, cfg, demo.SleepArgs{MS: 60_000}, app.RunOptions{})
		require.Error(t, err)
	})

	t.Run("unmigrated database", func(t *testing.T) {
		t.Parallel()
		_, err := app.RunOne(ctx, app.Config{Modules: jobtest.Modules(), DatabaseURL: testdb.NewEmpty(t)}, demo.SleepArgs{}, app.RunOptions{})
		require.ErrorContains(t, err, "sluice migrate up")
	})
}

// TestRunOneLimitChangedAfterReservation: a run whose reserved slot is lost
// before its job starts (here a trigger turns the kind's limit into a
// circuit breaker the moment the slot is reserved) fails the job instead of
// parking it where nothing would ever run it, and leaves nothing behind.
func TestRunOneLimitChangedAfterReservation(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	pool, err := pgkit.Open(ctx, url, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	for _, sql := range []string{
		`INSERT INTO concurrency_limits (kind, max_concurrency) VALUES ('demo.sleep', 1)`,
		`CREATE FUNCTION test_break() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN
		     UPDATE concurrency_limits SET max_concurrency = -1 WHERE kind = NEW.kind;
		     RETURN NULL;
		 END $$`,
		`CREATE TRIGGER test_break AFTER INSERT ON concurrency_executions FOR EACH ROW WHEN (NEW.reserved) EXECUTE FUNCTION test_break()`,
	} {
		_, err = pool.Exec(ctx, sql)
		require.NoError(t, err)
	}
	runCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	res, err := app.RunOne(runCtx, app.Config{Modules: jobtest.Modules(), DatabaseURL: url, Logger: jobtest.Logger(t)}, demo.SleepArgs{MS: 1}, app.RunOptions{})
	require.NoError(t, err, "run returns, it does not hang")
	require.False(t, res.Succeeded())
	require.Contains(t, res.Error, "no concurrency slot free")
	var parked, slots, pending int
	require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM concurrency_parked_jobs),
		(SELECT count(*) FROM concurrency_executions), (SELECT count(*) FROM river_job WHERE state = 'pending')`).Scan(&parked, &slots, &pending))
	require.Zero(t, parked)
	require.Zero(t, slots, "no slot left reserved")
	require.Zero(t, pending)
}

// TestRunOneDuplicate: RunOne of a job River skips as the duplicate of a
// waiting one (the kind's unique options) returns a *DuplicateJobError
// naming that job, without waiting for it, and leaves it as it is.
func TestRunOneDuplicate(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	pool := testPool(t, url)
	client, err := app.NewInsertClient(pool, nil)
	require.NoError(t, err)
	waiting, err := client.Insert(ctx, limiter.ResumeArgs{JobKind: "demo.sleep"}, &river.InsertOpts{ScheduledAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	before := testdb.Checksum(t, pool, "river_job")

	runCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	_, err = app.RunOne(runCtx, app.Config{Modules: jobtest.Modules(), DatabaseURL: url, Logger: jobtest.Logger(t)},
		limiter.ResumeArgs{JobKind: "demo.sleep"}, app.RunOptions{})
	var dup *app.DuplicateJobError
	require.ErrorAs(t, err, &dup)
	require.Equal(t, waiting.Job.ID, dup.Job.ID)
	require.Equal(t, rivertype.JobStateScheduled, dup.Job.State)
	require.Equal(t, before, testdb.Checksum(t, pool, "river_job"), "nothing inserted, nothing changed")
	// Run returned at once, its limiter's listener still connecting or just
	// connected: it stops with run, and none of run's connections stays
	// (one left listening logged "listener lost its connection" as the
	// pool closed under it).
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name LIKE 'sluice run%'`).Scan(&n))
		return n == 0
	}, 10*time.Second, 10*time.Millisecond, "run's connections are closed when it returns")
}

// toQueue is a program's insert middleware that puts every job in queue.
type toQueue struct {
	river.MiddlewareDefaults
	queue string
}

func (m *toQueue) InsertMany(ctx context.Context, manyParams []*rivertype.JobInsertParams,
	doInner func(context.Context) ([]*rivertype.JobInsertResult, error),
) ([]*rivertype.JobInsertResult, error) {
	for _, p := range manyParams {
		p.Queue = m.queue
	}
	return doInner(ctx)
}

// TestRunOneJobMovedOutOfItsQueue: a job the program's insert middleware
// inserts into another queue than RunOne's private one, which nothing here
// works, is deleted unrun, and RunOne says so instead of waiting for it.
func TestRunOneJobMovedOutOfItsQueue(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	pool := testPool(t, url)
	cfg := app.Config{Modules: jobtest.Modules(), DatabaseURL: url, Logger: jobtest.Logger(t)}
	cfg.River = func(c *river.Config) {
		c.Middleware = append(c.Middleware, &toQueue{queue: "elsewhere"})
	}
	runCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	_, err := app.RunOne(runCtx, cfg, demo.SleepArgs{MS: 1}, app.RunOptions{})
	require.ErrorContains(t, err, "was inserted into queue elsewhere, not run's own (the program's insert middleware moved it): deleted unrun")
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM river_job`).Scan(&n))
	require.Zero(t, n)
}

// TestRunOneTimeout: RunOptions.Timeout bounds RunOne; its error says what
// RunOne was waiting for, and the job is cancelled.
func TestRunOneTimeout(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	pool := testPool(t, url)
	_, err := app.RunOne(context.Background(), app.Config{Modules: jobtest.Modules(), DatabaseURL: url, Logger: jobtest.Logger(t)},
		demo.SleepArgs{MS: 3_600_000}, app.RunOptions{Timeout: 5 * time.Second})
	require.Error(t, err)
	require.Regexp(t, `^gave up after --timeout 5s waiting for job \d+ of demo\.sleep to (start|finish) \(.+\); job cancelled$`, err.Error())
	var state string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT state::text FROM river_job WHERE kind = 'demo.sleep'`).Scan(&state))
	require.Contains(t, []string{"cancelled", "discarded"}, state)

	_, err = app.RunOne(context.Background(), app.Config{Modules: jobtest.Modules(), DatabaseURL: url}, demo.SleepArgs{},
		app.RunOptions{Timeout: -time.Second})
	require.ErrorContains(t, err, "run timeout must not be negative")
}

// testPool is a pool on url, closed when t ends.
func testPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgkit.Open(context.Background(), url, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}
