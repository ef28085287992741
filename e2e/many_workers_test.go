package e2e_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/testdb"
)

// manyWorkersFor is how long the three workers dispatch the per-second
// schedules.
const manyWorkersFor = 30 * time.Second

// TestManyWorkers runs three worker processes on one database with
// schedules due every second for 30 s: every due time is dispatched exactly
// once (one River job per due time, whatever the number of dispatchers),
// and the maintenance runs of a kind never overlap in time, although three
// schedules insert a run of the same kind every second and a feeder keeps
// giving the runs work.
func TestManyWorkers(t *testing.T) {
	t.Parallel()

	h := newHarness(t, testdb.New(t))
	for i := range 3 {
		h.worker(fmt.Sprintf("many-%d", i))
	}

	// run_all: every due time gets a job of its own, even when a
	// dispatcher is late. run_once (the default): a late dispatch collapses
	// the missed due times into one job that counts them.
	perSecond := []struct{ name, cron, misfire string }{
		{"every-1s", "@every 1s", "run_all"},
		{"six-field", "* * * * * *", "run_all"},
		{"run-once", "* * * * * *", "run_once"},
	}
	for _, s := range perSecond {
		h.ok("schedule", "add", "--name", s.name, "--cron", s.cron, "--kind", "demo.sleep", "--args", `{"ms": 20}`, "--misfire", s.misfire)
	}
	// Three schedules of each of two maintenance kinds, due every second:
	// three runs of a kind are inserted at once, on any of the workers, and
	// must take turns on the kind's advisory lock.
	maintenance := []string{"ci.drop_canceling_builds", "export.stuck_jobs"}
	var maintenanceSchedules []string
	for _, kind := range maintenance {
		for _, suffix := range []string{"a", "b", "c"} {
			name := kind + "-" + suffix
			maintenanceSchedules = append(maintenanceSchedules, name)
			h.ok("schedule", "add", "--name", name, "--cron", "* * * * * *", "--kind", kind)
		}
	}

	// The feeder adds stuck canceling builds (older than the sweep's 1h
	// timeout) and exports whose River job is gone, four times a second.
	ctx, stopFeeder := context.WithCancel(context.Background())
	var feeder sync.WaitGroup
	var builds, exports int64
	feeder.Add(1)
	go func() {
		defer feeder.Done()
		// The inserts run to completion even when the feeder is stopped
		// mid-statement: a cancelled statement may still have committed,
		// and then the counts would miss its rows.
		insertCtx := context.WithoutCancel(ctx)
		for ctx.Err() == nil {
			if _, err := h.pool.Exec(insertCtx, `
				INSERT INTO ci_builds (project_id, pipeline_id, runner_id, status, created_at, updated_at)
				SELECT 1 + i % 7, 10, 100, 'canceling', now() - interval '2 hours', now() - interval '2 hours'
				FROM generate_series(1, 150) AS i`); err == nil {
				builds += 150
			}
			if _, err := h.pool.Exec(insertCtx, `
				INSERT INTO project_export_jobs (project_id, job_id, status)
				SELECT 1 + i % 7, 1000000000 + nextval('project_export_jobs_id_seq'), 'started'
				FROM generate_series(1, 20) AS i`); err == nil {
				exports += 20
			}
			select {
			case <-ctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()

	time.Sleep(manyWorkersFor)
	for _, name := range append([]string{"every-1s", "six-field", "run-once"}, maintenanceSchedules...) {
		h.ok("schedule", "disable", name)
	}
	stopFeeder()
	feeder.Wait()
	h.eventually(2*time.Minute, func() bool {
		return h.count(`SELECT count(*) FROM river_job WHERE finalized_at IS NULL AND metadata ? 'schedule'`) == 0
	}, "the scheduled jobs did not all finish")

	// Every due time exactly once.
	for _, s := range perSecond {
		runs := h.scheduledRuns(s.name)
		n := requireEveryDueTimeOnce(t, s.name, runs, time.Second, s.misfire != "run_all")
		t.Logf("%s: %d due times, %d jobs", s.name, n, len(runs))
		// About one due time a second for 30 s (loose: the machine is slow).
		require.Greater(t, n, 15, "schedule %s", s.name)
	}
	for _, name := range maintenanceSchedules {
		requireEveryDueTimeOnce(t, name, h.scheduledRuns(name), time.Second, true)
	}
	require.Zero(t, h.count(`SELECT count(*) FROM river_job WHERE metadata ? 'schedule' AND state <> 'completed'`),
		"every scheduled job completed")

	// What the feeder left after the schedules stopped is swept by hand;
	// then every build and export was handled exactly once.
	h.ok("run", "ci.drop_canceling_builds")
	h.ok("run", "export.stuck_jobs")
	require.Equal(t, builds, h.count(`SELECT count(*) FROM ci_builds WHERE status = 'failed' AND failure_reason = 'stuck_or_timeout_failure' AND lock_version = 1`),
		"every stuck build failed exactly once")
	require.Zero(t, h.count(`SELECT count(*) FROM ci_builds WHERE status <> 'failed'`))
	require.Equal(t, exports, h.count(`SELECT count(*) FROM project_export_jobs WHERE status = 'failed'`))
	for kind, want := range map[string]int64{"ci.drop_canceling_builds": builds, "export.stuck_jobs": exports} {
		require.Equal(t, want, h.count(`SELECT COALESCE(sum(affected), 0) FROM maintenance_runs WHERE kind = $1 AND status = 'succeeded'`, kind),
			"%s: the runs' affected counts add up to the rows they changed (none twice)", kind)
	}

	// Maintenance runs of a kind never overlap in time.
	for _, kind := range maintenance {
		require.Zero(t, h.count(`SELECT count(*) FROM maintenance_runs WHERE kind = $1 AND status NOT IN ('succeeded', 'skipped_locked')`, kind),
			"%s: every run succeeded or was skipped", kind)
		rows, err := h.pool.Query(context.Background(), `
			SELECT id, started_at, finished_at, worker_id FROM maintenance_runs
			WHERE kind = $1 AND status = 'succeeded' ORDER BY started_at, id`, kind)
		require.NoError(t, err)
		type run struct {
			id             int64
			started, ended time.Time
			worker         string
		}
		var runs []run
		workers := map[string]bool{}
		for rows.Next() {
			var r run
			require.NoError(t, rows.Scan(&r.id, &r.started, &r.ended, &r.worker))
			runs = append(runs, r)
			workers[r.worker] = true
		}
		require.NoError(t, rows.Err())
		for i := 1; i < len(runs); i++ {
			prev, cur := runs[i-1], runs[i]
			require.False(t, cur.started.Before(prev.ended),
				"%s: run %d (%s, %s..%s) overlaps run %d (%s, %s..%s)", kind,
				cur.id, cur.worker, cur.started, cur.ended, prev.id, prev.worker, prev.started, prev.ended)
		}
		skipped := h.count(`SELECT count(*) FROM maintenance_runs WHERE kind = $1 AND status = 'skipped_locked'`, kind)
		t.Logf("%s: %d runs succeeded on %d workers, %d skipped_locked", kind, len(runs), len(workers), skipped)
		require.GreaterOrEqual(t, len(runs), 5, "%s ran", kind)
		require.Positive(t, skipped, "%s: the runs of each second contended for the lock", kind)
	}
}
