package e2e_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/modules/demo"
)

// Load test sizes: `make e2e` runs the 100,000 jobs; `make test`
// (and a plain `go test`) a tenth of them, the same scenario at CI's pace.
// SLUICE_E2E_LOAD_JOBS overrides both.
const (
	fullLoadJobs    = 100_000
	defaultLoadJobs = 10_000
	loadLimit       = 8
)

// loadJobs is the number of jobs TestLoadThroughLimit pushes through.
func loadJobs(t *testing.T) int {
	t.Helper()
	v := os.Getenv("SLUICE_E2E_LOAD_JOBS")
	if v == "" {
		return defaultLoadJobs
	}
	if v == "full" {
		return fullLoadJobs
	}
	n, err := strconv.Atoi(v)
	require.NoError(t, err, "SLUICE_E2E_LOAD_JOBS")
	require.Positive(t, n, "SLUICE_E2E_LOAD_JOBS")
	return n
}

// TestLoadThroughLimit pushes demo.sleep jobs of 0 ms (100,000 under `make
// e2e`) through the kind's limit of 8 with two worker processes: most are
// parked and resumed, yet every job completes exactly once (each carries a
// sequence number in its metadata, which parking and resuming keep), none is
// lost, none is left parked or holding a slot, and the limit holds
// throughout. It logs how long the load took.
func TestLoadThroughLimit(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	n := loadJobs(t)
	h := newHarness(t, testdb.New(t))
	h.ok("limits", "set", "demo.sleep", strconv.Itoa(loadLimit))

	inserter, err := app.NewInsertClient(h.pool, nil)
	require.NoError(t, err)
	const batch = 10_000
	for start := 0; start < n; start += batch {
		params := make([]river.InsertManyParams, 0, batch)
		for i := start; i < min(start+batch, n); i++ {
			params = append(params, river.InsertManyParams{
				Args:       demo.SleepArgs{},
				InsertOpts: &river.InsertOpts{Metadata: fmt.Appendf(nil, `{"e2e_seq": %d}`, i)},
			})
		}
		_, err := inserter.InsertManyFast(ctx, params)
		require.NoError(t, err)
	}
	slots := h.sampleMax(`SELECT (SELECT count(*) FROM concurrency_executions WHERE kind = 'demo.sleep') + (SELECT COALESCE(sum(slots), 0) FROM concurrency_leases WHERE kind = 'demo.sleep')`, 50*time.Millisecond)

	start := time.Now()
	h.worker("load-0")
	h.worker("load-1")
	done := func() bool {
		return h.count(`SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND state = 'completed'`) >= int64(n)
	}
	deadline := time.Now().Add(time.Duration(n)*10*time.Millisecond + 5*time.Minute)
	for !done() {
		require.True(t, time.Now().Before(deadline), "%d jobs not done by the deadline: %d completed, %d parked", n,
			h.count(`SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND state = 'completed'`),
			h.count(`SELECT count(*) FROM concurrency_parked_jobs`))
		time.Sleep(time.Second)
	}
	elapsed := time.Since(start)

	var worked, distinct, wrong int64
	require.NoError(t, h.pool.QueryRow(ctx, `
		SELECT count(*), count(DISTINCT (metadata->>'e2e_seq')::int),
		       count(*) FILTER (WHERE (metadata->>'e2e_seq')::int NOT BETWEEN 0 AND $1 - 1)
		FROM river_job WHERE kind = 'demo.sleep' AND state = 'completed'`, n).
		Scan(&worked, &distinct, &wrong))
	require.Equal(t, int64(n), worked, "every job completed once")
	require.Equal(t, int64(n), distinct, "no job completed twice")
	require.Zero(t, wrong)
	require.Zero(t, h.count(`SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND state <> 'completed'`), "no job failed or is left over")
	require.Zero(t, h.count(`SELECT count(*) FROM concurrency_parked_jobs`), "none parked at the end")
	h.eventually(time.Minute, func() bool {
		return h.count(`SELECT (SELECT count(*) FROM concurrency_executions) + (SELECT COALESCE(sum(slots), 0) FROM concurrency_leases)`) == 0
	},
		"slots still taken after the load")
	require.LessOrEqual(t, slots.Stop(), int64(loadLimit), "the limit held")
	// Parking leaves no trace on a resumed job's row: count the parking
	// records ever inserted instead (Postgres' statistics, flushed within a
	// second or so).
	time.Sleep(1500 * time.Millisecond)
	parked := h.count(`SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = 'concurrency_parked_jobs'`)
	t.Logf("%d jobs through a limit of %d on 2 workers in %s (%.0f jobs/s); about %d parkings (%.2f fetches per job); max slots taken %d",
		n, loadLimit, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(), parked, 1+float64(parked)/float64(n), slots.max.Load())
}
