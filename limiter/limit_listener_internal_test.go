package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/testdb"
)

// TestLimitChangeReachesTheWorkerByNotification: a worker's copy of the
// limits is expired the moment a kind's limits change, whether by the CLI's
// limiter or by plain SQL, so that its next job follows them: the worker
// hears of each change (LimitsChanged) and reads the new limits, without
// waiting for its copy's LimitCacheTTL.
func TestLimitChangeReachesTheWorkerByNotification(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.New(t)
	pool, err := db.Open(ctx, url, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	worker, err := New(Config{Pool: pool, WorkerID: "w"})
	require.NoError(t, err)
	worker.TestSignals.Init(t)
	t.Cleanup(worker.Flush)
	admin, err := New(Config{Pool: pool, WorkerID: "cli"})
	require.NoError(t, err)

	_, ok, err := worker.stateOf(ctx, "test.k")
	require.NoError(t, err)
	require.False(t, ok, "no limit yet")
	worker.TestSignals.LimitsListening.WaitOrTimeout()

	require.NoError(t, admin.SetConcurrency(ctx, "test.k", 3))
	require.Equal(t, "test.k", worker.TestSignals.LimitsChanged.WaitOrTimeout())
	c := worker.cache.Load()
	require.True(t, c.loaded.IsZero(), "the copy is expired at once")
	st, ok, err := worker.stateOf(ctx, "test.k")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int32(3), st.limit)

	_, err = pool.Exec(ctx, "UPDATE concurrency_limits SET max_concurrency = -1 WHERE kind = 'test.k'")
	require.NoError(t, err)
	require.Equal(t, "test.k", worker.TestSignals.LimitsChanged.WaitOrTimeout())
	st, _, err = worker.stateOf(ctx, "test.k")
	require.NoError(t, err)
	require.Equal(t, int32(-1), st.limit, "a change in plain SQL is heard too")

	_, err = admin.ClearLimits(ctx, "test.k", Facets{})
	require.NoError(t, err)
	require.Equal(t, "test.k", worker.TestSignals.LimitsChanged.WaitOrTimeout())
	_, ok, err = worker.stateOf(ctx, "test.k")
	require.NoError(t, err)
	require.False(t, ok, "cleared")
}
