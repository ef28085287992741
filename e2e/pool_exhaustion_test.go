package e2e_test

import (
	"bufio"
	"compress/gzip"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/proc"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/modules/exports"
)

// Sizes of TestPoolExhaustion.
const (
	// exhaustedPool is the starved worker's pool_max_conns: fewer
	// connections than the exports it runs at once.
	exhaustedPool = 4
	// exhaustedExports are the exports the starved worker runs at once (its
	// --default-workers is larger, so that it could fetch more).
	exhaustedExports = 6
	exhaustedBuilds  = 2000
	exhaustedProject = 7
	// exhaustedJobs are short jobs enqueued while the pool is exhausted.
	exhaustedJobs = 40
	// exhaustedFor is how long the pool stays exhausted once the other
	// worker's reaper could act (the other worker has heartbeated for
	// dead-after): several dead-afters.
	exhaustedFor = 4 * time.Second
)

// TestPoolExhaustion starves a worker's main pool for several times its
// dead-after: the worker ("starved", pool_max_conns=4) runs 6 exports of a
// project at once, and every one of its 4 connections is held by an
// export's REPEATABLE READ transaction that waits (the test holds an ACCESS
// EXCLUSIVE lock on ci_builds, standing for a slow query), the other
// exports and everything else of the worker (River's fetches and
// completions, the limiter, the dispatcher, /readyz) waiting for a
// connection. Its heartbeat and reaper have a pool of their own: the other
// worker ("peer"), whose reaper may act throughout, reaps nobody, and works
// the short jobs enqueued meanwhile. Once the lock goes the starved worker
// recovers on its own: every export is done exactly once (one attempt, its
// archive complete, its code run once), every short job too, none lost. It
// logs how long the pool was exhausted and the time to recover.
func TestPoolExhaustion(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	h := newHarness(t, testdb.New(t))
	h.installAudit()
	h.exec(`INSERT INTO ci_builds (project_id, name, stage, status)
		SELECT $1, 'build ' || i, 'test', 'success' FROM generate_series(1, $2) AS i`, exhaustedProject, exhaustedBuilds)
	dir := t.TempDir()
	args := append(append([]string{}, deadWorkerRescue.workerArgs...), "--export-dir", dir)

	// The slow query: every read of ci_builds waits for the test's lock.
	lock, err := h.pool.Begin(ctx)
	require.NoError(t, err)
	defer lock.Rollback(ctx) //nolint:errcheck
	_, err = lock.Exec(ctx, `LOCK TABLE ci_builds IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)

	// The exports first, so that the starved worker's first fetch takes
	// them all.
	for range exhaustedExports {
		h.ok("export", strconv.Itoa(exhaustedProject))
	}
	starved := proc.StartWorker(t, withParam(h.url, "pool_max_conns", strconv.Itoa(exhaustedPool)), "starved",
		append(args, "--default-workers", strconv.Itoa(exhaustedExports+4))...)
	// The starved worker's sessions that wait for the lock on ci_builds
	// (its heartbeat's own pool may wait for a moment on another lock).
	blocked := func() int64 {
		return h.count(`SELECT count(DISTINCT a.pid) FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid
			WHERE a.datname = current_database() AND a.application_name = 'sluice worker starved'
			  AND NOT l.granted AND l.locktype = 'relation' AND l.relation = 'ci_builds'::regclass`)
	}
	h.eventually(time.Minute, func() bool {
		return blocked() == exhaustedPool &&
			h.count(`SELECT count(*) FROM river_job WHERE kind = 'export.project' AND state = 'running' AND attempted_by = '{starved}'`) == exhaustedExports
	}, "the starved worker's exports do not hold its %d connections", exhaustedPool)
	exhausted := time.Now()

	// Samples while exhausted: the starved worker's heartbeat age, and
	// whether any worker counts as dead (reported, not asserted: what is
	// asserted is that nobody is reaped).
	beatAge := h.sampleMax(`SELECT COALESCE((extract(epoch FROM now() - heartbeat_at) * 1000)::bigint, 0) FROM sluice_workers WHERE id = 'starved'`, 20*time.Millisecond)
	deadSeen := h.sampleMax(`SELECT count(*) FROM sluice_worker_status WHERE dead`, 20*time.Millisecond)
	peer := proc.StartWorker(t, withParam(h.url, "pool_max_conns", strconv.Itoa(workerConns)), "peer", args...)
	peerUp := time.Now()
	const tag = "px"
	h.insertTagged(tag, exhaustedJobs, 50)
	h.eventually(time.Minute, func() bool {
		return h.count(`SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND state = 'completed'`) == exhaustedJobs
	}, "the peer did not work the jobs enqueued while the starved worker's pool is exhausted")
	readyWhileExhausted := ready(starved)
	// The peer's reaper may act once the peer has heartbeated for the
	// starved worker's dead-after; hold the exhaustion well past that.
	deadAfter := time.Second
	time.Sleep(time.Until(peerUp.Add(deadAfter + exhaustedFor)))
	require.Equal(t, int64(exhaustedPool), blocked(), "the pool is still exhausted")
	require.Zero(t, h.count(`SELECT count(*) FROM river_job WHERE kind = 'export.project' AND state = 'completed'`))
	require.NoError(t, lock.Rollback(ctx))
	released := time.Now()

	h.eventually(2*time.Minute, func() bool {
		return h.count(`SELECT count(*) FROM project_export_jobs WHERE status = 'finished'`) == exhaustedExports &&
			h.count(`SELECT count(*) FROM river_job WHERE kind = 'export.project' AND state = 'completed'`) == exhaustedExports
	}, "the exports did not finish after the pool was released")
	allExported := h.lastCompletion("export.project").Sub(released)
	firstExported := h.firstCompletionAfter(released, "export.project")
	h.eventually(time.Minute, func() bool { return ready(starved) == http.StatusOK }, "the starved worker is not ready again")
	readyAgain := time.Since(released)
	maxBeatAge, dead := beatAge.Stop(), deadSeen.Stop()

	// Nobody was reaped.
	for _, w := range []*proc.Worker{starved, peer} {
		require.False(t, w.Exited(), "worker %s exited:\n%s", w.ID, w.Log())
		require.NotContains(t, w.Log(), "reaped dead worker", "worker %s reaped another", w.ID)
		require.NotContains(t, w.Log(), "worker reaped", "worker %s found itself reaped", w.ID)
	}
	require.Zero(t, h.count(`SELECT count(*) FROM test_audit WHERE deleted_worker IS NOT NULL`), "no worker row was deleted")
	require.Equal(t, int64(2), h.count(`SELECT count(*) FROM sluice_workers WHERE id IN ('starved', 'peer')`))
	require.Zero(t, h.count(`SELECT count(*) FROM river_job WHERE cardinality(errors) > 0 AND kind IN ('export.project', 'demo.sleep')`),
		"no attempt failed")

	// Every export done exactly once, by the starved worker, its archive
	// complete.
	exportsDoneOnce := h.count(`
		SELECT count(*) FROM river_job j JOIN project_export_jobs e ON e.job_id = j.id
		WHERE j.kind = 'export.project' AND e.status = 'finished'
		  AND j.state = 'completed' AND j.attempt = 1 AND j.attempted_by = '{starved}'
		  AND (SELECT count(*) FROM test_audit a WHERE a.job_id = j.id AND a.new_state = 'completed') = 1`)
	exportsLost := h.count(`
		SELECT count(*) FROM project_export_jobs e LEFT JOIN river_job j ON j.id = e.job_id
		WHERE e.status <> 'finished' OR j.state IS DISTINCT FROM 'completed'`)
	require.Equal(t, int64(exhaustedExports), h.count(`SELECT count(*) FROM river_job WHERE kind = 'export.project'`))
	require.Zero(t, exportsLost, "exports lost")
	require.Equal(t, int64(exhaustedExports), exportsDoneOnce, "each export completed once, in one attempt, by the starved worker")
	require.Zero(t, h.count(`
		SELECT count(*) FROM test_audit a JOIN river_job j ON j.id = a.job_id
		WHERE j.kind = 'export.project' AND a.new_state = 'completed' AND a.by_worker IS DISTINCT FROM 'starved'`))
	rows, err := h.pool.Query(ctx, `SELECT id, archive_path, records FROM project_export_jobs ORDER BY id`)
	require.NoError(t, err)
	type archive struct {
		id      int64
		path    string
		records int64
	}
	var archives []archive
	for rows.Next() {
		var a archive
		require.NoError(t, rows.Scan(&a.id, &a.path, &a.records))
		archives = append(archives, a)
	}
	require.NoError(t, rows.Err())
	require.Len(t, archives, exhaustedExports)
	for _, a := range archives {
		require.Equal(t, filepath.Join(dir, exports.ExportArchiveName(exhaustedProject, a.id)), a.path)
		require.Equal(t, int64(1+exhaustedBuilds), a.records)
		require.Equal(t, 1+exhaustedBuilds, archiveLines(t, a.path), "archive %s", a.path)
	}
	require.Equal(t, int64(exhaustedExports), executions(h, starved, "export.project"), "each export's code ran once")
	require.Zero(t, executions(h, peer, "export.project"))

	// Every short job done exactly once.
	rep := h.exactlyOnce(tag, exhaustedJobs)
	h.requireExactlyOnce(rep)
	require.Equal(t, int64(exhaustedJobs), executions(h, starved, "demo.sleep")+executions(h, peer, "demo.sleep"),
		"each short job's code ran once")
	require.Zero(t, h.count(`SELECT count(*) FROM river_job WHERE kind IN ('export.project', 'demo.sleep') AND state <> 'completed'`))

	t.Logf("pool exhaustion: exports: jobs in %d, done exactly once %d, lost %d; short jobs: %s",
		exhaustedExports, exportsDoneOnce, exportsLost, rep)
	t.Logf("pool of %d exhausted for %s (%s of it with the peer's reaper armed, dead-after %s); starved worker's heartbeat at most %d ms old, at most %d workers counted dead at once, /readyz %d while exhausted",
		exhaustedPool, released.Sub(exhausted).Round(time.Millisecond), released.Sub(peerUp.Add(deadAfter)).Round(time.Millisecond), deadAfter,
		maxBeatAge, dead, readyWhileExhausted)
	t.Logf("time to recover: after the release, first export done in %s, every export in %s, /readyz OK in %s",
		firstExported.Round(time.Millisecond), allExported.Round(time.Millisecond), readyAgain.Round(time.Millisecond))
}

// ready is the status of a worker's /readyz (0: no answer).
func ready(w *proc.Worker) int {
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + w.Addr + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// archiveLines counts the lines of a gzip'd export archive.
func archiveLines(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	gz, err := gzip.NewReader(f)
	require.NoError(t, err)
	sc := bufio.NewScanner(gz)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	n := 0
	for sc.Scan() {
		n++
	}
	require.NoError(t, sc.Err(), fmt.Sprintf("read %s", path))
	return n
}
