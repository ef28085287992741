package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/limiter"
)

// logParkings records every parking of the test database in
// test_parkings(job_id, kind): a parked job leaves no trace on its River row
// once resumed, which is the point, so the tests that need to know whether
// jobs parked keep their own log.
func logParkings(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
		CREATE TABLE test_parkings (job_id bigint NOT NULL, kind text NOT NULL, reason text NOT NULL);
		CREATE FUNCTION test_log_parking() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO test_parkings VALUES (NEW.job_id, NEW.kind, NEW.reason);
			RETURN NULL;
		END $$;
		CREATE TRIGGER test_log_parking AFTER INSERT ON concurrency_parked_jobs
			FOR EACH ROW EXECUTE FUNCTION test_log_parking();`)
	require.NoError(t, err)
}

// parkings counts the parkings of kind logged by logParkings.
func parkings(t testing.TB, pool *pgxpool.Pool, kind string) int {
	t.Helper()
	return count(t, pool, "SELECT count(*) FROM test_parkings WHERE kind = $1", kind)
}

// jobState returns the state of River job id ("" when it is gone).
func jobState(t *testing.T, pool *pgxpool.Pool, id int64) string {
	t.Helper()
	var state string
	err := pool.QueryRow(context.Background(), "SELECT state::text FROM river_job WHERE id = $1", id).Scan(&state)
	if err != nil {
		return ""
	}
	return state
}

// waitParked waits until the jobs ids are parked in place: pending, with a
// parking record. River emits no event for them (its completer reports no
// completion for a row its update left pending).
func waitParked(t *testing.T, pool *pgxpool.Pool, ids ...int64) {
	t.Helper()
	if !assert.Eventually(t, func() bool {
		return count(t, pool, `SELECT count(*) FROM river_job j JOIN concurrency_parked_jobs p ON p.job_id = j.id
			WHERE j.id = ANY($1) AND j.state = 'pending'`, ids) == len(ids)
	}, 30*time.Second, 10*time.Millisecond, "jobs %v parked", ids) {
		// Say where they are: their rows, their errors, their place in the
		// limiter's tables.
		var where string
		require.NoError(t, pool.QueryRow(context.Background(), `
			SELECT COALESCE(string_agg(format('job %s: %s, attempt %s, errors %s, parked %s, waiting %s, slot %s', j.id, j.state, j.attempt,
			         j.errors::text, EXISTS (SELECT 1 FROM concurrency_parked_jobs p WHERE p.job_id = j.id),
			         EXISTS (SELECT 1 FROM concurrency_waiters w WHERE w.job_id = j.id),
			         EXISTS (SELECT 1 FROM concurrency_executions e WHERE e.job_id = j.id)), '; ' ORDER BY j.id), '')
			FROM river_job j WHERE j.id = ANY($1)`, ids).Scan(&where))
		t.Fatalf("jobs %v not parked: %s", ids, where)
	}
}

// clearLimits clears every limit of kind, as `sluice limits clear` does.
func clearLimits(t *testing.T, pool *pgxpool.Pool, kind string) (limiter.Facets, error) {
	t.Helper()
	lim, err := limiter.New(limiter.Config{Pool: pool})
	require.NoError(t, err)
	return lim.ClearLimits(context.Background(), kind, limiter.Facets{})
}
