package app_test

import (
	"context"
	"testing"

	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/jobs"
)

func TestRunOne(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	cfg := app.Config{DatabaseURL: url, Logger: jobtest.Logger(t)}

	t.Run("completes", func(t *testing.T) {
		t.Parallel()
		res, err := app.RunOne(ctx, cfg, jobs.DemoSleepArgs{MS: 10}, app.RunOptions{})
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
		_, err := app.RunOne(runCtx, cfg, jobs.DemoSleepArgs{MS: 60_000}, app.RunOptions{})
		require.Error(t, err)
	})

	t.Run("unmigrated database", func(t *testing.T) {
		t.Parallel()
		_, err := app.RunOne(ctx, app.Config{DatabaseURL: testdb.NewEmpty(t)}, jobs.DemoSleepArgs{}, app.RunOptions{})
		require.ErrorContains(t, err, "sluice migrate up")
	})
}
