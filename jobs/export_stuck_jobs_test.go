package jobs_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/jobs"
)

// TestStuckExportJobsGitLabSpec covers the scenarios of GitLab's
// stuck_export_jobs_worker_spec, each on its own database and through a
// real River client and the maintenance framework.
func TestStuckExportJobsGitLabSpec(t *testing.T) {
	t.Parallel()

	t.Run("completed River job, export started: failed", func(t *testing.T) {
		t.Parallel()
		e := newExportEnv(t)
		id := e.exportFor(jobs.ExportStarted, string(rivertype.JobStateCompleted))
		run := e.sweep()
		require.Equal(t, jobs.ExportFailed, e.status(id))
		require.Equal(t, jobs.RunSucceeded, run.Status)
		require.EqualValues(t, 1, run.Affected)
		row := e.row(id)
		require.NotNil(t, row.FinishedAt)
		require.Contains(t, *row.Error, "stuck")
	})

	t.Run("completed River job, export queued: failed", func(t *testing.T) {
		t.Parallel()
		e := newExportEnv(t)
		id := e.exportFor(jobs.ExportQueued, string(rivertype.JobStateCompleted))
		run := e.sweep()
		require.Equal(t, jobs.ExportFailed, e.status(id))
		require.EqualValues(t, 1, run.Affected)
	})

	t.Run("export finished after the first read: stays finished", func(t *testing.T) {
		t.Parallel()
		e := newExportEnv(t)
		id := e.exportFor(jobs.ExportStarted, string(rivertype.JobStateCompleted))
		res, err := jobs.SweepStuckExports(e.ctx, e.deps, func(ctx context.Context) error {
			_, err := e.pool.Exec(ctx, "UPDATE project_export_jobs SET status = 'finished', finished_at = now() WHERE id = $1", id)
			return err
		})
		require.NoError(t, err)
		require.Zero(t, res.Affected)
		require.Equal(t, jobs.ExportFinished, e.status(id))
	})

	t.Run("no River job completed: nothing changes", func(t *testing.T) {
		t.Parallel()
		e := newExportEnv(t)
		e.exportFor(jobs.ExportStarted, string(rivertype.JobStateRunning))
		e.exportFor(jobs.ExportQueued, string(rivertype.JobStateAvailable))
		before := e.checksum()
		run := e.sweep()
		require.Zero(t, run.Affected)
		require.Equal(t, before, e.checksum())
	})

	t.Run("relation exports: recent skipped, 12 hours old failed", func(t *testing.T) {
		t.Parallel()
		e := newExportEnv(t)
		recentJob := e.riverJob(string(rivertype.JobStateCompleted))
		recent := e.export(jobs.ExportStarted, &recentJob, time.Hour, true)
		oldJob := e.riverJob(string(rivertype.JobStateCompleted))
		old := e.export(jobs.ExportStarted, &oldJob, 12*time.Hour, true)
		// Without relation exports the grace period does not apply.
		plainJob := e.riverJob(string(rivertype.JobStateCompleted))
		plain := e.export(jobs.ExportStarted, &plainJob, time.Hour, false)

		run := e.sweep()
		require.Equal(t, jobs.ExportStarted, e.status(recent))
		require.Equal(t, jobs.ExportFailed, e.status(old))
		require.Equal(t, jobs.ExportFailed, e.status(plain))
		require.EqualValues(t, 2, run.Affected)
		var details map[string]any
		require.NoError(t, json.Unmarshal(run.Details, &details))
		require.EqualValues(t, 1, details["skipped_in_grace"])

		// The failed export's relation exports failed with it; the skipped
		// export's are untouched.
		for id, want := range map[int64]string{old: jobs.ExportFailed, recent: jobs.ExportStarted} {
			rels, err := db.New(e.pool).ListRelationExports(e.ctx, id)
			require.NoError(t, err)
			require.Len(t, rels, len(jobs.ExportRelations()))
			for _, r := range rels {
				require.Equal(t, want, r.Status, "relation %s of export %d", r.Relation, id)
			}
		}
	})
}

// TestStuckExportJobsRiverStates checks every River job state: only a
// finalized or missing River job makes an export stuck.
func TestStuckExportJobsRiverStates(t *testing.T) {
	t.Parallel()

	e := newExportEnv(t)
	want := map[int64]string{}
	for _, tc := range []struct {
		state string
		stuck bool
	}{
		{string(rivertype.JobStateAvailable), false},
		{string(rivertype.JobStateScheduled), false},
		{string(rivertype.JobStateRetryable), false},
		{string(rivertype.JobStatePending), false},
		{string(rivertype.JobStateRunning), false},
		{string(rivertype.JobStateCompleted), true},
		{string(rivertype.JobStateCancelled), true},
		{string(rivertype.JobStateDiscarded), true},
		{pruned, true},
	} {
		for _, status := range []string{jobs.ExportQueued, jobs.ExportStarted} {
			id := e.exportFor(status, tc.state)
			want[id] = status
			if tc.stuck {
				want[id] = jobs.ExportFailed
			}
		}
	}
	// Rows the sweep never judges: already ended, or without a River job.
	done := e.riverJob(string(rivertype.JobStateCompleted))
	want[e.export(jobs.ExportFinished, &done, time.Minute, false)] = jobs.ExportFinished
	failedJob := e.riverJob(string(rivertype.JobStateDiscarded))
	want[e.export(jobs.ExportFailed, &failedJob, time.Minute, false)] = jobs.ExportFailed
	want[e.export(jobs.ExportQueued, nil, 24*time.Hour, false)] = jobs.ExportQueued

	run := e.sweep()
	require.EqualValues(t, 8, run.Affected)
	for id, status := range want {
		require.Equal(t, status, e.status(id), "export %d", id)
	}

	// The log line, the metric and the run's details name the failed exports.
	require.Contains(t, e.logs.String(), `"msg":"Marked stuck export jobs as failed"`)
	require.EqualValues(t, 8, testutil.ToFloat64(e.deps.ExportMetrics.StuckFailed))
	require.EqualValues(t, 8, testutil.ToFloat64(e.deps.Metrics.MaintenanceAffected.WithLabelValues("export.stuck_jobs")))
	var details struct {
		Failed []int64 `json:"failed_export_job_ids"`
	}
	require.NoError(t, json.Unmarshal(run.Details, &details))
	require.Len(t, details.Failed, 8)
	for _, id := range details.Failed {
		require.Equal(t, jobs.ExportFailed, want[id])
	}

	// A second run finds nothing more to do.
	run = e.sweep()
	require.Zero(t, run.Affected)
}

// TestStuckExportJobsRepointed re-points an export at a new River job between
// the sweep's two reads (as a re-enqueue would): it is not failed.
func TestStuckExportJobsRepointed(t *testing.T) {
	t.Parallel()

	e := newExportEnv(t)
	id := e.exportFor(jobs.ExportStarted, string(rivertype.JobStateDiscarded))
	other := e.exportFor(jobs.ExportStarted, string(rivertype.JobStateDiscarded))
	res, err := jobs.SweepStuckExports(e.ctx, e.deps, func(ctx context.Context) error {
		fresh := e.riverJob(string(rivertype.JobStateAvailable))
		_, err := e.pool.Exec(ctx, "UPDATE project_export_jobs SET job_id = $2, status = 'queued' WHERE id = $1", id, fresh)
		return err
	})
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Affected)
	require.Equal(t, jobs.ExportQueued, e.status(id), "the re-pointed export is left alone")
	require.Equal(t, jobs.ExportFailed, e.status(other))

	// The next sweep judges it by its new River job, which is not done.
	res, err = jobs.SweepStuckExports(e.ctx, e.deps, nil)
	require.NoError(t, err)
	require.Zero(t, res.Affected)
	require.Equal(t, jobs.ExportQueued, e.status(id))
}

// TestStuckExportJobsGraceSetting reads the grace period from settings on
// every run, and a bad value fails the run without changing anything.
func TestStuckExportJobsGraceSetting(t *testing.T) {
	t.Parallel()

	e := newExportEnv(t)
	jobID := e.riverJob(string(rivertype.JobStateCompleted))
	id := e.export(jobs.ExportStarted, &jobID, 2*time.Hour, true)

	run := e.sweep()
	require.Zero(t, run.Affected, "2 hours old is within the default 6h")
	require.Equal(t, jobs.ExportStarted, e.status(id))

	require.NoError(t, e.deps.Settings.Set(e.ctx, jobs.SettingStuckExportGrace, "soon"))
	before := e.checksum()
	_, err := jobs.SweepStuckExports(e.ctx, e.deps, nil)
	require.ErrorContains(t, err, jobs.SettingStuckExportGrace)
	require.Equal(t, before, e.checksum())

	require.NoError(t, e.deps.Settings.Set(e.ctx, jobs.SettingStuckExportGrace, "1h"))
	run = e.sweep()
	require.EqualValues(t, 1, run.Affected)
	require.Equal(t, jobs.ExportFailed, e.status(id))
}

// TestExportMigrationDefaults checks that the migration's settings and
// schedule rows match the code.
func TestExportMigrationDefaults(t *testing.T) {
	t.Parallel()

	e := newExportEnv(t)
	var raw string
	require.NoError(t, e.pool.QueryRow(e.ctx, "SELECT value #>> '{}' FROM settings WHERE key = $1", jobs.SettingStuckExportGrace).Scan(&raw))
	d, err := time.ParseDuration(raw)
	require.NoError(t, err)
	require.Equal(t, jobs.DefaultStuckExportGrace, d)
	grace, err := e.deps.Settings.Duration(e.ctx, jobs.SettingStuckExportGrace, 0)
	require.NoError(t, err)
	require.Equal(t, jobs.DefaultStuckExportGrace, grace)

	var cron, kind string
	require.NoError(t, e.pool.QueryRow(e.ctx, "SELECT cron, kind FROM schedules WHERE name = 'export.stuck_jobs'").Scan(&cron, &kind))
	require.Equal(t, "30 * * * *", cron)
	require.Equal(t, jobs.ExportStuckJobsArgs{}.Kind(), kind)

	k, err := jobs.NewRegistry().Lookup("export.stuck_jobs")
	require.NoError(t, err)
	require.True(t, k.Maintenance)
	k, err = jobs.NewRegistry().Lookup("export.project")
	require.NoError(t, err)
	require.False(t, k.Maintenance)
	require.True(t, strings.HasPrefix(jobs.ExportStuckJobsArgs{}.InsertOpts().Queue, jobs.MaintenanceQueue))
}
