package limiter

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
)

// TestAFetchUnderARateHoldsNoStartBack: a fetch that lost jobs to parking
// fetches again (a backlog is worked through in few of River's fetch
// cycles), but not once it keeps a job whose start its rate window logged
// at its decision: held back, the job would begin later than its window
// counts it (the rate's stated tolerance is 150 ms; a fetch may fetch
// again for 200 ms). Here key a's job starts at once and key b's backlog,
// its window full, parks: the fetch returns after its first round, with
// the one job and a fetch's worth of b's jobs parked.
func TestAFetchUnderARateHoldsNoStartBack(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	pool, err := pgkit.Open(ctx, url, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	const kind = "test.fetch.rate"
	l, err := New(Config{Pool: pool, WorkerID: "fetch-a", ParkAfter: 20 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(l.Flush)
	require.NoError(t, l.SetRate(ctx, kind, Rate{Max: 1, Per: time.Minute, PerKey: true}, []string{"tenant"}))

	// Key b's window is full: one of its jobs started just now.
	insert := func(tenant string, n int) {
		t.Helper()
		_, err := pool.Exec(ctx, `INSERT INTO river_job (args, kind, max_attempts, state, queue)
			SELECT jsonb_build_object('tenant', $1::text), $2, 5, 'available', 'default' FROM generate_series(1, $3)`, tenant, kind, n)
		require.NoError(t, err)
	}
	_, err = pool.Exec(ctx, `INSERT INTO concurrency_starts (kind, key, job_id, started_at) VALUES ($1, '"b"', 0, now())`, kind)
	require.NoError(t, err)
	insert("a", 1)
	insert("b", 200)

	const batch = 10
	exec := l.Driver(riverpgxv5.New(pool), []string{kind}).GetExecutor()
	res, err := exec.JobGetAvailable(ctx, &riverdriver.JobGetAvailableParams{ClientID: "fetch-a", Kind: []string{kind},
		MaxAttemptedBy: 100, MaxToLock: batch, Queue: "default", Schema: ""})
	require.NoError(t, err)
	var got []string
	for _, j := range res.Jobs {
		got = append(got, fmt.Sprintf("%d %s", j.ID, j.EncodedArgs))
	}
	require.Len(t, res.Jobs, 1, "the fetch kept %v", got)
	var parked int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM concurrency_parked_jobs WHERE kind = $1`, kind).Scan(&parked))
	require.Equal(t, batch-1, parked, "the fetch fetched again while it held a job whose start was logged")
}
