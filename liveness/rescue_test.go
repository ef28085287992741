package liveness_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/limiter"
	"github.com/sluice-dev/sluice/liveness"
)

type rescuedRow struct {
	State        string
	Errors       []rivertype.AttemptError
	Finalized    bool
	ScheduledAgo time.Duration
	RescueCount  int
	AttemptedBy  []string
}

func readRescued(t *testing.T, pool *pgxpool.Pool, id int64) rescuedRow {
	t.Helper()
	var r rescuedRow
	var errs [][]byte
	var finalized *time.Time
	var scheduled, now time.Time
	var meta []byte
	require.NoError(t, pool.QueryRow(context.Background(), `
		SELECT state::text, errors, finalized_at, scheduled_at, now(), metadata, attempted_by FROM river_job WHERE id = $1`, id).
		Scan(&r.State, &errs, &finalized, &scheduled, &now, &meta, &r.AttemptedBy))
	for _, e := range errs {
		var ae rivertype.AttemptError
		require.NoError(t, json.Unmarshal(e, &ae))
		r.Errors = append(r.Errors, ae)
	}
	r.Finalized = finalized != nil
	r.ScheduledAgo = now.Sub(scheduled)
	var m struct {
		RescueCount int `json:"river:rescue_count"`
	}
	require.NoError(t, json.Unmarshal(meta, &m))
	r.RescueCount = m.RescueCount
	return r
}

// TestRescueWorkerJobs: a dead worker's running jobs get River's rescue
// decisions — retryable now while attempts remain (also with args that no
// longer decode), discarded when exhausted or of an unknown kind, cancelled
// when their cancellation was requested — with the attempt error "worker
// <id> lost" and river:rescue_count + 1; jobs whose current attempt is
// another worker's, and finished jobs, are left alone.
func TestRescueWorkerJobs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.NewPool(t)
	dead := []string{"dead-1"}

	retry := jobtest.InsertRunning(t, pool, "demo.sleep", `{"ms": 1}`, 1, 3, dead, `{"river:rescue_count": 1}`, "running")
	exhausted := jobtest.InsertRunning(t, pool, "demo.sleep", `{}`, 3, 3, []string{"w-0", "w-0", "dead-1"}, `{}`, "running")
	cancelled := jobtest.InsertRunning(t, pool, "demo.sleep", `{}`, 1, 3, dead, `{"cancel_attempted_at": "2026-01-02T03:04:05Z"}`, "running")
	unknown := jobtest.InsertRunning(t, pool, "no.such.kind", `{}`, 1, 3, dead, `{}`, "running")
	badArgs := jobtest.InsertRunning(t, pool, "demo.sleep", `{"bogus": true}`, 1, 3, dead, `{}`, "running")
	badArgsLast := jobtest.InsertRunning(t, pool, "demo.sleep", `{"bogus": true}`, 2, 2, []string{"dead-1", "dead-1"}, `{}`, "running")
	elsewhere := jobtest.InsertRunning(t, pool, "demo.sleep", `{}`, 2, 3, []string{"dead-1", "alive"}, `{}`, "running")
	finished := jobtest.InsertRunning(t, pool, "demo.sleep", `{}`, 1, 3, dead, `{}`, "completed")

	before := time.Now()
	var rescued []liveness.RescuedJob
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		rescued, err = liveness.RescueWorkerJobs(ctx, tx, jobtest.Registry(t), "dead-1", time.Now())
		return err
	}))
	got := map[int64]rivertype.JobState{}
	for _, r := range rescued {
		got[r.ID] = r.State
	}
	require.Equal(t, map[int64]rivertype.JobState{
		retry:       rivertype.JobStateRetryable,
		exhausted:   rivertype.JobStateDiscarded,
		cancelled:   rivertype.JobStateCancelled,
		unknown:     rivertype.JobStateDiscarded,
		badArgs:     rivertype.JobStateRetryable,
		badArgsLast: rivertype.JobStateDiscarded,
	}, got)

	for id, state := range got {
		r := readRescued(t, pool, id)
		require.Equal(t, string(state), r.State, "job %d", id)
		require.NotEmpty(t, r.Errors, "job %d", id)
		last := r.Errors[len(r.Errors)-1]
		require.Equal(t, "worker dead-1 lost", last.Error)
		require.WithinDuration(t, before, last.At, time.Minute)
		require.Equal(t, state != rivertype.JobStateRetryable, r.Finalized, "job %d: finalized only when finished", id)
	}
	r := readRescued(t, pool, retry)
	require.Equal(t, 2, r.RescueCount, "river:rescue_count is incremented")
	require.Equal(t, 1, r.Errors[0].Attempt)
	require.Less(t, r.ScheduledAgo, 30*time.Second, "a retryable job is due at once")
	r = readRescued(t, pool, exhausted)
	require.Equal(t, 1, r.RescueCount)
	require.Equal(t, 3, r.Errors[0].Attempt)
	require.Greater(t, r.ScheduledAgo, time.Minute, "a finished job keeps its scheduled_at")

	for _, id := range []int64{elsewhere, finished} {
		r := readRescued(t, pool, id)
		require.Empty(t, r.Errors, "job %d is not the dead worker's: untouched", id)
		require.Zero(t, r.RescueCount)
	}
	require.Equal(t, "running", readRescued(t, pool, elsewhere).State)

	// A second rescue finds nothing.
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		again, err := liveness.RescueWorkerJobs(ctx, tx, jobtest.Registry(t), "dead-1", time.Now())
		require.Empty(t, again)
		return err
	}))
}

// TestSlotReleaseOfDeadWorker: the slots of a dead worker's rescued jobs
// and its stale slots are freed in the rescuing transaction, the counts of
// concurrency_limits stay equal to the rows, parked jobs are resumed into
// the freed slots (with reserved slots), and another worker's slot is left
// alone.
func TestSlotReleaseOfDeadWorker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.NewPool(t)
	deps, _ := jobtest.NewJobs(t, pool)
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}

	running := jobtest.InsertRunning(t, pool, "demo.sleep", `{"ms": 1}`, 1, 3, []string{"dead-1"}, `{}`, "running")
	staleJob := jobtest.InsertRunning(t, pool, "demo.sleep", `{"ms": 1}`, 1, 3, []string{"dead-1"}, `{}`, "completed")
	alive := jobtest.InsertRunning(t, pool, "demo.sleep", `{"ms": 1}`, 1, 3, []string{"alive"}, `{}`, "running")
	exec(`INSERT INTO concurrency_executions (job_id, kind, worker_id) VALUES ($1, 'demo.sleep', 'dead-1'), ($2, 'demo.sleep', 'dead-1'), ($3, 'demo.sleep', 'alive')`,
		running, staleJob, alive)
	parked := make([]int64, 3)
	for i := range parked {
		parked[i] = jobtest.InsertParked(t, pool, "demo.sleep", `{"ms": 1}`)
	}
	jobtest.SetLimit(t, pool, "demo.sleep", 3) // counts: 3 admitted, parked jobs

	var res limiter.SlotReleaseResult
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		kinds, err := db.New(tx).WorkerJobKinds(ctx, "dead-1")
		require.NoError(t, err)
		require.Equal(t, []string{"demo.sleep"}, kinds)
		slots, err := deps.Limiter.LockSlotsOf(ctx, tx, "dead-1", kinds)
		if err != nil {
			return err
		}
		rescued, err := liveness.RescueWorkerJobs(ctx, tx, jobtest.Registry(t), "dead-1", time.Now())
		if err != nil {
			return err
		}
		require.Len(t, rescued, 1)
		res, err = slots.Release(ctx, []int64{rescued[0].ID})
		return err
	}))
	require.Equal(t, map[string]int{"demo.sleep": 2}, res.Released)
	require.Equal(t, map[string]int{"demo.sleep": 2}, res.Resumed, "the two freed slots go to parked jobs at once")

	require.Equal(t, 0, jobtest.Count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE worker_id = 'dead-1'`))
	require.Equal(t, 1, jobtest.Count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE job_id = $1 AND worker_id = 'alive'`, alive))
	// The two oldest parked jobs (FIFO) are available again, the same rows,
	// each with a reserved slot.
	require.Equal(t, 2, jobtest.Count(t, pool, `SELECT count(*) FROM concurrency_executions e JOIN river_job j ON j.id = e.job_id
	                                     WHERE e.reserved AND j.state = 'available' AND j.id = ANY($1)`, parked[:2]))
	require.Equal(t, "pending", jobtest.JobState(t, pool, parked[2]))
	require.Equal(t, 1, jobtest.Count(t, pool, `SELECT count(*) FROM concurrency_parked_jobs WHERE job_id = $1`, parked[2]))
	var admitted int
	var hasParked bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT admitted, has_parked FROM concurrency_limits WHERE kind = 'demo.sleep'`).Scan(&admitted, &hasParked))
	require.Equal(t, jobtest.Count(t, pool, `SELECT count(*) FROM concurrency_executions WHERE kind = 'demo.sleep'`), admitted, "admitted count = slot rows")
	require.Equal(t, 3, admitted)
	require.True(t, hasParked, "a job is still parked")
}
