package demo_test

import (
	"context"
	"testing"
	"time"

	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/modules/demo"
)

func TestDemoSleep(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool := testdb.NewPool(t)
	deps, _ := jobtest.NewJobs(t, pool)
	client := jobtest.Start(t, pool, deps, jobtest.Config{})

	t.Run("sleeps and completes", func(t *testing.T) {
		t.Parallel()
		start := time.Now()
		job := client.InsertAndWait(t, demo.SleepArgs{MS: 50}, nil)
		require.Equal(t, rivertype.JobStateCompleted, job.State)
		require.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond)
	})

	t.Run("cancel interrupts it", func(t *testing.T) {
		t.Parallel()
		res, err := client.Insert(ctx, demo.SleepArgs{MS: 60_000}, nil)
		require.NoError(t, err)
		jobtest.WaitRunning(t, client, res.Job.ID)
		start := time.Now()
		_, err = client.JobCancel(ctx, res.Job.ID)
		require.NoError(t, err)
		ev := client.WaitFinished(t, 10*time.Second, res.Job.ID)[res.Job.ID]
		require.Equal(t, rivertype.JobStateCancelled, ev.Job.State)
		require.Less(t, time.Since(start), 5*time.Second)
	})

	t.Run("ignore_cancel keeps running after cancel", func(t *testing.T) {
		t.Parallel()
		res, err := client.Insert(ctx, demo.SleepArgs{MS: 700, IgnoreCancel: true}, nil)
		require.NoError(t, err)
		jobtest.WaitRunning(t, client, res.Job.ID)
		_, err = client.JobCancel(ctx, res.Job.ID)
		require.NoError(t, err)
		time.Sleep(300 * time.Millisecond)
		job, err := client.JobGet(ctx, res.Job.ID)
		require.NoError(t, err)
		require.Equal(t, rivertype.JobStateRunning, job.State, "still running after cancellation")
		require.Contains(t, string(job.Metadata), "cancel_attempted_at")
		client.WaitFinished(t, 10*time.Second, res.Job.ID)
	})
}
