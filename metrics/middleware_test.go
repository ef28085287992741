package metrics_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/limiter"
	"github.com/sluice-dev/sluice/maintenance"
	"github.com/sluice-dev/sluice/modules"
	"github.com/sluice-dev/sluice/modules/demo"
)

// flakyArgs are the args of an application's own kind that fails its first
// Fails attempts.
type flakyArgs struct {
	Fails int `json:"fails"`
}

func (flakyArgs) Kind() string { return "test.flaky" }

func (flakyArgs) InsertOpts() river.InsertOpts { return river.InsertOpts{Queue: "flaky"} }

type flakyWorker struct {
	river.WorkerDefaults[flakyArgs]
}

func (flakyWorker) Work(_ context.Context, job *river.Job[flakyArgs]) error {
	if job.Attempt <= job.Args.Fails {
		return errors.New("flaky")
	}
	return nil
}

// NextRetry retries at once.
func (flakyWorker) NextRetry(*river.Job[flakyArgs]) time.Time { return time.Now() }

// snoozeArgs snooze once, then complete.
type snoozeArgs struct{}

func (snoozeArgs) Kind() string { return "test.snooze" }

type snoozeWorker struct {
	river.WorkerDefaults[snoozeArgs]
	snoozed atomic.Bool
}

func (w *snoozeWorker) Work(context.Context, *river.Job[snoozeArgs]) error {
	if w.snoozed.CompareAndSwap(false, true) {
		return river.JobSnooze(time.Millisecond)
	}
	return nil
}

// blockArgs block until cancelled, after saying they started.
type blockArgs struct{}

func (blockArgs) Kind() string { return "test.block" }

type blockWorker struct {
	river.WorkerDefaults[blockArgs]
	started chan struct{}
}

func (w *blockWorker) Work(ctx context.Context, _ *river.Job[blockArgs]) error {
	close(w.started)
	<-ctx.Done()
	return context.Cause(ctx)
}

// TestJobMetrics: every kind's series exist at 0 before any job runs (its
// default queue); each execution counts once with River's outcome: a job
// that fails twice and then succeeds counts 2 retryable and 1 completed, a
// failure on the last attempt discarded, a cancelled and a snoozed job so;
// a parked and resumed job counts one execution.
func TestJobMetrics(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool := testdb.NewPool(t)
	own := river.NewWorkers()
	river.AddWorker(own, flakyWorker{})
	river.AddWorker(own, &snoozeWorker{})
	block := &blockWorker{started: make(chan struct{})}
	river.AddWorker(own, block)
	j, reg := jobtest.NewJobsConfig(t, pool, app.JobsConfig{ParkAfter: time.Millisecond,
		Program: app.Program{Workers: own, Modules: modules.All()}})
	value := func(kind, queue, outcome string) float64 {
		return jobtest.MetricValue(t, reg, "sluice_jobs_total", map[string]string{"kind": kind, "queue": queue, "outcome": outcome})
	}
	families, err := reg.Gather()
	require.NoError(t, err)
	zero := 0
	for _, f := range families {
		if f.GetName() == "sluice_jobs_total" {
			for _, m := range f.GetMetric() {
				require.Zero(t, m.GetCounter().GetValue())
				zero++
			}
		}
	}
	require.Equal(t, (len(jobtest.Registry(t).Names())+3)*5, zero, "every kind's five outcomes, at 0, before any job")
	require.Zero(t, value("test.flaky", "flaky", "retryable"))
	require.Zero(t, value("ci.drop_running_builds", "maintenance", "completed"))

	jobtest.SetLimit(t, pool, "demo.sleep", -1) // a circuit breaker: demo.sleep jobs park
	client := jobtest.Start(t, pool, j, jobtest.Config{Queues: map[string]river.QueueConfig{
		river.QueueDefault: {MaxWorkers: 10}, "flaky": {MaxWorkers: 2}, maintenance.Queue: {MaxWorkers: 2},
	}})

	// Parked, resumed, then run: one execution.
	parked, err := client.Insert(ctx, demo.SleepArgs{MS: 1}, nil)
	require.NoError(t, err)
	jobtest.WaitParked(t, pool, parked.Job.ID)
	require.Zero(t, value("demo.sleep", "default", "completed"), "a parking is not an execution")
	jobtest.SetLimit(t, pool, "demo.sleep", 1)
	client.InsertAndWait(t, limiter.ResumeArgs{JobKind: "demo.sleep"}, nil)
	require.Eventually(t, func() bool { return jobtest.JobState(t, pool, parked.Job.ID) == "completed" },
		30*time.Second, 10*time.Millisecond, "the resumed job completes")
	require.EqualValues(t, 1, value("demo.sleep", "default", "completed"))
	require.EqualValues(t, 1, jobtest.MetricValue(t, reg, "sluice_concurrency_parked_total", map[string]string{"kind": "demo.sleep"}))

	flaky, err := client.Insert(ctx, flakyArgs{Fails: 2}, &river.InsertOpts{MaxAttempts: 5})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return jobtest.JobState(t, pool, flaky.Job.ID) == "completed" },
		30*time.Second, 10*time.Millisecond, "the flaky job completes on its third attempt")
	require.EqualValues(t, 2, value("test.flaky", "flaky", "retryable"))
	require.EqualValues(t, 1, value("test.flaky", "flaky", "completed"))

	job := client.InsertAndWait(t, flakyArgs{Fails: 9}, &river.InsertOpts{MaxAttempts: 1})
	require.Equal(t, rivertype.JobStateDiscarded, job.State)
	require.EqualValues(t, 1, value("test.flaky", "flaky", "discarded"))

	job = client.InsertAndWait(t, snoozeArgs{}, nil)
	require.Equal(t, rivertype.JobStateCompleted, job.State)
	require.EqualValues(t, 1, value("test.snooze", "default", "snoozed"))
	require.EqualValues(t, 1, value("test.snooze", "default", "completed"))

	res, err := client.Insert(ctx, blockArgs{}, &river.InsertOpts{MaxAttempts: 1})
	require.NoError(t, err)
	<-block.started
	_, err = client.JobCancel(ctx, res.Job.ID)
	require.NoError(t, err)
	client.WaitFinished(t, 10*time.Second, res.Job.ID)
	require.EqualValues(t, 1, value("test.block", "default", "cancelled"), "cancelled by River's JobCancel while it ran")

	require.EqualValues(t, 1, jobtest.MetricValue(t, reg, "sluice_job_duration_seconds", map[string]string{"kind": "demo.sleep", "queue": "default"}),
		"one execution of demo.sleep (the parked job, once), none for its parking")
}
