package taskcancel_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/maintenance"
	"github.com/sluice-dev/sluice/modules"
	"github.com/sluice-dev/sluice/modules/taskcancel"
	"github.com/sluice-dev/sluice/settings"
)

// holdArgs are the args of test.hold: a job that ignores cancellation and
// runs until the test releases it, so a test decides when it completes.
type holdArgs struct{}

func (holdArgs) Kind() string { return "test.hold" }

// holder releases test.hold jobs by id.
type holder struct {
	mu       sync.Mutex
	chans    map[int64]chan struct{}
	released bool
}

func newHolder() *holder { return &holder{chans: map[int64]chan struct{}{}} }

func (h *holder) ch(id int64) chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	c, ok := h.chans[id]
	if !ok {
		c = make(chan struct{})
		if h.released {
			close(c)
		}
		h.chans[id] = c
	}
	return c
}

// release lets job id complete.
func (h *holder) release(id int64) {
	c := h.ch(id)
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-c:
	default:
		close(c)
	}
}

// releaseAll lets every job complete, now and later.
func (h *holder) releaseAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.released = true
	for _, c := range h.chans {
		select {
		case <-c:
		default:
			close(c)
		}
	}
}

type holdWorker struct {
	river.WorkerDefaults[holdArgs]
	h *holder
}

// Timeout: none; the job ends when released.
func (w *holdWorker) Timeout(*river.Job[holdArgs]) time.Duration { return -1 }

// Work waits for its release and ignores its context, as a job that ignores
// cancellation does.
func (w *holdWorker) Work(_ context.Context, job *river.Job[holdArgs]) error {
	<-w.h.ch(job.ID)
	return nil
}

// cancelEnv is a test database with a River client working sluice's kinds
// and test.hold.
type cancelEnv struct {
	pool   *pgxpool.Pool
	deps   *taskcancel.Monitor
	client *jobtest.Client
	hold   *holder
}

func newCancelEnv(t *testing.T, pool *pgxpool.Pool) *cancelEnv {
	t.Helper()
	h := newHolder()
	// test.hold is an application's own kind: the monitor covers it.
	own := river.NewWorkers()
	river.AddWorker(own, &holdWorker{h: h})
	j, _ := jobtest.NewJobsConfig(t, pool, app.JobsConfig{Program: app.Program{Workers: own, Modules: modules.All()}})
	client := jobtest.Start(t, pool, j, jobtest.Config{
		Queues: map[string]river.QueueConfig{
			river.QueueDefault: {MaxWorkers: 60},
			maintenance.Queue:  {MaxWorkers: 4},
		},
	})
	deps := taskcancel.NewMonitor(pool, jobtest.Logger(t))
	// Cleanups run last-in first-out: jobs are released before the client
	// stops.
	t.Cleanup(h.releaseAll)
	return &cancelEnv{pool: pool, deps: deps, client: client, hold: h}
}

// startHeld inserts n test.hold jobs and waits until they all run.
func (e *cancelEnv) startHeld(t *testing.T, n int) []int64 {
	t.Helper()
	ids := make([]int64, n)
	for i := range n {
		res, err := e.client.Insert(context.Background(), holdArgs{}, nil)
		require.NoError(t, err)
		ids[i] = res.Job.ID
	}
	for _, id := range ids {
		jobtest.WaitRunning(t, e.client, id)
	}
	return ids
}

// cancel cancels running jobs through River directly (client.JobCancel, as
// any River client would, not the CLI).
func (e *cancelEnv) cancel(t *testing.T, ids ...int64) {
	t.Helper()
	for _, id := range ids {
		job, err := e.client.JobCancel(context.Background(), id)
		require.NoError(t, err)
		require.Equal(t, rivertype.JobStateRunning, job.State, "job %d", id)
	}
}

// complete releases jobs and waits until River has finalized them.
func (e *cancelEnv) complete(t *testing.T, ids ...int64) {
	t.Helper()
	for _, id := range ids {
		e.hold.release(id)
	}
	e.client.WaitFinished(t, 30*time.Second, ids...)
}

// monitor runs one monitor pass directly.
func (e *cancelEnv) monitor(t *testing.T) *taskcancel.TaskCancellationPass {
	t.Helper()
	pass, err := e.deps.Pass(context.Background())
	require.NoError(t, err)
	return pass
}

// monitorJob runs task_cancellation.monitor as a River job and returns it.
func (e *cancelEnv) monitorJob(t *testing.T) *rivertype.JobRow {
	t.Helper()
	return e.client.InsertAndWait(t, taskcancel.TaskCancellationMonitorArgs{}, nil)
}

func setSetting(t *testing.T, pool *pgxpool.Pool, key string, value any) {
	t.Helper()
	require.NoError(t, settings.New(pool).Set(context.Background(), key, value))
}

func setRawSetting(t *testing.T, pool *pgxpool.Pool, key, rawJSON string) {
	t.Helper()
	_, err := pool.Exec(context.Background(), "UPDATE settings SET value = $2::jsonb WHERE key = $1", key, rawJSON)
	require.NoError(t, err)
}

// tracked returns the tracker's rows by job id.
func tracked(t *testing.T, pool *pgxpool.Pool) map[int64]db.TaskCancellationTracker {
	t.Helper()
	rows, err := pool.Query(context.Background(),
		"SELECT job_id, kind, cancelled_at, tracked_at, counted_at FROM task_cancellation_tracker")
	require.NoError(t, err)
	defer rows.Close()
	out := map[int64]db.TaskCancellationTracker{}
	for rows.Next() {
		var r db.TaskCancellationTracker
		require.NoError(t, rows.Scan(&r.JobID, &r.Kind, &r.CancelledAt, &r.TrackedAt, &r.CountedAt))
		out[r.JobID] = r
	}
	require.NoError(t, rows.Err())
	return out
}

func trackedIDs(t *testing.T, pool *pgxpool.Pool) []int64 {
	t.Helper()
	var ids []int64
	for id := range tracked(t, pool) {
		ids = append(ids, id)
	}
	return ids
}

// statsOf reads the stats view (the stats document's section).
func statsOf(t *testing.T, pool *pgxpool.Pool) taskcancel.TaskCancellationStats {
	t.Helper()
	stats, err := taskcancel.ReadTaskCancellationStats(context.Background(), db.New(pool))
	require.NoError(t, err)
	return stats
}

// backdate moves the cancellation of jobs ids into the past by d.
func backdate(t *testing.T, pool *pgxpool.Pool, d time.Duration, ids ...int64) {
	t.Helper()
	tag, err := pool.Exec(context.Background(),
		"UPDATE task_cancellation_tracker SET cancelled_at = cancelled_at - $2::bigint * interval '1 millisecond' WHERE job_id = ANY($1)",
		ids, d.Milliseconds())
	require.NoError(t, err)
	require.EqualValues(t, len(ids), tag.RowsAffected())
}
