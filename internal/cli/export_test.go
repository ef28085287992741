package cli

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/modules/exports"
)

// exportTables are the tables a rejected `sluice export` must not change.
var exportTables = []string{"river_job", "project_export_jobs", "project_relation_exports", "settings", "maintenance_runs"}

var exportOutputRE = regexp.MustCompile(`^export job (\d+) of project (\d+) queued( \(parallel\))?: River job (\d+) \(export\.project\)\n$`)

// startExport runs `sluice export` and returns the export job id and River
// job id it printed.
func startExport(t *testing.T, url string, args ...string) (exportID, jobID int64) {
	t.Helper()
	code, out := sluice(t, url, append([]string{"export"}, args...)...)
	require.Equal(t, 0, code, out)
	m := exportOutputRE.FindStringSubmatch(out)
	require.NotNil(t, m, "output %q", out)
	exportID, _ = strconv.ParseInt(m[1], 10, 64)
	jobID, _ = strconv.ParseInt(m[4], 10, 64)
	return exportID, jobID
}

func exportRow(t *testing.T, pool *pgxpool.Pool, id int64) *db.ProjectExportJob {
	t.Helper()
	row, err := db.New(pool).GetProjectExportJob(context.Background(), id)
	require.NoError(t, err)
	return row
}

func waitExportStatus(t *testing.T, pool *pgxpool.Pool, id int64, status string) *db.ProjectExportJob {
	t.Helper()
	var row *db.ProjectExportJob
	require.Eventually(t, func() bool {
		row = exportRow(t, pool, id)
		return row.Status == status
	}, 60*time.Second, 20*time.Millisecond, "export %d never became %s", id, status)
	return row
}

// archiveBuilds reads an archive back: its project record and the ids and
// names of its ci_builds records.
func archiveBuilds(t *testing.T, path string) (exports.ExportProjectRecord, []int64, []string) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	gz, err := gzip.NewReader(f)
	require.NoError(t, err)
	var project exports.ExportProjectRecord
	var ids []int64
	var names []string
	sc := bufio.NewScanner(gz)
	for n := 0; sc.Scan(); n++ {
		var line exports.ExportLine
		require.NoError(t, json.Unmarshal(sc.Bytes(), &line))
		if n == 0 {
			require.Equal(t, exports.RelationProject, line.Relation)
			require.NoError(t, json.Unmarshal(line.Record, &project))
			continue
		}
		require.Equal(t, exports.RelationCIBuilds, line.Relation)
		var b db.CiBuild
		require.NoError(t, json.Unmarshal(line.Record, &b))
		ids = append(ids, b.ID)
		names = append(names, b.Name)
	}
	require.NoError(t, sc.Err())
	return project, ids, names
}

// TestExportEndToEnd runs the whole flow through the binary: `sluice export`
// inserts the row and River job, a `sluice worker` process writes the
// archive, and the sweep leaves the finished exports alone.
func TestExportEndToEnd(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	pool, err := pgkit.Open(ctx, url, 10*time.Second)
	require.NoError(t, err)
	defer pool.Close()
	_, err = pool.Exec(ctx, `
		INSERT INTO ci_builds (project_id, name, status)
		SELECT p, 'job ' || p || '/' || i, 'success' FROM generate_series(1, 1500) i, (VALUES (42), (43)) v(p)`)
	require.NoError(t, err)
	var wantIDs []int64
	var wantNames []string
	rows, err := pool.Query(ctx, "SELECT id, name FROM ci_builds WHERE project_id = 42 ORDER BY id")
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		var name string
		require.NoError(t, rows.Scan(&id, &name))
		wantIDs, wantNames = append(wantIDs, id), append(wantNames, name)
	}
	require.NoError(t, rows.Err())

	// The row and its River job exist, pointing at each other, before any
	// worker runs.
	plainID, plainJob := startExport(t, url, "42")
	row := exportRow(t, pool, plainID)
	require.Equal(t, exports.ExportQueued, row.Status)
	require.EqualValues(t, 42, row.ProjectID)
	require.Equal(t, plainJob, *row.JobID)
	var kind, args string
	require.NoError(t, pool.QueryRow(ctx, "SELECT kind, args::text FROM river_job WHERE id = $1", plainJob).Scan(&kind, &args))
	require.Equal(t, "export.project", kind)
	require.JSONEq(t, `{"export_job_id": `+strconv.FormatInt(plainID, 10)+`}`, args)
	parallelID, _ := startExport(t, url, "42", "--parallel")

	dir := t.TempDir()
	worker := startWorkerProcess(t, url, "SLUICE_EXPORT_DIR="+dir)

	for _, id := range []int64{plainID, parallelID} {
		row := waitExportStatus(t, pool, id, exports.ExportFinished)
		require.Equal(t, filepath.Join(dir, exports.ExportArchiveName(42, id)), *row.ArchivePath)
		project, ids, names := archiveBuilds(t, *row.ArchivePath)
		require.EqualValues(t, 42, project.ProjectID)
		require.Equal(t, id, project.ExportJobID)
		require.Equal(t, wantIDs, ids)
		require.Equal(t, wantNames, names)
		require.EqualValues(t, 1+len(wantIDs), *row.Records)
		var state string
		require.NoError(t, pool.QueryRow(ctx, "SELECT state FROM river_job WHERE id = $1", *row.JobID).Scan(&state))
		require.Equal(t, "completed", state)
	}
	rels, err := db.New(pool).ListRelationExports(ctx, parallelID)
	require.NoError(t, err)
	require.Len(t, rels, 2)
	for _, r := range rels {
		require.Equal(t, exports.ExportFinished, r.Status)
	}

	// Finished exports are not stuck, even once their River jobs are gone.
	_, err = pool.Exec(ctx, "DELETE FROM river_job WHERE kind = 'export.project'")
	require.NoError(t, err)
	code, out := sluice(t, url, "run", "export.stuck_jobs")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "succeeded, affected 0")
	require.Equal(t, exports.ExportFinished, exportRow(t, pool, plainID).Status)

	require.NoError(t, worker.Process.Signal(syscall.SIGTERM))
	require.NoError(t, worker.Wait())
}

// TestExportKilledWorkerSwept kills a worker process (SIGKILL) while it runs
// an export: the export stays started while its River job is running, and
// once the River job is final (discarded, as River's rescuer does after the
// last attempt) export.stuck_jobs marks it failed.
func TestExportKilledWorkerSwept(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	pool, err := pgkit.Open(ctx, url, 10*time.Second)
	require.NoError(t, err)
	defer pool.Close()
	_, err = pool.Exec(ctx, "INSERT INTO ci_builds (project_id, name) SELECT 7, 'b' || i FROM generate_series(1, 100) i")
	require.NoError(t, err)

	// Hold ci_builds so the export blocks mid-way, after it started.
	lockTx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer lockTx.Rollback(ctx) //nolint:errcheck
	_, err = lockTx.Exec(ctx, "LOCK TABLE ci_builds IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)

	dir := t.TempDir()
	exportID, jobID := startExport(t, url, "7")
	worker := startWorkerProcess(t, url, "SLUICE_EXPORT_DIR="+dir)
	waitExportStatus(t, pool, exportID, exports.ExportStarted)
	require.Eventually(t, func() bool {
		var waiting int
		require.NoError(t, pool.QueryRow(ctx, `
			SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND application_name LIKE 'sluice worker%'`).Scan(&waiting))
		return waiting > 0
	}, 30*time.Second, 20*time.Millisecond, "the export never blocked reading ci_builds")

	require.NoError(t, worker.Process.Signal(syscall.SIGKILL))
	_ = worker.Wait()
	require.NoError(t, lockTx.Rollback(ctx))

	var state string
	require.NoError(t, pool.QueryRow(ctx, "SELECT state FROM river_job WHERE id = $1", jobID).Scan(&state))
	require.Equal(t, "running", state, "nobody has rescued the dead worker's job yet")

	// While River still has the job running, the export is not stuck.
	code, out := sluice(t, url, "run", "export.stuck_jobs")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "affected 0")
	require.Equal(t, exports.ExportStarted, exportRow(t, pool, exportID).Status)

	// River's rescuer discards a stuck job that has used its attempts.
	_, err = pool.Exec(ctx, "UPDATE river_job SET state = 'discarded', finalized_at = now() WHERE id = $1", jobID)
	require.NoError(t, err)
	code, out = sluice(t, url, "run", "export.stuck_jobs")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "succeeded, affected 1")
	row := exportRow(t, pool, exportID)
	require.Equal(t, exports.ExportFailed, row.Status)
	require.Contains(t, *row.Error, "stuck")
	require.Nil(t, row.ArchivePath)
	_, err = os.Stat(filepath.Join(dir, exports.ExportArchiveName(7, exportID)))
	require.ErrorIs(t, err, os.ErrNotExist, "no archive was published")
}

// TestExportBadInput: every malformed `sluice export` (and export.project
// args) exits 2 with a one-line reason and writes nothing; an unreachable
// database exits 1 without leaking the password.
func TestExportBadInput(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	pool, err := pgkit.Open(context.Background(), url, 10*time.Second)
	require.NoError(t, err)
	defer pool.Close()
	before := testdb.Checksum(t, pool, exportTables...)

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no project", []string{"export"}, "expects a PROJECT_ID"},
		{"two projects", []string{"export", "1", "2"}, "expects a PROJECT_ID"},
		{"zero", []string{"export", "0"}, `invalid PROJECT_ID "0": want a positive integer`},
		{"negative", []string{"export", "--", "-5"}, `invalid PROJECT_ID "-5"`},
		{"not a number", []string{"export", "abc"}, `invalid PROJECT_ID "abc"`},
		{"fraction", []string{"export", "1.5"}, `invalid PROJECT_ID "1.5"`},
		{"overflow", []string{"export", "99999999999999999999"}, `invalid PROJECT_ID "99999999999999999999"`},
		{"bad flag value", []string{"export", "1", "--parallel=maybe"}, "invalid argument"},
		{"unknown flag", []string{"export", "1", "--serial"}, "unknown flag: --serial"},
		{"run without export_job_id", []string{"run", "export.project"}, `field "export_job_id": must be a positive export job id`},
		{"enqueue zero export_job_id", []string{"enqueue", "export.project", "--args", `{"export_job_id": 0}`}, `field "export_job_id"`},
		{"stuck_jobs with args", []string{"run", "export.stuck_jobs", "--args", `{"grace": "1h"}`}, `unknown field "grace"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, append([]string{"--database-url", url}, tc.args...)...)
			require.Equal(t, 2, code, "stdout=%q stderr=%q", stdout, stderr)
			require.True(t, strings.HasPrefix(stderr, "sluice: "), stderr)
			require.Contains(t, strings.SplitN(stderr, "\n", 2)[0], tc.want)
			require.Empty(t, stdout)
		})
	}
	require.Equal(t, before, testdb.Checksum(t, pool, exportTables...), "a rejected export changed the database")

	cmd := exec.Command(sluiceBin, "export", "5")
	cmd.Env = append(os.Environ(), "DATABASE_URL=postgres://bob:s3cretpw@127.0.0.1:1/x?connect_timeout=2")
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	require.ErrorAs(t, err, &exitErr, "%s", out)
	require.Equal(t, 1, exitErr.ExitCode(), "%s", out)
	require.NotContains(t, string(out), "s3cretpw")
}
