package jobtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/rivertype"
	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/module"
	"github.com/sluice-dev/sluice/modules/cibuilds"
	"github.com/sluice-dev/sluice/modules/demo"
	"github.com/sluice-dev/sluice/modules/exports"
	"github.com/sluice-dev/sluice/modules/taskcancel"
)

// Count runs a SELECT count(*) query and returns the count.
func Count(tb testing.TB, pool *pgxpool.Pool, sql string, args ...any) int {
	tb.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		tb.Fatalf("jobtest: count: %v", err)
	}
	return n
}

// InsertParked inserts a parked job of kind as the Limiter leaves one: a
// pending river_job row and its parking record. It returns the job id.
func InsertParked(tb testing.TB, pool *pgxpool.Pool, kind, args string) int64 {
	tb.Helper()
	var id int64
	if err := pool.QueryRow(context.Background(), `
		WITH j AS (
			INSERT INTO river_job (state, kind, args, queue, priority, max_attempts)
			VALUES ('pending', $1, $2, 'default', 1, 25) RETURNING id)
		INSERT INTO concurrency_parked_jobs (job_id, kind, reason)
		SELECT id, $1, 'limit' FROM j RETURNING job_id`, kind, args).Scan(&id); err != nil {
		tb.Fatalf("jobtest: insert parked job: %v", err)
	}
	return id
}

// InsertRunning inserts a River job in state running (or state) whose
// attempts were made by attemptedBy (the last one is the current attempt).
func InsertRunning(tb testing.TB, pool *pgxpool.Pool, kind, args string, attempt, maxAttempts int, attemptedBy []string, metadata, state string) int64 {
	tb.Helper()
	var id int64
	if err := pool.QueryRow(context.Background(), `
		INSERT INTO river_job (args, kind, max_attempts, state, queue, attempt, attempted_at, attempted_by, metadata, scheduled_at,
		                       finalized_at)
		VALUES ($1, $2, $3, $7::river_job_state, 'default', $4, now() - interval '1 minute', $5, $6, now() - interval '2 minutes',
		        CASE WHEN $7 IN ('completed', 'discarded', 'cancelled') THEN now() END)
		RETURNING id`, args, kind, maxAttempts, attempt, attemptedBy, metadata, state).Scan(&id); err != nil {
		tb.Fatalf("jobtest: insert running job: %v", err)
	}
	return id
}

// WaitRunning waits until job id runs.
func WaitRunning(tb testing.TB, client *Client, id int64) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		job, err := client.JobGet(context.Background(), id)
		if err != nil {
			tb.Fatalf("jobtest: get job %d: %v", id, err)
		}
		if job.State == rivertype.JobStateRunning {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("jobtest: job %d not running within 10s (state %s)", id, job.State)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// SetLimit sets the concurrency limit of kind to n.
func SetLimit(tb testing.TB, pool *pgxpool.Pool, kind string, n int32) {
	tb.Helper()
	if _, err := db.New(pool).SetConcurrencyLimit(context.Background(), db.SetConcurrencyLimitParams{Kind: kind, MaxConcurrency: n}); err != nil {
		tb.Fatalf("jobtest: set limit of %s: %v", kind, err)
	}
}

// JobState returns the state of River job id ("" when it is gone).
func JobState(tb testing.TB, pool *pgxpool.Pool, id int64) string {
	tb.Helper()
	var state string
	if err := pool.QueryRow(context.Background(), "SELECT state::text FROM river_job WHERE id = $1", id).Scan(&state); err != nil {
		return ""
	}
	return state
}

// WaitParked waits until the jobs ids are parked in place: pending, with a
// parking record. River emits no event for them (its completer reports no
// completion for a row its update left pending).
func WaitParked(tb testing.TB, pool *pgxpool.Pool, ids ...int64) {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for Count(tb, pool, `SELECT count(*) FROM river_job j JOIN concurrency_parked_jobs p ON p.job_id = j.id
			WHERE j.id = ANY($1) AND j.state = 'pending'`, ids) != len(ids) {
		if time.Now().After(deadline) {
			tb.Fatalf("jobtest: jobs %v not parked within 30s", ids)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ProgramExportingTo is the stock program with the exports module writing
// its archives to dir.
func ProgramExportingTo(dir string) app.Program {
	return app.Program{Modules: []module.Module{
		cibuilds.Module(), exports.Module(exports.Config{Dir: dir}), taskcancel.Module(), demo.Module(),
	}}
}
