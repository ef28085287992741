package scheduler_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/modules/demo"
	"github.com/sluice-dev/sluice/scheduler"
)

// schedulerPeekSQL is the text of SchedulerPeek, the dispatcher's idle
// check, as queries/schedules.sql holds it (sqlc generates it from there).
func schedulerPeekSQL(t testing.TB) string {
	t.Helper()
	src, err := os.ReadFile("../queries/schedules.sql")
	require.NoError(t, err)
	_, after, found := strings.Cut(string(src), "-- name: SchedulerPeek :one\n")
	require.True(t, found, "queries/schedules.sql has no SchedulerPeek")
	body, _, _ := strings.Cut(after, "\n-- name:")
	return body
}

// explainPeek returns the plan of the dispatcher's idle check.
func explainPeek(t testing.TB, pool *pgxpool.Pool, analyze bool) string {
	t.Helper()
	opts := "(COSTS OFF)"
	if analyze {
		opts = "(ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, SUMMARY OFF)"
	}
	rows, err := pool.Query(context.Background(), "EXPLAIN "+opts+" "+schedulerPeekSQL(t))
	require.NoError(t, err)
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		lines = append(lines, line)
	}
	require.NoError(t, rows.Err())
	return strings.Join(lines, "\n")
}

// insertIdle inserts n enabled schedules due in a day or more, none due
// now, and vacuums so that the visibility map is set (as autovacuum would).
func insertIdle(t testing.TB, pool *pgxpool.Pool, n int) {
	t.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, `
		INSERT INTO schedules (name, cron, kind, next_run_at)
		SELECT 'idle-' || i, '0 0 * * *', 'demo.sleep', now() + interval '1 day' + i * interval '1 second'
		FROM generate_series(1, $1) AS i`, n)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `VACUUM ANALYZE schedules`)
	require.NoError(t, err)
}

// TestIdleCheckIsIndexOnly: the idle tick reads two partial indexes and
// never the table.
func TestIdleCheckIsIndexOnly(t *testing.T) {
	t.Parallel()

	pool := newPoolDB(t)
	insertIdle(t, pool, 20_000)
	plan := explainPeek(t, pool, true)
	require.Contains(t, plan, "Index Only Scan using schedules_due_idx", plan)
	require.Contains(t, plan, "Index Only Scan using schedules_uninitialised_idx", plan)
	require.NotContains(t, plan, "Seq Scan", plan)
	require.NotContains(t, plan, "Bitmap Heap Scan", plan)
	require.Contains(t, plan, "Heap Fetches: 0", plan)
}

// BenchmarkIdleTick measures one dispatcher tick over 100,000 schedules of
// which none is due: the figure is ms/tick (mean of 500 ticks, and their
// p99), the comparison the same idle check forced to scan the table
// (seqscan-ms/check). target is the 5 ms: ms/tick must be below it
// (and ratio = ms/tick / seqscan-ms/check well below 1). The plan is logged.
func BenchmarkIdleTick(b *testing.B) {
	ctx := context.Background()
	url := newDB(b)
	pool := openPool(b, url)
	insertIdle(b, pool, 100_000)
	d := newDispatcher(b, url, scheduler.Config{})
	// Printed, not logged: benchmark logs are cut to a few lines.
	fmt.Printf("BenchmarkIdleTick: EXPLAIN (ANALYZE, BUFFERS) of the idle check over 100,000 schedules, none due:\n%s\n",
		explainPeek(b, pool, true))

	const ticks = 500
	for range b.N {
		for range 20 { // warm the pool and caches
			_, err := d.Tick(ctx)
			require.NoError(b, err)
		}
		durations := make([]time.Duration, ticks)
		for i := range ticks {
			start := time.Now()
			res, err := d.Tick(ctx)
			durations[i] = time.Since(start)
			require.NoError(b, err)
			require.Zero(b, res.Jobs)
		}
		mean := meanOf(durations)

		conn, err := pool.Acquire(ctx)
		require.NoError(b, err)
		_, err = conn.Exec(ctx, "SET enable_indexscan = off; SET enable_indexonlyscan = off; SET enable_bitmapscan = off")
		require.NoError(b, err)
		seq := make([]time.Duration, 20)
		for i := range seq {
			start := time.Now()
			_, err := db.New(conn).SchedulerPeek(ctx)
			seq[i] = time.Since(start)
			require.NoError(b, err)
		}
		conn.Hijack().Close(ctx) //nolint:errcheck
		seqMean := meanOf(seq)

		b.ReportMetric(ms(mean), "ms/tick")
		b.ReportMetric(ms(percentile(durations, 0.99)), "p99-ms/tick")
		b.ReportMetric(ms(seqMean), "seqscan-ms/check")
		b.ReportMetric(float64(mean)/float64(seqMean), "ratio")
		b.ReportMetric(5, "target")
	}
}

// BenchmarkDispatchLag (P4): 10,000 schedules all due at the same second,
// dispatched by 2 `sluice worker` processes (built from ./cmd/sluice, each
// with its own pool, River client working the jobs, and dispatcher; batches
// of 2000, the default). The figures are the p50, p99 and max dispatch lag
// (last_dispatched_at - due time, per schedule); the comparison
// (baseline-ms) is inserting the same 10,000 jobs directly with one River
// InsertMany in one transaction, on the same database while the same two
// workers run (the median of 3; each is timed from its start to its commit,
// when the last job becomes visible). ratio = p99-ms / baseline-ms; target
// ≤ 2.0. Every schedule must have produced exactly one job.
func BenchmarkDispatchLag(b *testing.B) {
	const n = 10_000
	ctx := context.Background()
	bin := filepath.Join(b.TempDir(), "sluice")
	build := exec.Command("go", "build", "-o", bin, "github.com/sluice-dev/sluice/cmd/sluice")
	build.Stderr = os.Stderr
	require.NoError(b, build.Run())

	for range b.N {
		url := newDB(b)
		pool := openPool(b, url)
		for i := range 2 {
			startWorkerProcess(b, bin, url, fmt.Sprintf("bench-%d", i))
		}
		require.Eventually(b, func() bool {
			var ready int
			require.NoError(b, pool.QueryRow(ctx, `SELECT count(*) FROM sluice_workers WHERE dispatcher_tick_at IS NOT NULL`).Scan(&ready))
			return ready == 2
		}, time.Minute, 50*time.Millisecond)

		var due time.Time
		require.NoError(b, pool.QueryRow(ctx, `SELECT date_trunc('second', now()) + interval '4 seconds'`).Scan(&due))
		due = due.UTC()
		cron := fmt.Sprintf("%d %d %d %d %d *", due.Second(), due.Minute(), due.Hour(), due.Day(), int(due.Month()))
		_, err := pool.Exec(ctx, `
			INSERT INTO schedules (name, cron, kind, args, next_run_at)
			SELECT 'lag-' || i, $1, 'demo.sleep', '{"ms": 0}', $2
			FROM generate_series(1, $3) AS i`, cron, due, n)
		require.NoError(b, err)

		require.Eventually(b, func() bool {
			var done int
			require.NoError(b, pool.QueryRow(ctx, `SELECT count(*) FROM schedules WHERE last_dispatched_at IS NOT NULL`).Scan(&done))
			return done == n
		}, 5*time.Minute, 50*time.Millisecond)

		var p50, p99, maxLag float64
		require.NoError(b, pool.QueryRow(ctx, `
			SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY lag),
			       percentile_cont(0.99) WITHIN GROUP (ORDER BY lag),
			       max(lag)
			FROM (SELECT extract(epoch FROM last_dispatched_at - last_run_at) * 1000 AS lag FROM schedules) l`).Scan(&p50, &p99, &maxLag))
		var jobs, dups int
		require.NoError(b, pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE metadata ? 'schedule'`).Scan(&jobs))
		require.NoError(b, pool.QueryRow(ctx, `
			SELECT count(*) FROM (SELECT 1 FROM river_job GROUP BY metadata->>'schedule' HAVING count(*) > 1) d`).Scan(&dups))
		require.Equal(b, n, jobs, "one job per schedule")
		require.Zero(b, dups)

		var baselines []time.Duration
		for range 3 {
			baselines = append(baselines, directInsert(b, pool, n))
		}
		baseline := ms(jobtest.Median(baselines))
		b.Logf("dispatch lag p50 %.0f ms, p99 %.0f ms, max %.0f ms; one InsertMany of %d jobs %v", p50, p99, maxLag, n, baselines)
		b.ReportMetric(p50, "p50-ms")
		b.ReportMetric(p99, "p99-ms")
		b.ReportMetric(maxLag, "max-ms")
		b.ReportMetric(baseline, "baseline-ms")
		b.ReportMetric(p99/baseline, "ratio")
		b.ReportMetric(2.0, "target")
	}
}

// directInsert inserts n demo.sleep jobs of 0 ms (with a schedule's
// metadata, as the dispatcher writes them) with one InsertMany in one
// transaction and returns how long it took, from its start to its commit.
func directInsert(b *testing.B, pool *pgxpool.Pool, n int) time.Duration {
	ctx := context.Background()
	client := insertClient(b, pool)
	due := time.Now().UTC()
	params := make([]river.InsertManyParams, n)
	for i := range params {
		md, err := json.Marshal(scheduler.JobMetadata{Schedule: fmt.Sprintf("baseline-%d", i), ScheduleID: int64(i), DueAt: due})
		require.NoError(b, err)
		params[i] = river.InsertManyParams{Args: demo.SleepArgs{}, InsertOpts: &river.InsertOpts{Metadata: md}}
	}
	start := time.Now()
	tx, err := pool.Begin(ctx)
	require.NoError(b, err)
	_, err = client.InsertManyTx(ctx, tx, params)
	require.NoError(b, err)
	require.NoError(b, tx.Commit(ctx))
	return time.Since(start)
}

func startWorkerProcess(b *testing.B, bin, url, id string) {
	cmd := exec.Command(bin, "worker", "--http-addr=", "--id", id, "--log-level", "warn")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+url)
	cmd.Stderr = os.Stderr
	require.NoError(b, cmd.Start())
	b.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
		}
	})
}

func meanOf(ds []time.Duration) time.Duration {
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(len(ds))
}

func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(p*float64(len(s)-1))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
