package exports_test

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/modules/exports"
)

// seedBuilds inserts n ci_builds of project and returns them in id order.
func seedBuilds(t *testing.T, pool *pgxpool.Pool, project int64, n int) []*db.CiBuild {
	t.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, `
		INSERT INTO ci_builds (project_id, pipeline_id, runner_id, name, stage, status, failure_reason, started_at, finished_at)
		SELECT $1, 100 + i / 10, CASE WHEN i % 3 = 0 THEN NULL ELSE i % 7 END, 'build ' || i, 'test',
		       (ARRAY['success', 'failed', 'canceled', 'running'])[1 + i % 4],
		       CASE WHEN i % 4 = 1 THEN 'script_failure' END,
		       now() - interval '1 hour', CASE WHEN i % 4 <> 3 THEN now() END
		FROM generate_series(1, $2) i`, project, n)
	require.NoError(t, err)
	builds, err := db.New(pool).ExportBuildsPage(ctx, db.ExportBuildsPageParams{ProjectID: project, MaxRows: int32(n + 1)})
	require.NoError(t, err)
	require.Len(t, builds, n)
	return builds
}

// readArchive reads an export archive back: the project record and the
// ci_builds records, checking that every line is a known relation.
func readArchive(t *testing.T, path string) (exports.ExportProjectRecord, []*db.CiBuild) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	gz, err := gzip.NewReader(f)
	require.NoError(t, err)
	sc := bufio.NewScanner(gz)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var project exports.ExportProjectRecord
	var builds []*db.CiBuild
	lines := 0
	for sc.Scan() {
		var line exports.ExportLine
		require.NoError(t, json.Unmarshal(sc.Bytes(), &line), "line %d", lines+1)
		switch line.Relation {
		case exports.RelationProject:
			require.Zero(t, lines, "the project record comes first")
			require.NoError(t, json.Unmarshal(line.Record, &project))
		case exports.RelationCIBuilds:
			var b db.CiBuild
			require.NoError(t, json.Unmarshal(line.Record, &b))
			builds = append(builds, &b)
		default:
			t.Fatalf("line %d: unknown relation %q", lines+1, line.Relation)
		}
		lines++
	}
	require.NoError(t, sc.Err())
	require.NoError(t, gz.Close())
	return project, builds
}

// requireSameBuilds compares builds read back from an archive with the rows.
func requireSameBuilds(t *testing.T, want, got []*db.CiBuild) {
	t.Helper()
	require.Len(t, got, len(want))
	for i := range want {
		w, g := *want[i], *got[i]
		require.True(t, w.CreatedAt.Equal(g.CreatedAt), "build %d created_at", w.ID)
		require.True(t, w.UpdatedAt.Equal(g.UpdatedAt), "build %d updated_at", w.ID)
		require.Equal(t, w.StartedAt == nil, g.StartedAt == nil)
		require.Equal(t, w.FinishedAt == nil, g.FinishedAt == nil)
		w.CreatedAt, w.UpdatedAt, w.StartedAt, w.FinishedAt = time.Time{}, time.Time{}, nil, nil
		g.CreatedAt, g.UpdatedAt, g.StartedAt, g.FinishedAt = time.Time{}, time.Time{}, nil, nil
		require.Equal(t, w, g)
	}
}

// enqueue starts an export of project through Enqueue and
// waits for its River job to finish.
func (e *exportEnv) enqueue(project int64, parallel bool) (*db.ProjectExportJob, *rivertype.JobRow) {
	e.t.Helper()
	client := e.river()
	export, err := exports.Enqueue(e.ctx, e.pool, client.Client, project, parallel)
	require.NoError(e.t, err)
	require.Equal(e.t, exports.ExportQueued, export.Status)
	job := client.WaitFinished(e.t, 60*time.Second, *export.JobID)[*export.JobID].Job
	return e.row(export.ID), job
}

func TestExportProject(t *testing.T) {
	t.Parallel()

	e := newExportEnv(t)
	builds := seedBuilds(t, e.pool, 42, 2500) // several pages
	seedBuilds(t, e.pool, 43, 10)             // another project's

	t.Run("exports the project's ci_builds", func(t *testing.T) {
		row, job := e.enqueue(42, false)
		require.Equal(t, rivertype.JobStateCompleted, job.State)
		require.Equal(t, exports.ExportFinished, row.Status)
		require.Equal(t, job.ID, *row.JobID)
		require.NotNil(t, row.StartedAt)
		require.NotNil(t, row.FinishedAt)
		require.Nil(t, row.Error)
		require.EqualValues(t, 1+len(builds), *row.Records)
		require.Equal(t, filepath.Join(e.dir, exports.ExportArchiveName(42, row.ID)), *row.ArchivePath)

		project, got := readArchive(t, *row.ArchivePath)
		require.EqualValues(t, 42, project.ProjectID)
		require.Equal(t, row.ID, project.ExportJobID)
		requireSameBuilds(t, builds, got)

		rels, err := db.New(e.pool).ListRelationExports(e.ctx, row.ID)
		require.NoError(t, err)
		require.Empty(t, rels, "a plain export has no relation exports")
		// Only the archive is left in the directory: no temporary files.
		entries, err := os.ReadDir(e.dir)
		require.NoError(t, err)
		for _, entry := range entries {
			require.Regexp(t, `^project-\d+-export-\d+\.ndjson\.gz$`, entry.Name())
		}
	})

	t.Run("parallel export finishes one relation export per relation", func(t *testing.T) {
		row, _ := e.enqueue(42, true)
		require.Equal(t, exports.ExportFinished, row.Status)
		rels, err := db.New(e.pool).ListRelationExports(e.ctx, row.ID)
		require.NoError(t, err)
		require.Len(t, rels, len(exports.ExportRelations()))
		records := map[string]int64{}
		for _, r := range rels {
			require.Equal(t, exports.ExportFinished, r.Status)
			records[r.Relation] = *r.Records
		}
		require.Equal(t, map[string]int64{exports.RelationProject: 1, exports.RelationCIBuilds: int64(len(builds))}, records)
		_, got := readArchive(t, *row.ArchivePath)
		requireSameBuilds(t, builds, got)
	})

	t.Run("a project without builds exports its project record", func(t *testing.T) {
		row, _ := e.enqueue(777, false)
		require.Equal(t, exports.ExportFinished, row.Status)
		project, got := readArchive(t, *row.ArchivePath)
		require.EqualValues(t, 777, project.ProjectID)
		require.Empty(t, got)
	})

	require.EqualValues(t, 3, e.metric("sluice_project_exports_total", map[string]string{"status": exports.ExportFinished}))
}

// TestExportProjectIdempotent covers jobs that find their export row in an
// unexpected state.
func TestExportProjectIdempotent(t *testing.T) {
	t.Parallel()

	e := newExportEnv(t)
	seedBuilds(t, e.pool, 5, 20)
	client := e.river()

	t.Run("missing export row: cancelled", func(t *testing.T) {
		job := client.InsertAndWait(t, exports.ProjectArgs{ExportJobID: 999999}, nil)
		require.Equal(t, rivertype.JobStateCancelled, job.State)
		require.Contains(t, job.Errors[len(job.Errors)-1].Error, "export job 999999 does not exist")
	})

	t.Run("finished or failed export: completes without touching it", func(t *testing.T) {
		for _, status := range []string{exports.ExportFinished, exports.ExportFailed} {
			id := e.export(status, nil, time.Minute, false)
			before := e.checksum()
			job := client.InsertAndWait(t, exports.ProjectArgs{ExportJobID: id}, nil)
			require.Equal(t, rivertype.JobStateCompleted, job.State)
			require.Equal(t, before, e.checksum())
			_, err := os.Stat(filepath.Join(e.dir, exports.ExportArchiveName(1, id)))
			require.ErrorIs(t, err, os.ErrNotExist)
		}
	})

	t.Run("export owned by another River job: cancelled, row untouched", func(t *testing.T) {
		owner := e.riverJob(string(rivertype.JobStateRunning))
		id := e.export(exports.ExportStarted, &owner, time.Minute, false)
		before := e.checksum()
		job := client.InsertAndWait(t, exports.ProjectArgs{ExportJobID: id}, nil)
		require.Equal(t, rivertype.JobStateCancelled, job.State)
		require.Contains(t, job.Errors[len(job.Errors)-1].Error, "belongs to River job")
		require.Equal(t, before, e.checksum())
	})

	t.Run("export without a River job is claimed", func(t *testing.T) {
		id := e.export(exports.ExportQueued, nil, time.Minute, false)
		job := client.InsertAndWait(t, exports.ProjectArgs{ExportJobID: id}, nil)
		require.Equal(t, rivertype.JobStateCompleted, job.State)
		row := e.row(id)
		require.Equal(t, exports.ExportFinished, row.Status)
		require.Equal(t, job.ID, *row.JobID)
	})

	t.Run("retry after a crashed attempt redoes the export", func(t *testing.T) {
		// As a crashed attempt leaves it: row started, a half-written
		// temporary archive, then River retries the same job.
		tx, err := e.pool.Begin(e.ctx)
		require.NoError(t, err)
		defer tx.Rollback(e.ctx) //nolint:errcheck
		var id int64
		require.NoError(t, tx.QueryRow(e.ctx, `
			INSERT INTO project_export_jobs (project_id, status, parallel, started_at, error)
			VALUES (5, 'started', true, now(), 'previous attempt died') RETURNING id`).Scan(&id))
		_, err = tx.Exec(e.ctx, `INSERT INTO project_relation_exports (project_export_job_id, relation, status) VALUES ($1, 'ci_builds', 'started')`, id)
		require.NoError(t, err)
		stale := filepath.Join(e.dir, "."+exports.ExportArchiveName(5, id)+".tmp-123")
		require.NoError(t, os.WriteFile(stale, []byte("half an archive"), 0o600))
		res, err := client.InsertTx(e.ctx, tx, exports.ProjectArgs{ExportJobID: id}, nil)
		require.NoError(t, err)
		_, err = tx.Exec(e.ctx, "UPDATE project_export_jobs SET job_id = $2 WHERE id = $1", id, res.Job.ID)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(e.ctx))

		job := client.WaitFinished(t, 60*time.Second, res.Job.ID)[res.Job.ID].Job
		require.Equal(t, rivertype.JobStateCompleted, job.State)
		row := e.row(id)
		require.Equal(t, exports.ExportFinished, row.Status)
		require.Nil(t, row.Error)
		_, got := readArchive(t, *row.ArchivePath)
		require.Len(t, got, 20)
		_, err = os.Stat(stale)
		require.ErrorIs(t, err, os.ErrNotExist, "the stale temporary file is gone")
		rels, err := db.New(e.pool).ListRelationExports(e.ctx, id)
		require.NoError(t, err)
		require.Len(t, rels, 2)
		for _, r := range rels {
			require.Equal(t, exports.ExportFinished, r.Status)
		}
	})
}

// TestExportProjectFailures covers failing attempts: retried with the error
// recorded, failed after the last attempt, failed at once when cancelled.
func TestExportProjectFailures(t *testing.T) {
	t.Parallel()

	t.Run("unwritable directory: error recorded, retried, then finished", func(t *testing.T) {
		t.Parallel()
		e := newExportEnv(t)
		// A file where the export directory should be: MkdirAll fails
		// until it is removed.
		blocker := filepath.Join(t.TempDir(), "exports")
		require.NoError(t, os.WriteFile(blocker, nil, 0o600))
		e.dir = filepath.Join(blocker, "dir")
		client := e.river()
		export, err := exports.Enqueue(e.ctx, e.pool, client.Client, 9, true)
		require.NoError(t, err)

		require.Eventually(t, func() bool {
			row := e.row(export.ID)
			return row.Error != nil
		}, 60*time.Second, 20*time.Millisecond)
		row := e.row(export.ID)
		require.Equal(t, exports.ExportStarted, row.Status, "an attempt that River retries leaves the export started")
		require.Contains(t, *row.Error, "create export directory")

		require.NoError(t, os.Remove(blocker))
		// River's retry comes about a second after the failed attempt.
		var job *rivertype.JobRow
		require.Eventually(t, func() bool {
			job, err = client.JobGet(e.ctx, *export.JobID)
			require.NoError(t, err)
			return job.FinalizedAt != nil
		}, 90*time.Second, 50*time.Millisecond)
		require.Equal(t, rivertype.JobStateCompleted, job.State)
		require.GreaterOrEqual(t, job.Attempt, 2)
		row = e.row(export.ID)
		require.Equal(t, exports.ExportFinished, row.Status)
		require.Nil(t, row.Error)
	})

	t.Run("last attempt fails the export and its relation exports", func(t *testing.T) {
		t.Parallel()
		e := newExportEnv(t)
		blocker := filepath.Join(t.TempDir(), "exports")
		require.NoError(t, os.WriteFile(blocker, nil, 0o600))
		e.dir = filepath.Join(blocker, "dir")
		id := e.export(exports.ExportQueued, nil, time.Minute, false)
		_, err := e.pool.Exec(e.ctx, "UPDATE project_export_jobs SET parallel = true WHERE id = $1", id)
		require.NoError(t, err)
		job := e.river().InsertAndWait(t, exports.ProjectArgs{ExportJobID: id}, &river.InsertOpts{MaxAttempts: 1})
		require.Equal(t, rivertype.JobStateDiscarded, job.State)
		row := e.row(id)
		require.Equal(t, exports.ExportFailed, row.Status)
		require.Contains(t, *row.Error, "create export directory")
		require.NotNil(t, row.FinishedAt)
		rels, err := db.New(e.pool).ListRelationExports(e.ctx, id)
		require.NoError(t, err)
		require.Len(t, rels, 2)
		for _, r := range rels {
			require.Equal(t, exports.ExportFailed, r.Status)
		}
		require.EqualValues(t, 1, e.metric("sluice_project_exports_total", map[string]string{"status": exports.ExportFailed}))
		require.Contains(t, e.logs.String(), `"msg":"project export failed"`)
	})

	t.Run("cancelled while reading: failed at once", func(t *testing.T) {
		t.Parallel()
		e := newExportEnv(t)
		seedBuilds(t, e.pool, 3, 10)
		// Hold ci_builds so the export blocks on its first read.
		lockTx, err := e.pool.Begin(e.ctx)
		require.NoError(t, err)
		defer lockTx.Rollback(e.ctx) //nolint:errcheck
		_, err = lockTx.Exec(e.ctx, "LOCK TABLE ci_builds IN ACCESS EXCLUSIVE MODE")
		require.NoError(t, err)

		client := e.river()
		export, err := exports.Enqueue(e.ctx, e.pool, client.Client, 3, false)
		require.NoError(t, err)
		require.Eventually(t, func() bool { return e.status(export.ID) == exports.ExportStarted }, 60*time.Second, 10*time.Millisecond)
		_, err = client.JobCancel(e.ctx, *export.JobID)
		require.NoError(t, err)
		job := client.WaitFinished(t, 60*time.Second, *export.JobID)[*export.JobID].Job
		require.Equal(t, rivertype.JobStateCancelled, job.State)
		row := e.row(export.ID)
		require.Equal(t, exports.ExportFailed, row.Status)
		require.Contains(t, *row.Error, "cancelled")
	})
}

func TestExportProjectArgs(t *testing.T) {
	t.Parallel()

	registry := jobtest.Registry(t)
	args, err := registry.Decode("export.project", []byte(`{"export_job_id": 7}`))
	require.NoError(t, err)
	require.Equal(t, exports.ProjectArgs{ExportJobID: 7}, args)
	for _, raw := range []string{`{}`, `{"export_job_id": 0}`, `{"export_job_id": -3}`} {
		_, err := registry.Decode("export.project", []byte(raw))
		require.ErrorContains(t, err, `field "export_job_id": must be a positive export job id`, raw)
	}
	_, err = registry.Decode("export.project", []byte(`{"export_job_id": "7"}`))
	require.ErrorContains(t, err, `field "export_job_id"`)
	_, err = registry.Decode("export.stuck_jobs", []byte(`{"now": true}`))
	require.ErrorContains(t, err, `unknown field "now"`)
}
