package app_test

import (
	"context"
	"testing"
	"time"

	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
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
	pool, err := db.Open(ctx, url, 10*time.Second)
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
