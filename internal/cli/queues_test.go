package cli

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/proc"
	"github.com/sluice-dev/sluice/internal/testdb"
)

// queuesJSON runs `sluice queues list --json` and decodes it by queue.
func queuesJSON(t *testing.T, url string) map[string]queueView {
	t.Helper()
	code, stdout, stderr := runCLI(t, "--database-url", url, "queues", "list", "--json")
	require.Equal(t, 0, code, stderr)
	var list []queueView
	require.NoError(t, json.Unmarshal([]byte(stdout), &list), stdout)
	out := map[string]queueView{}
	for _, q := range list {
		out[q.Queue] = q
	}
	return out
}

// TestQueuesPauseOneWhileAnotherRuns: a worker started with --queues serves
// both queues and records them; a paused queue's jobs wait while the other
// queue's jobs run, and run once it is resumed (River's QueuePause and
// QueueResume).
func TestQueuesPauseOneWhileAnotherRuns(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	pool := livePool(t, url)
	queues := []string{"--queues", "default=2,emails=3", "--fetch-poll-interval", "200ms"}

	// River knows a queue once a worker has served it.
	code, _, stderr := runCLI(t, "--database-url", url, "queues", "pause", "emails")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, `sluice: no queue "emails" known to River`)

	first := proc.StartWorker(t, url, "first", queues...)
	require.JSONEq(t, `{"default": 2, "emails": 3, "maintenance": 4}`,
		qString(t, url, `SELECT queues::text FROM sluice_workers WHERE id = 'first'`))
	require.Eventually(t, func() bool {
		return jobtest.Count(t, pool, `SELECT count(*) FROM river_queue WHERE name IN ('default', 'emails')`) == 2
	}, 20*time.Second, 20*time.Millisecond)
	listed := queuesJSON(t, url)
	require.Equal(t, []servedView{{Worker: "first", MaxWorkers: 3}}, listed["emails"].ServedBy)
	require.Equal(t, []servedView{{Worker: "first", MaxWorkers: 4}}, listed["maintenance"].ServedBy)
	first.Signal(t, syscall.SIGTERM)
	require.Equal(t, 0, first.Wait(t, 30*time.Second))

	// Paused while no worker runs: the next worker starts with it paused.
	code, stdout, stderr := runCLI(t, "--database-url", url, "queues", "pause", "emails")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "queue emails paused: its jobs wait until 'sluice queues resume emails'\n", stdout)
	code, stdout, stderr = runCLI(t, "--database-url", url, "queues", "pause", "emails")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `^queue emails already paused \(since \S+\)\n$`, stdout)

	held := enqueueID(t, url, "demo.sleep", "--queue", "emails")
	ran := enqueueID(t, url, "demo.sleep", "--queue", "default")
	second := proc.StartWorker(t, url, "second", queues...)
	require.Eventually(t, func() bool { return jobtest.JobState(t, pool, ran) == "completed" }, 30*time.Second, 20*time.Millisecond, second.Log())
	// More of default's jobs, inserted and run one after the other: the
	// paused queue's producer has had its fetch cycles meanwhile.
	for range 3 {
		next := enqueueID(t, url, "demo.sleep", "--queue", "default")
		require.Eventually(t, func() bool { return jobtest.JobState(t, pool, next) == "completed" }, 30*time.Second, 20*time.Millisecond, second.Log())
	}
	require.Equal(t, "available", jobtest.JobState(t, pool, held), "the paused queue's job waits")

	listed = queuesJSON(t, url)
	emails := listed["emails"]
	require.NotNil(t, emails.PausedAt)
	require.Equal(t, int64(1), emails.Available)
	require.Equal(t, []servedView{{Worker: "second", MaxWorkers: 3}}, emails.ServedBy)
	require.Nil(t, listed["default"].PausedAt)
	code, stdout, stderr = runCLI(t, "--database-url", url, "queues", "list")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `(?m)^QUEUE\s+AVAILABLE\s+PENDING\s+RUNNING\s+RETRYABLE\s+SCHEDULED\s+OLDEST AVAILABLE\s+PAUSED\s+SERVED BY$`, stdout)
	require.Regexp(t, `(?m)^emails\s+1\s+0\s+0\s+0\s+0\s+\S+\s+since \S+\s+second \(3\)$`, stdout)
	require.Regexp(t, `(?m)^default\s+0\s+0\s+0\s+0\s+0\s+-\s+no\s+second \(2\)$`, stdout)

	code, stdout, stderr = runCLI(t, "--database-url", url, "queues", "resume", "emails")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "queue emails resumed\n", stdout)
	require.Eventually(t, func() bool { return jobtest.JobState(t, pool, held) == "completed" }, 30*time.Second, 20*time.Millisecond, second.Log())
	code, stdout, stderr = runCLI(t, "--database-url", url, "queues", "resume", "emails")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "queue emails is not paused\n", stdout)

	// "*": every queue River knows, as River's QueuePause has it.
	code, stdout, stderr = runCLI(t, "--database-url", url, "queues", "pause", "*")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "every queue paused\n", stdout)
	require.Zero(t, jobtest.Count(t, pool, `SELECT count(*) FROM river_queue WHERE paused_at IS NULL`))
	code, stdout, stderr = runCLI(t, "--database-url", url, "queues", "resume", "*")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "every queue resumed\n", stdout)
	require.Zero(t, jobtest.Count(t, pool, `SELECT count(*) FROM river_queue WHERE paused_at IS NOT NULL`))
}

// TestHealthWarnsUnservedQueue: a job on a queue no live worker serves
// turns `sluice health` to WARNING (exit 1) naming the queue; so does a
// queue paused longer than health.queue_paused_after.
func TestHealthWarnsUnservedQueue(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	pool := livePool(t, url)
	w := proc.StartWorker(t, url, "only-default", "--queues", "default=2")

	code, out := sluice(t, url, "health")
	require.Equal(t, 0, code, out)
	require.Regexp(t, `(?m)^unserved_queues\s+OK\s+none$`, out)

	id := enqueueID(t, url, "demo.sleep", "--queue", "reports")
	code, out = sluice(t, url, "health")
	require.Equal(t, 1, code, out)
	require.Regexp(t, `^WARNING: unserved_queues: 1 with available jobs that no live worker serves \(start a worker with --queues\): reports \(1 available, oldest waiting \S+\) \|`, out)
	require.Contains(t, out, "unserved_queues=1 paused_queues=0")

	code, out = sluice(t, url, "health", "--json")
	require.Equal(t, 1, code, out)
	var report app.HealthReport
	require.NoError(t, json.Unmarshal([]byte(out), &report))
	require.Equal(t, []string{"reports"}, report.UnservedQueueNames)

	// Gone: OK again. A queue paused too long: WARNING naming it.
	_, err := pool.Exec(t.Context(), `DELETE FROM river_job WHERE id = $1`, id)
	require.NoError(t, err)
	code, _, stderr := runCLI(t, "--database-url", url, "queues", "pause", "default")
	require.Equal(t, 0, code, stderr)
	code, out = sluice(t, url, "health")
	require.Equal(t, 0, code, out)
	_, err = pool.Exec(t.Context(), `UPDATE river_queue SET paused_at = now() - interval '3 hours' WHERE name = 'default'`)
	require.NoError(t, err)
	code, out = sluice(t, url, "health")
	require.Equal(t, 1, code, out)
	require.True(t, strings.HasPrefix(out, "WARNING: paused_queues: 1 paused longer than 1h (`sluice queues resume QUEUE`): default (paused 3h"), out)
	require.False(t, w.Exited())
}

// enqueueID runs `sluice enqueue args...` in-process and returns the job id.
func enqueueID(t *testing.T, url string, args ...string) int64 {
	t.Helper()
	code, stdout, stderr := runCLI(t, append([]string{"--database-url", url, "enqueue"}, args...)...)
	require.Equal(t, 0, code, stderr)
	id, err := strconv.ParseInt(strings.TrimSpace(stdout), 10, 64)
	require.NoError(t, err, stdout)
	return id
}

// qString runs a query returning one text value.
func qString(t *testing.T, url, sql string) string {
	t.Helper()
	var s string
	require.NoError(t, livePool(t, url).QueryRow(t.Context(), sql).Scan(&s))
	return s
}

// TestQueuesFlagWinsOverVariable: a flag wins over the other setting's
// environment variable (--queues over $SLUICE_DEFAULT_WORKERS,
// --default-workers over $SLUICE_QUEUES); the worker records the queues it
// serves.
func TestQueuesFlagWinsOverVariable(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	pool := livePool(t, url)
	queuesOf := func(id string) string {
		var q string
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT queues::text FROM sluice_workers WHERE id = $1`, id).Scan(&q))
		return q
	}
	startWorkerProcessArgs(t, url, []string{"--id", "by-flag", "--queues", "emails=2"}, "SLUICE_DEFAULT_WORKERS=3")
	require.JSONEq(t, `{"emails": 2, "maintenance": 4}`, queuesOf("by-flag"))
	startWorkerProcessArgs(t, url, []string{"--id", "by-default-flag", "--default-workers", "3"}, "SLUICE_QUEUES=emails=2")
	require.JSONEq(t, `{"default": 3, "maintenance": 4}`, queuesOf("by-default-flag"))
}
