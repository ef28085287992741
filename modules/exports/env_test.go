package exports_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/internal/testlog"
	"github.com/sluice-dev/sluice/modules/exports"
)

// exportEnv is a fresh database with worker dependencies whose JSON log
// lines go to logs, and (started on first use) a River client working them.
type exportEnv struct {
	t    *testing.T
	ctx  context.Context
	pool *pgxpool.Pool
	// dir is the export directory of the River client's workers; a test
	// may change it before the client starts.
	dir    string
	logs   *testlog.Buffer
	logger *slog.Logger
	// reg holds the metrics of the River client's workers.
	reg    *prometheus.Registry
	client *jobtest.Client
	// deps are the module's dependencies for the tests that call the sweep
	// directly.
	deps *exports.TestDeps
}

func newExportEnv(t *testing.T) *exportEnv {
	t.Helper()
	pool := testdb.NewPool(t)
	logs := &testlog.Buffer{}
	logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	deps, err := exports.NewTestDeps(pool, logger, nil)
	require.NoError(t, err)
	return &exportEnv{t: t, ctx: context.Background(), pool: pool, dir: t.TempDir(), logs: logs, logger: logger, deps: deps}
}

// river returns the env's River client, started on first use.
func (e *exportEnv) river() *jobtest.Client {
	if e.client == nil {
		var j *app.Jobs
		j, e.reg = jobtest.NewJobsConfig(e.t, e.pool, app.JobsConfig{Logger: e.logger, Program: jobtest.ProgramExportingTo(e.dir)})
		e.client = jobtest.Start(e.t, e.pool, j, jobtest.Config{})
	}
	return e.client
}

// metric is the value of the counter name with labels of the River
// client's workers.
func (e *exportEnv) metric(name string, labels map[string]string) float64 {
	e.t.Helper()
	e.river()
	return jobtest.MetricValue(e.t, e.reg, name, labels)
}

// pruned stands for a River job that no longer exists.
const pruned = "pruned"

// riverJob inserts an export.project River job in state in a queue no
// client works, so it stays as it is; pruned inserts one and deletes it.
func (e *exportEnv) riverJob(state string) int64 {
	e.t.Helper()
	var id int64
	st := state
	if state == pruned {
		st = string(rivertype.JobStateCompleted)
	}
	err := e.pool.QueryRow(e.ctx, `
		INSERT INTO river_job (kind, args, state, max_attempts, queue, attempt, attempted_at, scheduled_at, finalized_at)
		VALUES ('export.project', '{"export_job_id": 1}', $1::river_job_state, 3, 'not_worked',
		        CASE WHEN $1 IN ('available', 'scheduled', 'pending') THEN 0 ELSE 1 END,
		        CASE WHEN $1 IN ('available', 'scheduled', 'pending') THEN NULL ELSE now() END,
		        CASE WHEN $1 IN ('scheduled', 'retryable') THEN now() + interval '1 hour' ELSE now() END,
		        CASE WHEN $1 IN ('completed', 'cancelled', 'discarded') THEN now() END)
		RETURNING id`, st).Scan(&id)
	require.NoError(e.t, err)
	if state == pruned {
		_, err := e.pool.Exec(e.ctx, "DELETE FROM river_job WHERE id = $1", id)
		require.NoError(e.t, err)
	}
	return id
}

// export inserts a project_export_jobs row of project 1 created age ago,
// with a relation export per relation when relations is set.
func (e *exportEnv) export(status string, jobID *int64, age time.Duration, relations bool) int64 {
	e.t.Helper()
	var id int64
	err := e.pool.QueryRow(e.ctx, `
		INSERT INTO project_export_jobs (project_id, job_id, status, parallel, created_at, updated_at)
		VALUES (1, $1, $2, $3, now() - make_interval(secs => $4), now() - make_interval(secs => $4))
		RETURNING id`, jobID, status, relations, age.Seconds()).Scan(&id)
	require.NoError(e.t, err)
	if relations {
		_, err := e.pool.Exec(e.ctx, `
			INSERT INTO project_relation_exports (project_export_job_id, relation, status)
			SELECT $1, r, 'started' FROM unnest($2::text[]) r`, id, exports.ExportRelations())
		require.NoError(e.t, err)
	}
	return id
}

// exportFor inserts a River job in state and an export in status pointing at
// it; it returns the export's id.
func (e *exportEnv) exportFor(status, state string) int64 {
	e.t.Helper()
	jobID := e.riverJob(state)
	return e.export(status, &jobID, time.Minute, false)
}

func (e *exportEnv) row(id int64) *db.ProjectExportJob {
	e.t.Helper()
	row, err := db.New(e.pool).GetProjectExportJob(e.ctx, id)
	require.NoError(e.t, err)
	return row
}

func (e *exportEnv) status(id int64) string {
	e.t.Helper()
	return e.row(id).Status
}

// sweep runs export.stuck_jobs through the River client and returns the
// maintenance run it recorded.
func (e *exportEnv) sweep() *db.MaintenanceRun {
	e.t.Helper()
	job := e.river().InsertAndWait(e.t, exports.StuckJobsArgs{}, nil)
	require.Equal(e.t, rivertype.JobStateCompleted, job.State, "export.stuck_jobs errors: %v", job.Errors)
	run, err := db.New(e.pool).GetMaintenanceRunByJob(e.ctx, &job.ID)
	require.NoError(e.t, err)
	return run
}

// checksum fingerprints the export tables.
func (e *exportEnv) checksum() string {
	e.t.Helper()
	return testdb.Checksum(e.t, e.pool, "project_export_jobs", "project_relation_exports")
}
