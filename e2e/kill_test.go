package e2e_test

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/testdb"
)

// deadWorkerRescue is how the surviving workers get a dead worker's jobs
// going again, and how long the test gives them: the reaper of dead workers
// (a heartbeat every 200ms, dead after 1s) rescues the dead worker's jobs
// and frees its concurrency slots; the poll interval is short so that the
// rescued jobs are fetched promptly.
var deadWorkerRescue = struct {
	// workerArgs are the flags of every worker of the test.
	workerArgs []string
	// within bounds the wait for the rescued jobs to be worked again.
	within time.Duration
}{
	workerArgs: []string{"--heartbeat-interval", "200ms", "--dead-after", "1s", "--fetch-poll-interval", "200ms"},
	within:     time.Minute,
}

// TestKilledWorker kills a worker with SIGKILL while it runs jobs of a kind
// limited to 2 (four more parked behind them) and a maintenance run (held
// mid-run by a row lock the test takes), then starts another worker. Nothing
// is lost: the limit holds throughout (sampled from concurrency_executions),
// the killed run's advisory lock is free at once and the next run proceeds
// (the killed run is recorded as failed), and the reaper gets the killed jobs
// going again: every limited job completes exactly once, none stays parked.
func TestKilledWorker(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	h := newHarness(t, testdb.New(t))
	const limit, long, short = 2, 2, 4
	h.ok("limits", "set", "demo.sleep", fmt.Sprint(limit))
	// Work for the maintenance run.
	const builds = 300
	h.exec(`INSERT INTO ci_builds (project_id, status, created_at, updated_at)
		SELECT 1, 'canceling', now() - interval '3 hours' - i * interval '1 second', now() - interval '3 hours'
		FROM generate_series(1, $1) AS i`, builds)

	victim := h.worker("victim", deadWorkerRescue.workerArgs...)
	slots := h.sampleMax(`SELECT (SELECT count(*) FROM concurrency_executions WHERE kind = 'demo.sleep') + (SELECT COALESCE(sum(slots), 0) FROM concurrency_leases WHERE kind = 'demo.sleep')`, 20*time.Millisecond)

	// Two long jobs take the two slots; four short ones wait for a slot in
	// the worker (--park-after), then park in place behind them.
	var want []string
	for i := range long {
		ms := fmt.Sprint(20000 + i)
		h.ok("enqueue", "demo.sleep", "--args", `{"ms": `+ms+`}`)
		want = append(want, ms)
	}
	h.eventually(time.Minute, func() bool {
		return h.count(`SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND state = 'running'`) == long &&
			h.count(`SELECT (SELECT count(*) FROM concurrency_executions) + (SELECT COALESCE(sum(slots), 0) FROM concurrency_leases)`) == long
	}, "the long jobs did not start")
	for i := range short {
		ms := fmt.Sprint(500 + i)
		h.ok("enqueue", "demo.sleep", "--args", `{"ms": `+ms+`}`)
		want = append(want, ms)
	}
	h.eventually(time.Minute, func() bool {
		return h.count(`SELECT count(*) FROM concurrency_parked_jobs p JOIN river_job j ON j.id = p.job_id WHERE j.state = 'pending'`) == short
	}, "the short jobs were not parked")

	// A maintenance run, stopped mid-run: the test holds a row lock on the
	// first build of its first batch.
	rowLock, err := h.pool.Begin(ctx)
	require.NoError(t, err)
	defer rowLock.Rollback(ctx) //nolint:errcheck
	_, err = rowLock.Exec(ctx, `SELECT id FROM ci_builds ORDER BY created_at, project_id, id LIMIT 1 FOR UPDATE`)
	require.NoError(t, err)
	h.ok("schedule", "trigger", "ci.drop_canceling_builds")
	h.eventually(time.Minute, func() bool {
		return h.count(`SELECT count(*) FROM maintenance_runs WHERE kind = 'ci.drop_canceling_builds' AND status = 'running'`) == 1 &&
			h.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'sluice worker victim' AND wait_event_type = 'Lock'`) == 1
	}, "the maintenance run did not start and block")
	killedRun := h.count(`SELECT id FROM maintenance_runs WHERE kind = 'ci.drop_canceling_builds' AND status = 'running'`)
	killedMaintenanceJob := h.count(`SELECT id FROM river_job WHERE kind = 'ci.drop_canceling_builds' AND state = 'running'`)
	require.Equal(t, int64(1), advisoryHolders(h, "ci.drop_canceling_builds"), "the run holds its kind's lock")
	require.Equal(t, int64(long), h.count(`SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND state = 'running'`),
		"the long jobs are still running when the worker is killed")

	victim.Kill(t)
	killed := time.Now()

	// The lock died with the killed process's connection.
	h.eventually(time.Minute, func() bool { return advisoryHolders(h, "ci.drop_canceling_builds") == 0 },
		"the killed run's advisory lock is still held")
	lockFreed := time.Since(killed)
	require.NoError(t, rowLock.Rollback(ctx))

	// A restarted worker; the next maintenance run proceeds.
	survivor := h.worker("survivor", deadWorkerRescue.workerArgs...)
	h.ok("schedule", "trigger", "ci.drop_canceling_builds")
	h.eventually(2*time.Minute, func() bool {
		return h.count(`SELECT count(*) FROM maintenance_runs WHERE kind = 'ci.drop_canceling_builds' AND status = 'succeeded' AND worker_id = $1`, survivor.ID) >= 1
	}, "the next maintenance run did not succeed")
	nextRun := time.Since(killed)
	var status, abandonErr string
	require.NoError(t, h.pool.QueryRow(ctx, `SELECT status, details->>'error' FROM maintenance_runs WHERE id = $1`, killedRun).Scan(&status, &abandonErr))
	require.Equal(t, "failed", status, "the killed run is recorded as failed")
	require.Regexp(t, `^(abandoned|worker victim lost)`, abandonErr, "by the reaper, or by the next run as abandoned")
	require.Equal(t, int64(builds), h.count(`SELECT count(*) FROM ci_builds WHERE status = 'failed' AND lock_version = 1`),
		"every stuck build failed, none twice")

	// River works the killed jobs again, and the parked ones proceed.
	h.eventually(deadWorkerRescue.within, func() bool {
		return h.count(`SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND state = 'completed'`) == int64(len(want)) &&
			h.count(`SELECT count(*) FROM river_job WHERE id = $1 AND state = 'completed'`, killedMaintenanceJob) == 1
	}, "the killed and parked jobs were not all worked again")
	t.Logf("after the kill: lock free in %s, next run succeeded in %s, killed and parked jobs all worked in %s",
		lockFreed.Round(time.Millisecond), nextRun.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
	require.LessOrEqual(t, slots.Stop(), int64(limit), "the limit held throughout")
	require.Positive(t, slots.samples.Load())

	var attempts int
	var lastBy string
	require.NoError(t, h.pool.QueryRow(ctx, `SELECT attempt, attempted_by[array_upper(attempted_by, 1)] FROM river_job WHERE id = $1`, killedMaintenanceJob).Scan(&attempts, &lastBy))
	require.Equal(t, 2, attempts, "the killed maintenance job ran once more")
	require.Equal(t, survivor.ID, lastBy)

	// Every limited job completed exactly once; nothing is parked, holds a
	// slot, or is left unfinished.
	rows, err := h.pool.Query(ctx, `SELECT args->>'ms' FROM river_job WHERE kind = 'demo.sleep' AND state = 'completed'`)
	require.NoError(t, err)
	var got []string
	for rows.Next() {
		var ms string
		require.NoError(t, rows.Scan(&ms))
		got = append(got, ms)
	}
	require.NoError(t, rows.Err())
	sort.Strings(got)
	sort.Strings(want)
	require.Equal(t, want, got, "each limited job completed exactly once")
	require.Zero(t, h.count(`SELECT count(*) FROM concurrency_parked_jobs`), "no parked job left")
	require.Zero(t, h.count(`SELECT count(*) FROM river_job WHERE finalized_at IS NULL AND kind IN ('demo.sleep', 'ci.drop_canceling_builds')`))
	require.Zero(t, h.count(`SELECT count(*) FROM river_job WHERE state = 'discarded'`))
	h.eventually(time.Minute, func() bool {
		return h.count(`SELECT (SELECT count(*) FROM concurrency_executions) + (SELECT COALESCE(sum(slots), 0) FROM concurrency_leases)`) == 0
	},
		"slots are still taken after every job ended")
}

// advisoryHolders counts the sessions holding the maintenance lock of kind
// (the key the framework uses: hashtextextended(kind, 0)) in the test's
// database (advisory locks are per database; other tests hold the same keys).
func advisoryHolders(h *harness, kind string) int64 {
	h.t.Helper()
	return h.count(`
		SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND objsubid = 1
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND ((classid::bigint << 32) | objid::bigint) = hashtextextended($1, 0)`, kind)
}
