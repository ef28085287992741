package taskcancel_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/maintenance"
	"github.com/sluice-dev/sluice/migrations"
	"github.com/sluice-dev/sluice/modules"
	"github.com/sluice-dev/sluice/modules/demo"
	"github.com/sluice-dev/sluice/modules/taskcancel"
	"github.com/sluice-dev/sluice/settings"
)

// statementRecorder is a pgx tracer that records every SQL statement a pool
// sends.
type statementRecorder struct {
	mu   sync.Mutex
	sqls []string
}

func (r *statementRecorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sqls = append(r.sqls, data.SQL)
	return ctx
}

func (r *statementRecorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *statementRecorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.sqls
	r.sqls = nil
	return out
}

// riverJobScans is how often river_job was scanned (sequentially or by an
// index) in the database of pool, after the backend of monitorPool (one
// connection) has flushed its statistics.
func riverJobScans(t *testing.T, pool, monitorPool *pgxpool.Pool) int64 {
	t.Helper()
	ctx := context.Background()
	// pg_stat_force_next_flush (PostgreSQL 15+) makes the backend flush its
	// pending table statistics when this statement's transaction ends,
	// before the statement returns.
	_, err := monitorPool.Exec(ctx, "SELECT pg_stat_force_next_flush()")
	require.NoError(t, err)
	var scans int64
	require.NoError(t, pool.QueryRow(ctx, `
		SELECT COALESCE(sum(COALESCE(seq_scan, 0) + COALESCE(idx_scan, 0)), 0)::bigint
		FROM pg_stat_user_tables WHERE relname = 'river_job'`).Scan(&scans))
	return scans
}

// TestTaskCancellationNothingTrackedReadsNoJobs: with nothing tracked, or
// the monitor disabled, a pass returns at once without querying river_job —
// proven by river_job's scan counters in a fresh database, and by the
// statements sent; a tracked row makes the same measurement move.
func TestTaskCancellationNothingTrackedReadsNoJobs(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	observer, err := pgkit.Open(ctx, url, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(observer.Close)
	var version int
	require.NoError(t, observer.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version))
	if version < 150000 {
		t.Skip("pg_stat_force_next_flush needs PostgreSQL 15")
	}

	// The monitor's pool: one connection, every statement recorded.
	config, err := testdb.PoolConfig(url)
	require.NoError(t, err)
	config.MaxConns = 1
	recorder := &statementRecorder{}
	config.ConnConfig.Tracer = recorder
	monitorPool, err := pgxpool.NewWithConfig(ctx, config)
	require.NoError(t, err)
	t.Cleanup(monitorPool.Close)
	deps := taskcancel.NewMonitor(monitorPool, jobtest.Logger(t))

	before := riverJobScans(t, observer, monitorPool)
	recorder.take()

	for range 3 {
		pass, err := deps.Pass(ctx)
		require.NoError(t, err)
		require.Equal(t, taskcancel.TaskCancellationSkippedEmpty, pass.Skipped)
	}
	setSetting(t, observer, taskcancel.SettingTaskCancellationEnabled, false)
	_, err = observer.Exec(ctx, "INSERT INTO task_cancellation_tracker (job_id, kind, cancelled_at) VALUES (424242, 'x', now())")
	require.NoError(t, err)
	pass, err := deps.Pass(ctx)
	require.NoError(t, err)
	require.Equal(t, taskcancel.TaskCancellationSkippedDisabled, pass.Skipped, "disabled: returns even with rows tracked")

	sqls := recorder.take()
	require.Len(t, sqls, 7, "3 × (enabled setting + tracker look) + 1 × enabled setting: %q", sqls)
	for _, sql := range sqls {
		require.NotContains(t, sql, "river_job")
	}
	require.Equal(t, before, riverJobScans(t, observer, monitorPool), "river_job was read")

	// Control: the same measurement sees the pass that does look.
	setSetting(t, observer, taskcancel.SettingTaskCancellationEnabled, true)
	pass, err = deps.Pass(ctx)
	require.NoError(t, err)
	require.Empty(t, pass.Skipped)
	require.Equal(t, 1, pass.Evicted, "the row of a job that does not exist is evicted")
	require.Greater(t, riverJobScans(t, observer, monitorPool), before)
}

// TestTaskCancellationCountsJobsRunningAfterCancel is OpenSearch's main
// scenario: threshold 0, k of n running jobs cancelled (through River
// directly, not the CLI) → current = total = k; a second run changes
// nothing; once the jobs complete → current 0, total still k, tracker empty.
func TestTaskCancellationCountsJobsRunningAfterCancel(t *testing.T) {
	t.Parallel()

	pool := testdb.NewPool(t)
	env := newCancelEnv(t, pool)
	setSetting(t, pool, taskcancel.SettingTaskCancellationDurationMillis, 0)

	ids := env.startHeld(t, 5)
	cancelled, untouched := ids[:3], ids[3:]
	env.cancel(t, cancelled...)
	require.ElementsMatch(t, cancelled, trackedIDs(t, pool), "the trigger tracks exactly the cancelled jobs")

	job := env.monitorJob(t)
	require.Equal(t, rivertype.JobStateCompleted, job.State)
	require.Equal(t, maintenance.Queue, job.Queue)
	want := taskcancel.TaskCancellationStats{"test.hold": {CurrentCountPostCancel: 3, TotalCountPostCancel: 3}}
	require.Equal(t, want, statsOf(t, pool))
	for _, row := range tracked(t, pool) {
		require.NotNil(t, row.CountedAt, "job %d marked counted", row.JobID)
	}

	// A second run changes nothing: each job is counted once.
	job = env.monitorJob(t)
	require.Equal(t, rivertype.JobStateCompleted, job.State)
	pass := env.monitor(t)
	require.Empty(t, pass.Counted)
	require.Equal(t, want, statsOf(t, pool))

	// The jobs complete: nothing is running after cancellation any more,
	// the total stays and the tracker is empty (onTaskCompleted).
	env.complete(t, cancelled...)
	require.Equal(t, taskcancel.TaskCancellationStats{"test.hold": {CurrentCountPostCancel: 0, TotalCountPostCancel: 3}}, statsOf(t, pool))
	require.Empty(t, tracked(t, pool))
	pass = env.monitor(t)
	require.Equal(t, taskcancel.TaskCancellationSkippedEmpty, pass.Skipped)

	// The jobs never cancelled were never tracked.
	env.complete(t, untouched...)
	require.Equal(t, taskcancel.TaskCancellationStats{"test.hold": {CurrentCountPostCancel: 0, TotalCountPostCancel: 3}}, statsOf(t, pool))
}

// TestTaskCancellationThreshold: only the jobs cancelled at least
// duration_millis ago are counted, the rest later, when they are old
// enough; current follows the same threshold.
func TestTaskCancellationThreshold(t *testing.T) {
	t.Parallel()

	pool := testdb.NewPool(t)
	env := newCancelEnv(t, pool)
	setSetting(t, pool, taskcancel.SettingTaskCancellationDurationMillis, time.Hour.Milliseconds())

	ids := env.startHeld(t, 4)
	env.cancel(t, ids...)
	pass := env.monitor(t)
	require.Empty(t, pass.Counted, "cancelled just now: not an hour ago")
	require.Empty(t, statsOf(t, pool))

	// Two of them were cancelled two hours ago.
	old, recent := ids[:2], ids[2:]
	backdate(t, pool, 2*time.Hour, old...)
	pass = env.monitor(t)
	require.Equal(t, map[string]int64{"test.hold": 2}, pass.Counted)
	require.ElementsMatch(t, old, pass.CountedJobIDs)
	require.Equal(t, taskcancel.TaskCancellationStats{"test.hold": {CurrentCountPostCancel: 2, TotalCountPostCancel: 2}}, statsOf(t, pool))

	// Half an hour later the others are still too young...
	backdate(t, pool, 30*time.Minute, recent...)
	require.Empty(t, env.monitor(t).Counted)
	// ...and an hour later they are counted too.
	backdate(t, pool, 31*time.Minute, recent...)
	pass = env.monitor(t)
	require.ElementsMatch(t, recent, pass.CountedJobIDs)
	require.Equal(t, taskcancel.TaskCancellationStats{"test.hold": {CurrentCountPostCancel: 4, TotalCountPostCancel: 4}}, statsOf(t, pool))

	// Raising the threshold at run time changes current, not the total.
	setSetting(t, pool, taskcancel.SettingTaskCancellationDurationMillis, (3 * time.Hour).Milliseconds())
	require.Equal(t, taskcancel.TaskCancellationStats{"test.hold": {CurrentCountPostCancel: 0, TotalCountPostCancel: 4}}, statsOf(t, pool))
}

// TestTaskCancellationEviction: tracked rows go exactly when their job
// stops running — at once through the trigger, or at the next pass for rows
// the trigger missed.
func TestTaskCancellationEviction(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool := testdb.NewPool(t)
	env := newCancelEnv(t, pool)
	setSetting(t, pool, taskcancel.SettingTaskCancellationDurationMillis, 0)

	ids := env.startHeld(t, 5)
	a, b, c, d, running := ids[0], ids[1], ids[2], ids[3], ids[4]
	env.cancel(t, a, b, c, d)
	env.monitor(t) // a..d counted
	env.complete(t, a)
	require.ElementsMatch(t, []int64{b, c, d}, trackedIDs(t, pool), "the completed job and only it is removed")

	// Rows the trigger did not remove: a job deleted by hand and one that
	// finished while the trigger was disabled.
	_, err := pool.Exec(ctx, "INSERT INTO task_cancellation_tracker (job_id, kind, cancelled_at) VALUES (999999, 'gone', now())")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "ALTER TABLE river_job DISABLE TRIGGER sluice_task_cancellation_untrack")
	require.NoError(t, err)
	env.complete(t, b)
	_, err = pool.Exec(ctx, "ALTER TABLE river_job ENABLE TRIGGER sluice_task_cancellation_untrack")
	require.NoError(t, err)
	require.ElementsMatch(t, []int64{b, c, d, 999999}, trackedIDs(t, pool))

	pass := env.monitor(t)
	require.Equal(t, 2, pass.Evicted)
	require.ElementsMatch(t, []int64{c, d}, trackedIDs(t, pool), "exactly the rows whose job stopped running are evicted")
	require.Equal(t, taskcancel.TaskCancellationStats{"test.hold": {CurrentCountPostCancel: 2, TotalCountPostCancel: 4}}, statsOf(t, pool))

	env.complete(t, c, d, running)
	require.Empty(t, tracked(t, pool))
}

// TestTaskCancellationDisableAtRunTime: setting enabled to false stops the
// counting at the next run; jobs cancelled meanwhile are still tracked and
// counted once it is back on.
func TestTaskCancellationDisableAtRunTime(t *testing.T) {
	t.Parallel()

	pool := testdb.NewPool(t)
	env := newCancelEnv(t, pool)
	setSetting(t, pool, taskcancel.SettingTaskCancellationDurationMillis, 0)

	ids := env.startHeld(t, 2)
	env.cancel(t, ids[0])
	require.Equal(t, map[string]int64{"test.hold": 1}, env.monitor(t).Counted)

	setSetting(t, pool, taskcancel.SettingTaskCancellationEnabled, false)
	env.cancel(t, ids[1])
	pass := env.monitor(t)
	require.Equal(t, taskcancel.TaskCancellationSkippedDisabled, pass.Skipped)
	job := env.monitorJob(t)
	require.Equal(t, rivertype.JobStateCompleted, job.State, "a disabled run completes")
	require.EqualValues(t, 1, statsOf(t, pool)["test.hold"].TotalCountPostCancel)
	require.Nil(t, tracked(t, pool)[ids[1]].CountedAt)

	setSetting(t, pool, taskcancel.SettingTaskCancellationEnabled, true)
	pass = env.monitor(t)
	require.Equal(t, []int64{ids[1]}, pass.CountedJobIDs)
	require.EqualValues(t, 2, statsOf(t, pool)["test.hold"].TotalCountPostCancel)
}

// TestTaskCancellationHonouringJobNeverCounted: a cancelled job that
// returns when its context is cancelled is never counted.
func TestTaskCancellationHonouringJobNeverCounted(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool := testdb.NewPool(t)
	env := newCancelEnv(t, pool)
	setSetting(t, pool, taskcancel.SettingTaskCancellationDurationMillis, time.Hour.Milliseconds())

	res, err := env.client.Insert(ctx, demo.SleepArgs{MS: 600_000}, nil)
	require.NoError(t, err)
	jobtest.WaitRunning(t, env.client, res.Job.ID)
	_, err = env.client.JobCancel(ctx, res.Job.ID)
	require.NoError(t, err)
	require.Empty(t, env.monitor(t).Counted, "cancelled less than an hour ago")

	ev := env.client.WaitFinished(t, 30*time.Second, res.Job.ID)[res.Job.ID]
	require.Equal(t, rivertype.JobStateCancelled, ev.Job.State)
	require.Empty(t, tracked(t, pool), "the job stopped running: no longer tracked")

	setSetting(t, pool, taskcancel.SettingTaskCancellationDurationMillis, 0)
	pass := env.monitor(t)
	require.Equal(t, taskcancel.TaskCancellationSkippedEmpty, pass.Skipped)
	require.Empty(t, statsOf(t, pool))
}

// TestTaskCancellationConcurrentMonitors: several monitors running at once,
// while jobs are being cancelled, count every job exactly once.
func TestTaskCancellationConcurrentMonitors(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool := testdb.NewPool(t)
	env := newCancelEnv(t, pool)
	setSetting(t, pool, taskcancel.SettingTaskCancellationDurationMillis, 0)
	const n = 40
	ids := env.startHeld(t, n)

	// Monitors on separate pools, as in separate worker processes.
	const monitors = 4
	monitorDeps := make([]*taskcancel.Monitor, monitors)
	for i := range monitors {
		p, err := pgkit.Open(ctx, testdb.WithDatabase(testdb.ServerURL(), pool.Config().ConnConfig.Database), 10*time.Second)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		monitorDeps[i] = taskcancel.NewMonitor(p, jobtest.Logger(t))
	}

	done := make(chan struct{})
	var mu sync.Mutex
	counted := map[int64]int{}
	var total int64
	var wg sync.WaitGroup
	errs := make(chan error, monitors)
	for _, deps := range monitorDeps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				pass, err := deps.Pass(ctx)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				for _, id := range pass.CountedJobIDs {
					counted[id]++
				}
				total += pass.Counted["test.hold"]
				mu.Unlock()
			}
		}()
	}
	for _, id := range ids {
		env.cancel(t, id)
	}
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(counted) == n
	}, 60*time.Second, 20*time.Millisecond)
	close(done)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	for _, id := range ids {
		require.Equal(t, 1, counted[id], "job %d counted once", id)
	}
	require.EqualValues(t, n, total)
	require.Equal(t, taskcancel.TaskCancellationStats{"test.hold": {CurrentCountPostCancel: n, TotalCountPostCancel: n}}, statsOf(t, pool))
}

// TestTaskCancellationKinds: with task_cancellation.kinds set, only those
// kinds are counted (and shown, with zeros); the others stay tracked and are
// counted once their kind is added.
func TestTaskCancellationKinds(t *testing.T) {
	t.Parallel()

	pool := testdb.NewPool(t)
	env := newCancelEnv(t, pool)
	setSetting(t, pool, taskcancel.SettingTaskCancellationDurationMillis, 0)
	setSetting(t, pool, taskcancel.SettingTaskCancellationKinds, []string{"other.kind"})

	ids := env.startHeld(t, 1)
	env.cancel(t, ids...)
	require.Empty(t, env.monitor(t).Counted)
	require.Equal(t, taskcancel.TaskCancellationStats{"other.kind": {}}, statsOf(t, pool))
	require.Contains(t, tracked(t, pool), ids[0])

	setSetting(t, pool, taskcancel.SettingTaskCancellationKinds, []string{"other.kind", "test.hold"})
	require.Equal(t, map[string]int64{"test.hold": 1}, env.monitor(t).Counted)
	require.Equal(t, taskcancel.TaskCancellationStats{
		"other.kind": {},
		"test.hold":  {CurrentCountPostCancel: 1, TotalCountPostCancel: 1},
	}, statsOf(t, pool))
}

// TestTaskCancellationTrigger: what the river_job triggers track.
func TestTaskCancellationTrigger(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool := testdb.NewPool(t)
	env := newCancelEnv(t, pool)

	// A job cancelled before it runs is cancelled outright: not tracked.
	res, err := env.client.Insert(ctx, holdArgs{}, &river.InsertOpts{ScheduledAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	job, err := env.client.JobCancel(ctx, res.Job.ID)
	require.NoError(t, err)
	require.Equal(t, rivertype.JobStateCancelled, job.State)
	require.Empty(t, tracked(t, pool))

	// A running job is tracked once, with River's cancellation time, even
	// when cancelled twice.
	ids := env.startHeld(t, 1)
	env.cancel(t, ids[0])
	first := tracked(t, pool)[ids[0]]
	job, err = env.client.JobGet(ctx, ids[0])
	require.NoError(t, err)
	var meta struct {
		CancelAttemptedAt time.Time `json:"cancel_attempted_at"`
	}
	require.NoError(t, json.Unmarshal(job.Metadata, &meta))
	require.WithinDuration(t, meta.CancelAttemptedAt, first.CancelledAt, time.Microsecond)
	env.cancel(t, ids[0])
	require.Len(t, tracked(t, pool), 1)
	require.Equal(t, first.CancelledAt, tracked(t, pool)[ids[0]].CancelledAt)

	// Unreadable cancel_attempted_at (written by hand): tracked at the time
	// of tracking, and River's update is not disturbed.
	ids = env.startHeld(t, 1)
	_, err = pool.Exec(ctx, `UPDATE river_job SET metadata = metadata || '{"cancel_attempted_at": "soon"}' WHERE id = $1`, ids[0])
	require.NoError(t, err)
	require.Contains(t, tracked(t, pool), ids[0])
	env.complete(t, ids[0])
	require.NotContains(t, tracked(t, pool), ids[0])
}

// TestTaskCancellationMigrationTracksEarlierCancellations: jobs cancelled
// while running before the module's migration 00001 was applied are tracked by it.
func TestTaskCancellationMigrationTracksEarlierCancellations(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool := testdb.NewPool(t)
	stock := migrations.Options{Modules: modules.All()}
	to := int64(0)
	_, err := migrations.Down(ctx, pool, stock, migrations.DownOpts{Component: "taskcancel", To: &to})
	require.NoError(t, err)
	var id int64
	require.NoError(t, pool.QueryRow(ctx, `
		INSERT INTO river_job (args, kind, max_attempts, state, queue, attempted_at, metadata)
		VALUES ('{}', 'test.hold', 1, 'running', 'default', now(), '{"cancel_attempted_at": "2026-01-02T03:04:05.123456Z"}')
		RETURNING id`).Scan(&id))
	_, err = migrations.Up(ctx, pool, stock)
	require.NoError(t, err)
	row, ok := tracked(t, pool)[id]
	require.True(t, ok)
	require.Equal(t, time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.UTC), row.CancelledAt.UTC())
}

// TestTaskCancellationSettings: the migration's default rows equal the
// code's defaults, the view's parser agrees with the code's, and a value of
// the wrong type is an error naming its key, for the monitor (whose River
// job then fails once and is not retried) and for the view.
func TestTaskCancellationSettings(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool := testdb.NewPool(t)
	env := newCancelEnv(t, pool)
	settings := settings.New(pool)

	got, err := taskcancel.ReadTaskCancellationSettings(ctx, settings)
	require.NoError(t, err)
	require.Equal(t, &taskcancel.TaskCancellationSettings{
		Enabled:        taskcancel.DefaultTaskCancellationEnabled,
		DurationMillis: taskcancel.DefaultTaskCancellationDurationMillis,
		Kinds:          taskcancel.DefaultTaskCancellationKinds(),
	}, got)
	var rows int
	require.NoError(t, pool.QueryRow(ctx, `
		SELECT count(*) FROM settings
		WHERE key IN ($1, $2, $3) AND description <> ''`,
		taskcancel.SettingTaskCancellationEnabled, taskcancel.SettingTaskCancellationDurationMillis, taskcancel.SettingTaskCancellationKinds).Scan(&rows))
	require.Equal(t, 3, rows, "the migration inserts each setting with a description")
	var threshold time.Duration
	var kinds []string
	require.NoError(t, pool.QueryRow(ctx, "SELECT sluice_task_cancellation_threshold(), sluice_task_cancellation_kinds()").Scan(&threshold, &kinds))
	require.Equal(t, time.Duration(taskcancel.DefaultTaskCancellationDurationMillis)*time.Millisecond, threshold)
	require.Empty(t, kinds)
	var schedule struct{ cron, kind string }
	require.NoError(t, pool.QueryRow(ctx, "SELECT cron, kind FROM schedules WHERE name = $1", taskcancel.TaskCancellationMonitorKind).Scan(&schedule.cron, &schedule.kind))
	require.Equal(t, "@every 5s", schedule.cron)
	require.Equal(t, taskcancel.TaskCancellationMonitorKind, schedule.kind)

	// Missing rows mean the defaults, in SQL as in Go.
	_, err = pool.Exec(ctx, "DELETE FROM settings WHERE key LIKE 'task_cancellation.%'")
	require.NoError(t, err)
	got2, err := taskcancel.ReadTaskCancellationSettings(ctx, settings)
	require.NoError(t, err)
	require.Equal(t, got, got2)
	require.NoError(t, pool.QueryRow(ctx, "SELECT sluice_task_cancellation_threshold(), sluice_task_cancellation_kinds()").Scan(&threshold, &kinds))
	require.Equal(t, time.Duration(taskcancel.DefaultTaskCancellationDurationMillis)*time.Millisecond, threshold)
	require.Empty(t, kinds)
	setSetting(t, pool, taskcancel.SettingTaskCancellationDurationMillis, 1500)
	setSetting(t, pool, taskcancel.SettingTaskCancellationKinds, []string{"a", "b"})
	require.NoError(t, pool.QueryRow(ctx, "SELECT sluice_task_cancellation_threshold(), sluice_task_cancellation_kinds()").Scan(&threshold, &kinds))
	require.Equal(t, 1500*time.Millisecond, threshold)
	require.Equal(t, []string{"a", "b"}, kinds)

	// Something tracked, so the monitor reads every setting.
	_, err = pool.Exec(ctx, "INSERT INTO task_cancellation_tracker (job_id, kind, cancelled_at) VALUES (424242, 'x', now())")
	require.NoError(t, err)
	for _, tc := range []struct {
		key, raw string
	}{
		{taskcancel.SettingTaskCancellationEnabled, `"yes"`},
		{taskcancel.SettingTaskCancellationDurationMillis, `"10s"`},
		{taskcancel.SettingTaskCancellationDurationMillis, `-1`},
		{taskcancel.SettingTaskCancellationDurationMillis, `1.5`},
		{taskcancel.SettingTaskCancellationDurationMillis, `99999999999999`},
		{taskcancel.SettingTaskCancellationKinds, `"demo.sleep"`},
		{taskcancel.SettingTaskCancellationKinds, `[1]`},
	} {
		t.Run(tc.key+"="+tc.raw, func(t *testing.T) {
			setSetting(t, pool, taskcancel.SettingTaskCancellationEnabled, true)
			setSetting(t, pool, taskcancel.SettingTaskCancellationDurationMillis, 0)
			setSetting(t, pool, taskcancel.SettingTaskCancellationKinds, []string{})
			_, err := pool.Exec(ctx, "INSERT INTO settings (key, value) VALUES ($1, $2::jsonb) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value", tc.key, tc.raw)
			require.NoError(t, err)

			_, err = env.deps.Pass(ctx)
			require.ErrorContains(t, err, "setting "+tc.key+": want")
			_, err = taskcancel.ReadTaskCancellationStats(ctx, db.New(pool))
			if tc.key != taskcancel.SettingTaskCancellationEnabled { // the view does not read enabled
				require.ErrorContains(t, err, "setting "+tc.key+": want")
			}

			job := env.monitorJob(t)
			require.Equal(t, rivertype.JobStateDiscarded, job.State, "one attempt, no River retries")
			require.Equal(t, 1, job.Attempt)
			require.Len(t, job.Errors, 1)
			require.True(t, strings.Contains(job.Errors[0].Error, tc.key), job.Errors[0].Error)
		})
	}
}

// TestTaskCancellationMonitorKilledMidRun: a pass whose connection dies in
// the middle of counting leaves nothing half done — no job marked counted
// without its counter increment — and later passes count those jobs once.
func TestTaskCancellationMonitorKilledMidRun(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool := testdb.NewPool(t)
	env := newCancelEnv(t, pool)
	setSetting(t, pool, taskcancel.SettingTaskCancellationDurationMillis, 0)
	ids := env.startHeld(t, 3)
	env.cancel(t, ids[0])
	require.Equal(t, map[string]int64{"test.hold": 1}, env.monitor(t).Counted)
	env.cancel(t, ids[1:]...)

	// Hold the kind's counter row, so the next pass blocks after marking
	// its jobs counted, inside its one statement.
	blocker, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer blocker.Rollback(ctx) //nolint:errcheck
	_, err = blocker.Exec(ctx, "SELECT 1 FROM task_cancellation_counters WHERE kind = 'test.hold' FOR UPDATE")
	require.NoError(t, err)

	config, err := testdb.PoolConfig(testdb.WithDatabase(testdb.ServerURL(), pool.Config().ConnConfig.Database))
	require.NoError(t, err)
	config.ConnConfig.RuntimeParams["application_name"] = "doomed_monitor"
	monitorPool, err := pgxpool.NewWithConfig(ctx, config)
	require.NoError(t, err)
	t.Cleanup(monitorPool.Close)
	deps := taskcancel.NewMonitor(monitorPool, jobtest.Logger(t))
	passErr := make(chan error, 1)
	go func() {
		_, err := deps.Pass(ctx)
		passErr <- err
	}()
	var pid int
	require.Eventually(t, func() bool {
		err := pool.QueryRow(ctx, `
			SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'doomed_monitor' AND wait_event_type = 'Lock' AND query LIKE '%CountTaskCancellations%'`).Scan(&pid)
		return err == nil
	}, 30*time.Second, 10*time.Millisecond, "the pass never blocked on the counter row")
	_, err = pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid)
	require.NoError(t, err)
	require.Error(t, <-passErr)
	require.NoError(t, blocker.Rollback(ctx))

	rows := tracked(t, pool)
	require.Nil(t, rows[ids[1]].CountedAt, "the killed pass's marks were rolled back")
	require.Nil(t, rows[ids[2]].CountedAt)
	require.EqualValues(t, 1, statsOf(t, pool)["test.hold"].TotalCountPostCancel)

	// Later passes count them, once: until the terminated backend has
	// exited, its row locks make a pass skip them (SKIP LOCKED).
	var counted []int64
	require.Eventually(t, func() bool {
		counted = append(counted, env.monitor(t).CountedJobIDs...)
		return len(counted) >= 2
	}, 30*time.Second, 10*time.Millisecond)
	require.ElementsMatch(t, ids[1:], counted)
	require.Equal(t, taskcancel.TaskCancellationStats{"test.hold": {CurrentCountPostCancel: 3, TotalCountPostCancel: 3}}, statsOf(t, pool))
}
