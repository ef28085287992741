package cibuilds_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/internal/testlog"
	"github.com/sluice-dev/sluice/maintenance"
	"github.com/sluice-dev/sluice/modules/cibuilds"
	"github.com/sluice-dev/sluice/settings"
)

// stuckSweep names one of the four sweeps for table-driven tests.
type stuckSweep struct {
	kind    string
	status  string
	reason  string
	message string
	setting string
	timeout time.Duration
}

func stuckSweeps() []stuckSweep {
	return []stuckSweep{
		{"ci.drop_canceling_builds", "canceling", "stuck_or_timeout_failure", "Cleaning canceling, timed-out builds",
			cibuilds.Canceling.TimeoutSetting, cibuilds.Canceling.DefaultTimeout},
		{"ci.drop_running_builds", "running", "stuck_or_timeout_failure", "Cleaning running, timed-out builds",
			cibuilds.Running.TimeoutSetting, cibuilds.Running.DefaultTimeout},
		{"ci.drop_scheduled_builds", "scheduled", "stale_schedule", "Cleaning scheduled, timed-out builds",
			cibuilds.Scheduled.TimeoutSetting, cibuilds.Scheduled.DefaultTimeout},
		{"ci.drop_pending_builds", "pending", "stuck_or_timeout_failure", "Cleaning pending timed-out builds",
			cibuilds.Pending.TimeoutSetting, cibuilds.Pending.DefaultTimeout},
	}
}

// buildStatuses is GitLab's status vocabulary, as ci_builds accepts it.
func buildStatuses() []string {
	return []string{"created", "waiting_for_resource", "preparing", "pending", "running",
		"canceling", "canceled", "success", "failed", "skipped", "manual", "scheduled"}
}

// buildSpec describes a build to insert; ages are relative to the
// database's now().
type buildSpec struct {
	status    string
	created   time.Duration
	updated   time.Duration
	scheduled *time.Duration // nil: no scheduled_at; negative: in the future
	finished  bool           // finished_at already set (a day ago)
	lockVer   int32
}

func ago(d time.Duration) *time.Duration { return &d }

func insertBuild(tb testing.TB, pool *pgxpool.Pool, s buildSpec) int64 {
	tb.Helper()
	var id int64
	err := pool.QueryRow(context.Background(), `
		INSERT INTO ci_builds (project_id, pipeline_id, runner_id, name, stage, status,
		                       created_at, updated_at, scheduled_at, finished_at, lock_version)
		VALUES (7, 70, 700, 'rspec', 'test', $1, now() - $2::interval, now() - $3::interval,
		        now() - $4::interval, CASE WHEN $5::bool THEN now() - interval '1 day' END, $6)
		RETURNING id`,
		s.status, s.created, s.updated, s.scheduled, s.finished, s.lockVer).Scan(&id)
	require.NoError(tb, err)
	return id
}

// insertStuck inserts n builds in status that every sweep of status
// considers stuck (all timestamps three days old) and returns their ids in
// sweep order.
func insertStuck(tb testing.TB, pool *pgxpool.Pool, status string, n int) []int64 {
	tb.Helper()
	rows, err := pool.Query(context.Background(), `
		INSERT INTO ci_builds (project_id, pipeline_id, runner_id, name, stage, status,
		                       created_at, updated_at, scheduled_at)
		SELECT 1000 + g % 7, 100 + g, 900, 'job ' || g, 'test', $1,
		       now() - interval '3 days' + g * interval '1 second', now() - interval '3 days',
		       now() - interval '3 days'
		FROM generate_series(1, $2::int) AS g
		RETURNING id`, status, n)
	require.NoError(tb, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(tb, err)
	return ids
}

func getBuild(tb testing.TB, pool *pgxpool.Pool, id int64) *db.CiBuild {
	tb.Helper()
	b, err := db.New(pool).GetCIBuild(context.Background(), id)
	require.NoError(tb, err)
	return b
}

var jobIDs atomic.Int64

// sweepEnv is what the sweep tests work with: the pool, the settings, the
// sweeps' metrics and a logger a test may replace before it sweeps.
type sweepEnv struct {
	Pool     *pgxpool.Pool
	Logger   *slog.Logger
	Settings *settings.Settings
	Metrics  *cibuilds.Metrics
}

func newSweepEnv(tb testing.TB, pool *pgxpool.Pool) *sweepEnv {
	tb.Helper()
	metrics, err := cibuilds.NewMetrics(nil)
	require.NoError(tb, err)
	return &sweepEnv{Pool: pool, Logger: jobtest.Logger(tb), Settings: settings.New(pool), Metrics: metrics}
}

// sweeper returns a sweeper on e calling beforeDrop before every drop
// attempt (nil: none).
func (e *sweepEnv) sweeper(tb testing.TB, beforeDrop func(ctx context.Context, ids []int64, attempt int)) *cibuilds.Sweeper {
	tb.Helper()
	sw, err := cibuilds.NewSweeper(cibuilds.SweeperConfig{Pool: e.Pool, Settings: e.Settings, Logger: e.Logger, Metrics: e.Metrics, BeforeDrop: beforeDrop})
	require.NoError(tb, err)
	return sw
}

// sweepOnce works one job of kind in this goroutine (as River would: under
// the maintenance framework) and returns the maintenance run it recorded,
// with its details decoded.
func sweepOnce(tb testing.TB, ctx context.Context, deps *sweepEnv, kind string) (*db.MaintenanceRun, map[string]any, error) {
	tb.Helper()
	return sweepOnceHook(tb, ctx, deps, kind, nil)
}

// sweepOnceHook is sweepOnce with beforeDrop called before every drop
// attempt.
func sweepOnceHook(tb testing.TB, ctx context.Context, deps *sweepEnv, kind string, beforeDrop func(ctx context.Context, ids []int64, attempt int)) (*db.MaintenanceRun, map[string]any, error) {
	tb.Helper()
	jobID := 1_000_000 + jobIDs.Add(1)
	runner, err := maintenance.NewRunner(maintenance.Config{Pool: deps.Pool, Logger: deps.Logger})
	require.NoError(tb, err)
	sw := deps.sweeper(tb, beforeDrop)
	err = runner.Run(ctx, &rivertype.JobRow{ID: jobID, Kind: kind}, func(ctx context.Context) (maintenance.Result, error) {
		return sw.Sweep(ctx, cibuilds.SweepOf(kind))
	})
	run, qErr := db.New(deps.Pool).GetMaintenanceRunByJob(context.Background(), &jobID)
	require.NoError(tb, qErr)
	var details map[string]any
	require.NoError(tb, json.Unmarshal(run.Details, &details))
	return run, details, err
}

// logBuffer collects JSON log lines, safe for concurrent writers.
type logBuffer struct {
	testlog.Buffer
}

// entries returns the decoded log lines whose msg is msg.
func (l *logBuffer) entries(tb testing.TB, msg string) []map[string]any {
	tb.Helper()
	var out []map[string]any
	for _, line := range strings.Split(l.String(), "\n") {
		if line == "" {
			continue
		}
		var e map[string]any
		require.NoError(tb, json.Unmarshal([]byte(line), &e), line)
		if e["msg"] == msg {
			out = append(out, e)
		}
	}
	return out
}

// queryLog is a pgx tracer that records the statements whose SQL starts with
// prefix, with their arguments.
type queryLog struct {
	prefix string
	mu     sync.Mutex
	calls  []tracedQuery
}

type tracedQuery struct {
	sql  string
	args []any
}

func (l *queryLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.HasPrefix(data.SQL, l.prefix) {
		l.mu.Lock()
		l.calls = append(l.calls, tracedQuery{sql: data.SQL, args: append([]any(nil), data.Args...)})
		l.mu.Unlock()
	}
	return ctx
}

func (l *queryLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (l *queryLog) take() []tracedQuery {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.calls
	l.calls = nil
	return out
}

// tracedPool opens a pool on url whose statements starting with prefix are
// recorded in the returned log.
func tracedPool(tb testing.TB, url, prefix string) (*pgxpool.Pool, *queryLog) {
	tb.Helper()
	cfg, err := testdb.PoolConfig(url)
	require.NoError(tb, err)
	log := &queryLog{prefix: prefix}
	cfg.ConnConfig.Tracer = log
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(tb, err)
	tb.Cleanup(pool.Close)
	return pool, log
}

// explain returns the plans of q: the custom plan for its arguments and the
// generic plan Postgres may switch to for a prepared statement (pgx prepares
// and caches the statements it runs).
func explain(tb testing.TB, pool *pgxpool.Pool, q tracedQuery) (custom, generic string) {
	tb.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	require.NoError(tb, err)
	defer conn.Release()
	lines := func(sql string, args ...any) string {
		rows, err := conn.Query(ctx, sql, args...)
		require.NoError(tb, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(tb, err)
		return strings.Join(out, "\n")
	}
	custom = lines("EXPLAIN "+q.sql, q.args...)

	_, err = conn.Exec(ctx, "PREPARE sweep_select AS "+q.sql)
	require.NoError(tb, err)
	defer conn.Exec(ctx, "DEALLOCATE sweep_select; RESET plan_cache_mode") //nolint:errcheck
	_, err = conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan")
	require.NoError(tb, err)
	literals := make([]string, len(q.args))
	for i, a := range q.args {
		literals[i] = sqlLiteral(tb, a)
	}
	generic = lines("EXPLAIN EXECUTE sweep_select(" + strings.Join(literals, ", ") + ")")
	return custom, generic
}

// sqlLiteral renders the argument types the sweep selects take as SQL.
func sqlLiteral(tb testing.TB, a any) string {
	tb.Helper()
	switch v := a.(type) {
	case time.Time:
		return "'" + v.Format(time.RFC3339Nano) + "'"
	case *time.Time:
		if v == nil {
			return "NULL"
		}
		return "'" + v.Format(time.RFC3339Nano) + "'"
	case *int64:
		if v == nil {
			return "NULL"
		}
		return fmt.Sprint(*v)
	case int32, int64, int:
		return fmt.Sprint(v)
	}
	tb.Fatalf("sqlLiteral: unexpected argument type %T", a)
	return ""
}
