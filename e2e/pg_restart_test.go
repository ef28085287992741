package e2e_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/pgcluster"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/proc"
)

// pgDownFor is how long the test keeps Postgres down each time.
const pgDownFor = 5 * time.Second

// TestPostgresRestart stops the Postgres server under two running workers
// — once as a crash (pg_ctl stop -m immediate), once cleanly (-m fast) —
// keeps it down for a few seconds and starts it again. The workers recover
// without being restarted: `sluice health` is CRITICAL while the database is
// down and OK again afterwards, /readyz follows, new jobs are worked, and the
// per-second run_once schedule lost no due time beyond its misfire policy
// (the due times missed while the server was down collapse into one run that
// counts them).
func TestPostgresRestart(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	cluster := pgcluster.New(t)
	admin, err := pgkit.Open(ctx, cluster.URL("postgres"), 30*time.Second)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "CREATE DATABASE sluice")
	admin.Close()
	require.NoError(t, err)
	url := cluster.URL("sluice")
	res := proc.Run(t, url, nil, "migrate", "up")
	require.Equal(t, 0, res.Code, res.Stderr)

	h := newHarness(t, url)
	h.ok("schedule", "add", "--name", "tick", "--cron", "@every 1s", "--kind", "demo.sleep", "--args", `{"ms": 10}`)
	workerArgs := []string{"--heartbeat-interval", "1s"}
	workers := []*proc.Worker{h.worker("pg-restart-0", workerArgs...), h.worker("pg-restart-1", workerArgs...)}

	health := func() proc.Result {
		t.Helper()
		return h.sluice("health")
	}
	requireHealthOK := func(stage string) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for {
			last := health()
			if last.Code == 0 {
				require.True(t, strings.HasPrefix(last.Stdout, "OK"), last.Stdout)
				return
			}
			require.True(t, time.Now().Before(deadline), "%s: sluice health is not OK after 2 minutes: %q %q", stage, last.Stdout, last.Stderr)
			time.Sleep(200 * time.Millisecond)
		}
	}
	ready := func(w *proc.Worker) int {
		client := http.Client{Timeout: 5 * time.Second}
		resp, err := client.Get("http://" + w.Addr + "/readyz")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	completedSince := func(since time.Time) int64 {
		return h.count(`SELECT count(*) FROM river_job WHERE metadata->>'schedule' = 'tick' AND state = 'completed' AND (metadata->>'due_at')::timestamptz > $1`, since)
	}

	requireHealthOK("before the restarts")
	h.eventually(time.Minute, func() bool { return completedSince(time.Time{}) >= 3 }, "the schedule does not run")

	for _, mode := range []string{"immediate", "fast"} {
		require.NoError(t, cluster.Stop(mode))
		down := time.Now()
		res := health()
		require.Equal(t, 2, res.Code, "health while the database is down (%s stop): %q %q", mode, res.Stdout, res.Stderr)
		require.True(t, strings.HasPrefix(res.Stdout, "CRITICAL"), res.Stdout)
		for _, w := range workers {
			require.Equal(t, http.StatusServiceUnavailable, ready(w), "worker %s /readyz while the database is down", w.ID)
		}
		time.Sleep(pgDownFor - time.Since(down))
		require.NoError(t, cluster.Start())
		up := time.Now()

		requireHealthOK("after a " + mode + " stop")
		for _, w := range workers {
			require.False(t, w.Exited(), "worker %s exited:\n%s", w.ID, w.Log())
			h.eventually(time.Minute, func() bool { return ready(w) == http.StatusOK }, "worker %s /readyz after the restart", w.ID)
		}
		// The dispatcher goes on and the workers work the jobs.
		h.eventually(2*time.Minute, func() bool { return completedSince(up) >= 3 }, "no scheduled run after the %s restart", mode)
		id, err := strconv.ParseInt(strings.TrimSpace(h.ok("enqueue", "demo.sleep", "--args", `{"ms": 1}`)), 10, 64)
		require.NoError(t, err)
		h.eventually(time.Minute, func() bool {
			return h.count(`SELECT count(*) FROM river_job WHERE id = $1 AND state = 'completed'`, id) == 1
		}, "a job enqueued after the %s restart was not worked", mode)
		t.Logf("%s stop: down %s, health OK and jobs worked again %s after the start", mode, up.Sub(down).Round(time.Millisecond), time.Since(up).Round(time.Millisecond))
	}

	h.ok("schedule", "disable", "tick")
	h.eventually(time.Minute, func() bool {
		return h.count(`SELECT count(*) FROM river_job WHERE metadata->>'schedule' = 'tick' AND finalized_at IS NULL`) == 0
	}, "scheduled jobs left unfinished")
	runs := h.scheduledRuns("tick")
	n := requireEveryDueTimeOnce(t, "tick", runs, time.Second, true)
	var collapsed []string
	for _, r := range runs {
		if r.missed > 0 {
			collapsed = append(collapsed, fmt.Sprintf("%s (missed %d)", r.dueAt.Format(time.TimeOnly), r.missed))
		}
	}
	t.Logf("tick: %d due times, %d jobs; collapsed runs: %v", n, len(runs), collapsed)
	require.GreaterOrEqual(t, len(collapsed), 2, "each outage's missed due times collapse into one run (run_once)")
	var unfinished []string
	rows, err := h.pool.Query(ctx, `SELECT format('%s job %s %s attempt %s by %s: %s %s', kind, id, state, attempt, attempted_by, metadata, errors)
		FROM river_job WHERE state <> 'completed' AND metadata->>'schedule' = 'tick'`)
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		unfinished = append(unfinished, s)
	}
	require.NoError(t, rows.Err())
	// (Only the test's own schedule: a default maintenance job that was
	// running when the server went down may fail and be retried or, for
	// task_cancellation.monitor, discarded, as designed.)
	require.Empty(t, unfinished, "jobs of the schedule not completed")
	require.Zero(t, h.count(`SELECT count(*) FROM schedules WHERE status <> 'active' OR failure_count > 0`),
		"an unreachable database is not a dispatch failure")
}
