package exports_test

import (
	"context"
	"testing"
	"time"

	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/limiter"
	"github.com/sluice-dev/sluice/modules/exports"
)

// TestParkInPlaceExports: project exports under a limit all finish, their
// rows pointing at their own River jobs throughout; the stuck-export sweep
// leaves an export whose job is parked alone (pending is not finished).
func TestParkInPlaceExports(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool := testdb.NewPool(t)
	seedBuilds(t, pool, 7, 50)
	jobtest.SetLimit(t, pool, "export.project", -1)
	deps, _ := jobtest.NewJobsConfig(t, pool, app.JobsConfig{ParkAfter: time.Millisecond, Program: jobtest.ProgramExportingTo(t.TempDir())})
	client := jobtest.Start(t, pool, deps, jobtest.Config{})

	const n = 4
	var exportIDs, jobIDs []int64
	for range n {
		export, err := exports.Enqueue(ctx, pool, client.Client, 7, false)
		require.NoError(t, err)
		exportIDs = append(exportIDs, export.ID)
		jobIDs = append(jobIDs, *export.JobID)
	}
	jobtest.WaitParked(t, pool, jobIDs...)

	// The sweep runs while they wait: nothing is failed.
	sweep := client.InsertAndWait(t, exports.StuckJobsArgs{}, nil)
	require.Equal(t, rivertype.JobStateCompleted, sweep.State)
	require.Zero(t, jobtest.Count(t, pool, "SELECT count(*) FROM project_export_jobs WHERE status = 'failed'"))

	jobtest.SetLimit(t, pool, "export.project", 1)
	client.InsertAndWait(t, limiter.ResumeArgs{JobKind: "export.project"}, nil)
	require.Eventually(t, func() bool {
		return jobtest.Count(t, pool, "SELECT count(*) FROM project_export_jobs WHERE status = 'finished'") == n
	}, time.Minute, 20*time.Millisecond)
	for i, id := range exportIDs {
		require.Equal(t, jobIDs[i], int64(jobtest.Count(t, pool, "SELECT job_id::int FROM project_export_jobs WHERE id = $1", id)),
			"export %d still points at its own River job", id)
		require.Equal(t, "completed", jobtest.JobState(t, pool, jobIDs[i]))
	}
	require.Equal(t, n, jobtest.Count(t, pool, "SELECT count(*) FROM river_job WHERE kind = 'export.project'"), "no copies")
}
