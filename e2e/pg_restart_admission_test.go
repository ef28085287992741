package e2e_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/pgcluster"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/proc"
)

// Sizes of TestPostgresRestartDuringAdmission.
const (
	restartAdmissionJobs  = 200
	restartAdmissionMS    = 20
	restartAdmissionLimit = 2
	// restartAdmissionDown is how long the server stays down: longer than
	// the workers' dead-after (1s), so that every heartbeat is stale when it
	// comes back.
	restartAdmissionDown = 2 * time.Second
)

// TestPostgresRestartDuringAdmission crashes the Postgres server (pg_ctl
// stop -m immediate) under two workers while jobs of a kind limited to 2
// are admitted, parked and resumed (short jobs, --park-after 20ms), keeps it
// down past the workers' dead-after and starts it again. The workers
// reconnect on their own (neither is restarted, neither reaps the other);
// every job is done exactly once — its row completed once, by the worker
// running its last attempt, and its code run once (the workers' job
// metrics count one execution per job) — none is lost or left parked, the
// limit held in every sample, and every sample shows
// concurrency_limits.admitted equal to the slot rows plus the leased slots.
// It logs the time from the start of the server to the first job completed
// after it, and to the last.
func TestPostgresRestartDuringAdmission(t *testing.T) {
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
	h.installAudit()
	h.ok("limits", "set", "demo.sleep", strconv.Itoa(restartAdmissionLimit))
	args := append(append([]string{}, deadWorkerRescue.workerArgs...), "--park-after", "20ms")
	workers := []*proc.Worker{h.worker("restart-0", args...), h.worker("restart-1", args...)}
	slots := h.sampleMax(slotsTakenSQL, 10*time.Millisecond)
	countsOff := h.sampleMax(slotCountsOffSQL, 10*time.Millisecond)
	const tag = "pr"
	h.insertTagged(tag, restartAdmissionJobs, restartAdmissionMS)

	// Stop the server in the middle of admissions: a fifth of the jobs
	// done, jobs parked and others running.
	var completed, parked, running int64
	h.eventually(2*time.Minute, func() bool {
		require.NoError(t, h.pool.QueryRow(ctx, `
			SELECT (SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND state = 'completed'),
			       (SELECT count(*) FROM concurrency_parked_jobs),
			       (SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND state = 'running')`).Scan(&completed, &parked, &running))
		return completed >= restartAdmissionJobs/5 && parked > 0 && running > 0
	}, "no moment with jobs parked and running")
	require.NoError(t, cluster.Stop("immediate"))
	down := time.Now()
	t.Logf("server crashed at: %d of %d jobs completed, %d parked, %d running", completed, restartAdmissionJobs, parked, running)
	time.Sleep(restartAdmissionDown - time.Since(down))
	require.NoError(t, cluster.Start())
	up := time.Now()

	if !assert.Eventually(t, func() bool {
		return h.count(`SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND state = 'completed'`) == restartAdmissionJobs
	}, 3*time.Minute, 100*time.Millisecond) {
		t.Fatalf("the jobs were not all done after the restart:\n%s", h.dump(slotsLeftSQL))
	}
	allDone := h.lastCompletion("demo.sleep").Sub(up)
	firstDone := h.firstCompletionAfter(up, "demo.sleep")

	for _, w := range workers {
		require.False(t, w.Exited(), "worker %s exited:\n%s", w.ID, w.Log())
		require.NotContains(t, w.Log(), "reaped dead worker", "worker %s reaped another", w.ID)
	}
	require.Zero(t, h.count(`SELECT count(*) FROM test_audit WHERE deleted_worker IS NOT NULL`), "no worker was reaped")
	rep := h.exactlyOnce(tag, restartAdmissionJobs)
	require.LessOrEqual(t, slots.Stop(), int64(restartAdmissionLimit), "the limit held in every sample")
	require.Zero(t, countsOff.Stop(), "admitted equals the slot rows plus the leased slots in every sample")
	require.Positive(t, slots.samples.Load())
	h.requireExactlyOnce(rep)
	var runs int64
	for _, w := range workers {
		runs += executions(h, w, "demo.sleep")
	}
	require.Equal(t, int64(restartAdmissionJobs), runs, "each job's code ran once (the workers' job metrics)")
	h.requireNothingLeft()
	failed := h.count(`SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND cardinality(errors) > 0`)

	t.Logf("Postgres restart during admission: %s; %d jobs retried after an error in the outage; max slots taken %d (limit %d), %d samples failed during the outage",
		rep, failed, slots.max.Load(), restartAdmissionLimit, slots.errs.Load())
	t.Logf("time to recover: down %s; after the start, first job done in %s, every job done in %s",
		up.Sub(down).Round(time.Millisecond), firstDone.Round(time.Millisecond), allDone.Round(time.Millisecond))
}
