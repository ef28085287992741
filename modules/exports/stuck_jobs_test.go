package exports_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/maintenance"
	"github.com/sluice-dev/sluice/modules/exports"
	"github.com/sluice-dev/sluice/settings"
)

// TestStuckExportJobsGitLabSpec covers the scenarios of GitLab's
// stuck_export_jobs_worker_spec, each on its own database and through a
// real River client and the maintenance framework.
func TestStuckExportJobsGitLabSpec(t *testing.T) {
	t.Parallel()

	t.Run("completed River job, export started: failed", func(t *testing.T) {
		t.Parallel()
		e := newExportEnv(t)
		id := e.exportFor(exports.ExportStarted, string(rivertype.JobStateCompleted))
		run := e.sweep()
		require.Equal(t, exports.ExportFailed, e.status(id))
		require.Equal(t, maintenance.RunSucceeded, run.Status)
		require.EqualValues(t, 1, run.Affected)
		row := e.row(id)
		require.NotNil(t, row.FinishedAt)
		require.Contains(t, *row.Error, "stuck")
	})

	t.Run("completed River job, export queued: failed", func(t *testing.T) {
		t.Parallel()
		e := newExportEnv(t)
		id := e.exportFor(exports.ExportQueued, string(rivertype.JobStateCompleted))
		run := e.sweep()
		require.Equal(t, exports.ExportFailed, e.status(id))
		require.EqualValues(t, 1, run.Affected)
	})

	t.Run("export finished after the first read: stays finished", func(t *testing.T) {
		t.Parallel()
		e := newExportEnv(t)
		id := e.exportFor(exports.ExportStarted, string(rivertype.JobStateCompleted))
		res, err := e.deps.SweepStuckExports(e.ctx, func(ctx context.Context) error {
			_, err := e.pool.Exec(ctx, "UPDATE project_export_jobs SET status = 'finished', finished_at = now() WHERE id = $1", id)
			return err
		})
		require.NoError(t, err)
		require.Zero(t, res.Affected)
		require.Equal(t, exports.ExportFinished, e.status(id))
	})

	t.Run("no River job completed: nothing changes", func(t *testing.T) {
		t.Parallel()
		e := newExportEnv(t)
		e.exportFor(exports.ExportStarted, string(rivertype.JobStateRunning))
		e.exportFor(exports.ExportQueued, string(rivertype.JobStateAvailable))
		before := e.checksum()
		run := e.sweep()
		require.Zero(t, run.Affected)
		require.Equal(t, before, e.checksum())
	})

	t.Run("relation exports: recent skipped, 12 hours old failed", func(t *testing.T) {
		t.Parallel()
		e := newExportEnv(t)
		recentJob := e.riverJob(string(rivertype.JobStateCompleted))
		recent := e.export(exports.ExportStarted, &recentJob, time.Hour, true)
		oldJob := e.riverJob(string(rivertype.JobStateCompleted))
		old := e.export(exports.ExportStarted, &oldJob, 12*time.Hour, true)
		// Without relation exports the grace period does not apply.
		plainJob := e.riverJob(string(rivertype.JobStateCompleted))
		plain := e.export(exports.ExportStarted, &plainJob, time.Hour, false)

		run := e.sweep()
		require.Equal(t, exports.ExportStarted, e.status(recent))
		require.Equal(t, exports.ExportFailed, e.status(old))
		require.Equal(t, exports.ExportFailed, e.status(plain))
		require.EqualValues(t, 2, run.Affected)
		var details map[string]any
		require.NoError(t, json.Unmarshal(run.Details, &details))
		require.EqualValues(t, 1, details["skipped_in_grace"])

		// The failed export's relation exports failed with it; the skipped
		// export's are untouched.
		for id, want := range map[int64]string{old: exports.ExportFailed, recent: exports.ExportStarted} {
			rels, err := db.New(e.pool).ListRelationExports(e.ctx, id)
			require.NoError(t, err)
			require.Len(t, rels, len(exports.ExportRelations()))
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
		for _, status := range []string{exports.ExportQueued, exports.ExportStarted} {
			id := e.exportFor(status, tc.state)
			want[id] = status
			if tc.stuck {
				want[id] = exports.ExportFailed
			}
		}
	}
	// Rows the sweep never judges: already ended, or without a River job.
	done := e.riverJob(string(rivertype.JobStateCompleted))
	want[e.export(exports.ExportFinished, &done, time.Minute, false)] = exports.ExportFinished
	failedJob := e.riverJob(string(rivertype.JobStateDiscarded))
	want[e.export(exports.ExportFailed, &failedJob, time.Minute, false)] = exports.ExportFailed
	want[e.export(exports.ExportQueued, nil, 24*time.Hour, false)] = exports.ExportQueued

	run := e.sweep()
	require.EqualValues(t, 8, run.Affected)
	for id, status := range want {
		require.Equal(t, status, e.status(id), "export %d", id)
	}

	// The log line, the metric and the run's details name the failed exports.
	require.Contains(t, e.logs.String(), `"msg":"Marked stuck export jobs as failed"`)
	require.EqualValues(t, 8, e.metric("sluice_stuck_export_jobs_total", nil))
	require.EqualValues(t, 8, e.metric("sluice_maintenance_affected_total", map[string]string{"kind": "export.stuck_jobs"}))
	var details struct {
		Failed []int64 `json:"failed_export_job_ids"`
	}
	require.NoError(t, json.Unmarshal(run.Details, &details))
	require.Len(t, details.Failed, 8)
	for _, id := range details.Failed {
		require.Equal(t, exports.ExportFailed, want[id])
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
	id := e.exportFor(exports.ExportStarted, string(rivertype.JobStateDiscarded))
	other := e.exportFor(exports.ExportStarted, string(rivertype.JobStateDiscarded))
	res, err := e.deps.SweepStuckExports(e.ctx, func(ctx context.Context) error {
		fresh := e.riverJob(string(rivertype.JobStateAvailable))
		_, err := e.pool.Exec(ctx, "UPDATE project_export_jobs SET job_id = $2, status = 'queued' WHERE id = $1", id, fresh)
		return err
	})
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Affected)
	require.Equal(t, exports.ExportQueued, e.status(id), "the re-pointed export is left alone")
	require.Equal(t, exports.ExportFailed, e.status(other))

	// The next sweep judges it by its new River job, which is not done.
	res, err = e.deps.SweepStuckExports(e.ctx, nil)
	require.NoError(t, err)
	require.Zero(t, res.Affected)
	require.Equal(t, exports.ExportQueued, e.status(id))
}

// TestStuckExportJobsGraceSetting reads the grace period from settings on
// every run, and a bad value fails the run without changing anything.
func TestStuckExportJobsGraceSetting(t *testing.T) {
	t.Parallel()

	e := newExportEnv(t)
	jobID := e.riverJob(string(rivertype.JobStateCompleted))
	id := e.export(exports.ExportStarted, &jobID, 2*time.Hour, true)

	run := e.sweep()
	require.Zero(t, run.Affected, "2 hours old is within the default 6h")
	require.Equal(t, exports.ExportStarted, e.status(id))

	require.NoError(t, settings.New(e.pool).Set(e.ctx, exports.SettingStuckExportGrace, "soon"))
	before := e.checksum()
	_, err := e.deps.SweepStuckExports(e.ctx, nil)
	require.ErrorContains(t, err, exports.SettingStuckExportGrace)
	require.Equal(t, before, e.checksum())

	require.NoError(t, settings.New(e.pool).Set(e.ctx, exports.SettingStuckExportGrace, "1h"))
	run = e.sweep()
	require.EqualValues(t, 1, run.Affected)
	require.Equal(t, exports.ExportFailed, e.status(id))
}

// TestExportMigrationDefaults checks that the migration's settings and
// schedule rows match the code.
func TestExportMigrationDefaults(t *testing.T) {
	t.Parallel()

	e := newExportEnv(t)
	var raw string
	require.NoError(t, e.pool.QueryRow(e.ctx, "SELECT value #>> '{}' FROM settings WHERE key = $1", exports.SettingStuckExportGrace).Scan(&raw))
	d, err := time.ParseDuration(raw)
	require.NoError(t, err)
	require.Equal(t, exports.DefaultStuckExportGrace, d)
	grace, err := settings.New(e.pool).Duration(e.ctx, exports.SettingStuckExportGrace, 0)
	require.NoError(t, err)
	require.Equal(t, exports.DefaultStuckExportGrace, grace)

	var cron, kind string
	require.NoError(t, e.pool.QueryRow(e.ctx, "SELECT cron, kind FROM schedules WHERE name = 'export.stuck_jobs'").Scan(&cron, &kind))
	require.Equal(t, "30 * * * *", cron)
	require.Equal(t, exports.StuckJobsArgs{}.Kind(), kind)

	require.True(t, jobtest.Registry(t).Has("export.stuck_jobs"))
	require.True(t, jobtest.Registry(t).Has("export.project"))
	require.NotEqual(t, maintenance.Queue, exports.ProjectArgs{ExportJobID: 1}.InsertOpts().Queue)
	require.True(t, strings.HasPrefix(exports.StuckJobsArgs{}.InsertOpts().Queue, maintenance.Queue))
}
