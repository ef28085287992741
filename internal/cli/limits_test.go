package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
)

func TestLimitsCLI(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	pool, err := pgkit.Open(context.Background(), url, 10*time.Second)
	require.NoError(t, err)
	defer pool.Close()

	code, out := sluice(t, url, "limits", "set", "demo.sleep", "3")
	require.Equal(t, 0, code, out)
	require.Equal(t, "demo.sleep: 3\n", out)
	code, out = sluice(t, url, "limits", "set", "demo.sleep", "-1")
	require.Equal(t, 0, code, out)
	require.Equal(t, "demo.sleep: -1 (circuit breaker)\n", out)

	code, out = sluice(t, url, "limits", "list")
	require.Equal(t, 0, code, out)
	require.Regexp(t, `(?m)^demo\.sleep\s+concurrency\s+-1 \(circuit breaker\)\s+sql\s+0\s+0\s+0\s+0\s+0\s+-$`, out)

	code, out = sluice(t, url, "limits", "list", "--json")
	require.Equal(t, 0, code, out)
	var rows []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &rows))
	require.Len(t, rows, 1)
	require.EqualValues(t, -1, rows[0]["concurrency"].(map[string]any)["max"])
	require.Equal(t, "sql", rows[0]["concurrency"].(map[string]any)["source"])

	// run on a circuit breaker gives up (exit 1), parks nothing and leaves
	// nothing behind.
	code, out = sluice(t, url, "run", "demo.sleep", "--args", `{"ms": 1}`, "--wait", "300ms")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "no demo.sleep slot free within --wait 300ms (its limit -1 is a circuit breaker)")
	require.Equal(t, 0, qInt(t, pool, "SELECT count(*) FROM river_job WHERE kind = 'demo.sleep'"), "job deleted unrun")
	require.Equal(t, 0, qInt(t, pool, "SELECT count(*) FROM concurrency_executions"), "no slot leaked")

	// A parked job (as a worker leaves one) shows up in parked list.
	var parkedID int64
	require.NoError(t, pool.QueryRow(context.Background(), `
		WITH j AS (INSERT INTO river_job (state, kind, args, queue, priority, max_attempts)
		           VALUES ('pending', 'demo.sleep', '{"ms": 1}', 'default', 1, 25) RETURNING id)
		INSERT INTO concurrency_parked_jobs (job_id, kind, reason) SELECT id, 'demo.sleep', 'breaker' FROM j RETURNING job_id`).Scan(&parkedID))
	code, out = sluice(t, url, "parked", "list", "demo.sleep")
	require.Equal(t, 0, code, out)
	require.Regexp(t, fmt.Sprintf(`(?m)^%d\s+demo\.sleep\s+default\s+pending\s+-\s+circuit breaker\s+\S+\s+\d+s\s+\{"ms": 1`, parkedID), out)
	code, out = sluice(t, url, "parked", "list", "--json")
	require.Equal(t, 0, code, out)
	require.NoError(t, json.Unmarshal([]byte(out), &rows))
	require.Len(t, rows, 1)
	require.EqualValues(t, parkedID, rows[0]["job_id"])

	// sluice jobs cancel works on it as River's JobCancel does: cancelled at
	// once, its parking record gone.
	code, out = sluice(t, url, "jobs", "cancel", fmt.Sprint(parkedID))
	require.Equal(t, 0, code, out)
	require.Equal(t, 1, qInt(t, pool, "SELECT count(*) FROM river_job WHERE id = $1 AND state = 'cancelled'", parkedID))
	require.Zero(t, qInt(t, pool, "SELECT count(*) FROM concurrency_parked_jobs"))

	code, out = sluice(t, url, "limits", "clear", "demo.sleep")
	require.Equal(t, 0, code, out)
	require.Equal(t, "demo.sleep: concurrency limit cleared\n", out)

	before := testdb.Checksum(t, pool, "concurrency_limits", "concurrency_parked_jobs", "concurrency_executions", "river_job")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"limits", "set", "demo.sleep"}, "expects a job KIND and a limit N"},
		{[]string{"limits", "set", "demo.sleep", "three"}, `invalid limit "three"`},
		{[]string{"limits", "set", "demo.sleep", "1.5"}, `invalid limit "1.5"`},
		{[]string{"limits", "set", "demo.sleep", "99999999999"}, `invalid limit "99999999999"`},
		{[]string{"limits", "set", "no.such.kind", "2"}, `unknown job kind "no.such.kind"`},
		{[]string{"limits", "set", "concurrency_limit.resume", "2"}, "is never limited"},
		{[]string{"limits", "clear", "demo.sleep"}, `no such limit is set for "demo.sleep"`},
		{[]string{"limits", "frob"}, `unknown subcommand "frob"`},
		{[]string{"parked", "list", "no.such.kind"}, `unknown job kind "no.such.kind"`},
		{[]string{"parked", "list", "--max", "0"}, "invalid --max 0"},
		{[]string{"parked", "list", "a", "b"}, "expects at most one KIND"},
	} {
		code, out := sluice(t, url, tc.args...)
		require.Equal(t, 2, code, "%v: %s", tc.args, out)
		require.Contains(t, out, tc.want, "%v", tc.args)
	}
	require.Equal(t, before, testdb.Checksum(t, pool, "concurrency_limits", "concurrency_parked_jobs", "concurrency_executions", "river_job"))
}

// TestLimitsWorkerKilled kills a worker process holding the slots of a
// limited kind: once River has rescued its jobs, the resume worker frees the
// stale slots, the parked jobs proceed, the limit holds throughout and no
// job is lost.
func TestLimitsWorkerKilled(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	pool, err := pgkit.Open(ctx, url, 10*time.Second)
	require.NoError(t, err)
	defer pool.Close()
	count := func(sql string) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, sql).Scan(&n))
		return n
	}

	code, out := sluice(t, url, "limits", "set", "demo.sleep", "2")
	require.Equal(t, 0, code, out)
	workerA := startWorkerProcess(t, url)
	const n = 6
	for i := range n {
		code, out := sluice(t, url, "enqueue", "demo.sleep", "--args", fmt.Sprintf(`{"ms": %d}`, 2000+i))
		require.Equal(t, 0, code, out)
	}
	require.Eventually(t, func() bool {
		return count("SELECT (SELECT count(*) FROM concurrency_executions) + (SELECT COALESCE(sum(slots), 0) FROM concurrency_leases)") == 2 && count("SELECT count(*) FROM concurrency_parked_jobs") == 4
	}, 30*time.Second, 20*time.Millisecond)

	var maxSlots atomic.Int32
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
				var c int32
				if pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM concurrency_executions) + (SELECT COALESCE(sum(slots), 0) FROM concurrency_leases)").Scan(&c) == nil && c > maxSlots.Load() {
					maxSlots.Store(c)
				}
			}
		}
	}()

	require.NoError(t, workerA.Process.Signal(syscall.SIGKILL))
	_ = workerA.Wait()
	// What River's rescuer does to a dead worker's jobs after
	// RescueStuckJobsAfter: make them retryable again.
	_, err = pool.Exec(ctx, `UPDATE river_job SET state = 'retryable', scheduled_at = now(),
		errors = array_append(errors, jsonb_build_object('at', now(), 'attempt', attempt, 'error', 'stuck: worker died'))
		WHERE state = 'running'`)
	require.NoError(t, err)

	startWorkerProcess(t, url)
	code, out = sluice(t, url, "enqueue", "concurrency_limit.resume", "--args", `{"kind": "demo.sleep"}`)
	require.Equal(t, 0, code, out)

	require.Eventually(t, func() bool {
		return count("SELECT count(DISTINCT args->>'ms') FROM river_job WHERE kind = 'demo.sleep' AND state = 'completed'") == n
	}, 2*time.Minute, 50*time.Millisecond)
	require.LessOrEqual(t, maxSlots.Load(), int32(2))
	require.Zero(t, count("SELECT count(*) FROM concurrency_parked_jobs"), "no parked job lost")
	require.Zero(t, count("SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND finalized_at IS NULL"))
	require.Equal(t, n, count("SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND state = 'completed'"),
		"each job ran to completion exactly once")
	var ms []string
	rows, err := pool.Query(ctx, "SELECT args->>'ms' FROM river_job WHERE kind = 'demo.sleep' AND state = 'completed'")
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		ms = append(ms, s)
	}
	sort.Strings(ms)
	require.Equal(t, []string{"2000", "2001", "2002", "2003", "2004", "2005"}, ms)
}

// TestRunningButWaiting: a job waiting in its worker for a slot is running
// to River; SQL, limits list and jobs list tell it from one that works.
// Limit 2, two workers, 12 jobs of 10 s: the workers fetch them all, 2 work
// and the other 10 wait (park-after 20 s), and the overview, limits list
// and jobs list all say so. (Jobs of 3 s ended before jobs list ran on a
// loaded machine: two completed, two more working, 8 waiting.)
func TestRunningButWaiting(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	pool := livePool(t, url)
	code, out := sluice(t, url, "limits", "set", "demo.sleep", "2")
	require.Equal(t, 0, code, out)
	startWorkerProcess(t, url, "SLUICE_PARK_AFTER=20s")
	startWorkerProcess(t, url, "SLUICE_PARK_AFTER=20s")
	const n = 12
	for range n {
		code, out := sluice(t, url, "enqueue", "demo.sleep", "--args", `{"ms": 10000}`)
		require.Equal(t, 0, code, out)
	}

	// What the operator's SQL sees: 12 running, 2 of them working. Within
	// a heartbeat of every fetch (a worker publishes its waiting jobs).
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var running, working, waiting int
		require.NoError(t, pool.QueryRow(ctx, `SELECT running, working, waiting FROM sluice_concurrency_overview
			WHERE kind = 'demo.sleep'`).Scan(&running, &working, &waiting))
		if running == n && working == 2 && waiting == n-2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("overview: running %d, working %d, waiting %d; want %d, 2, %d", running, working, waiting, n, n-2)
		}
	}
	require.Equal(t, n, qInt(t, pool, "SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND state = 'running'"),
		"waiting jobs are running to River")
	require.Equal(t, 2, qInt(t, pool, `SELECT count(*) FROM river_job j WHERE j.kind = 'demo.sleep' AND j.state = 'running'
		AND NOT EXISTS (SELECT 1 FROM sluice_waiting_jobs w WHERE w.job_id = j.id)`), "the jobs that work")

	code, out = sluice(t, url, "limits", "list")
	require.Equal(t, 0, code, out)
	require.Regexp(t, `(?m)^demo\.sleep\s+concurrency\s+2\s+sql\s+2\s+2\s+10\s+0\s+0\s+-$`, out)
	code, out = sluice(t, url, "limits", "list", "--json")
	require.Equal(t, 0, code, out)
	var docs []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &docs))
	require.Len(t, docs, 1)
	require.Equal(t, []any{12.0, 2.0, 10.0}, []any{docs[0]["running"], docs[0]["working"], docs[0]["waiting"]})

	code, out = sluice(t, url, "jobs", "list", "--kind", "demo.sleep")
	require.Equal(t, 0, code, out)
	require.Len(t, regexp.MustCompile(`(?m)^\d+\s+demo\.sleep\s+default\s+running\s+1/`).FindAllString(out, -1), 2, out)
	require.Len(t, regexp.MustCompile(`(?m)^\d+\s+demo\.sleep\s+default\s+running \(waiting for a slot\)\s+1/`).FindAllString(out, -1), n-2, out)
	code, out = sluice(t, url, "jobs", "list", "--kind", "demo.sleep", "--json")
	require.Equal(t, 0, code, out)
	var views []struct {
		ID      int64
		Waiting *struct {
			Reason   string `json:"reason"`
			WorkerID string `json:"worker_id"`
		} `json:"waiting"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &views))
	var waitingID int64
	for _, v := range views {
		if v.Waiting != nil {
			require.Equal(t, "limit", v.Waiting.Reason)
			require.NotEmpty(t, v.Waiting.WorkerID)
			waitingID = v.ID
		}
	}
	require.NotZero(t, waitingID)
	code, out = sluice(t, url, "jobs", "show", fmt.Sprint(waitingID))
	require.Equal(t, 0, code, out)
	require.Regexp(t, `(?m)^state:\s+running \(waiting for a slot\)$`, out)
	require.Regexp(t, `(?m)^waiting:\s+waiting in worker \S+ for a concurrency slot since \S+ \(\S+\), held by concurrency limit \(reason limit\); it does no work until it has one$`, out)
}

// TestKilledWorkersWaitingJobsPark: a worker killed (SIGKILL) while jobs
// wait in it for a slot: the reaper parks them in place, their attempts
// undone (they never ran), and rescues the job that was running (an
// attempt, with its error). Both ways a job waits: for a leased slot (a
// per-kind limit) and in the line (a per-key limit).
func TestKilledWorkersWaitingJobsPark(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		limit []string
	}{
		{"leased slots", []string{"limits", "set", "demo.sleep", "1"}},
		{"line", []string{"limits", "set", "demo.sleep", "1", "--by-args", "ms"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			url := testdb.New(t)
			pool := livePool(t, url)
			code, out := sluice(t, url, tc.limit...)
			require.Equal(t, 0, code, out)
			fast := []string{"SLUICE_PARK_AFTER=30s", "SLUICE_HEARTBEAT_INTERVAL=200ms", "SLUICE_DEAD_AFTER=1s"}
			a := startWorkerProcess(t, url, append(fast, "SLUICE_WORKER_ID=doomed")...)
			const n = 4
			for range n {
				code, out := sluice(t, url, "enqueue", "demo.sleep", "--args", `{"ms": 10000}`)
				require.Equal(t, 0, code, out)
			}
			// One runs, three wait in the worker (running to River).
			require.Eventually(t, func() bool {
				var running, waiting int
				require.NoError(t, pool.QueryRow(ctx, `SELECT running, waiting FROM sluice_concurrency_overview
					WHERE kind = 'demo.sleep'`).Scan(&running, &waiting))
				return running == n && waiting == n-1
			}, 20*time.Second, 10*time.Millisecond)
			require.NoError(t, a.Process.Signal(syscall.SIGKILL))
			_ = a.Wait()

			startWorkerProcess(t, url, fast...)
			require.Eventually(t, func() bool {
				return qInt(t, pool, "SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND state = 'completed'") == n
			}, time.Minute, 50*time.Millisecond)
			// The waiting jobs never ran in the dead worker: attempt 1 (their
			// one run), no error. The one it ran: attempt 2, its error.
			rows, err := pool.Query(ctx, `SELECT attempt, COALESCE(cardinality(errors), 0) FROM river_job WHERE kind = 'demo.sleep' ORDER BY attempt`)
			require.NoError(t, err)
			var got [][2]int
			for rows.Next() {
				var attempt, errs int
				require.NoError(t, rows.Scan(&attempt, &errs))
				got = append(got, [2]int{attempt, errs})
			}
			require.NoError(t, rows.Err())
			require.Equal(t, [][2]int{{1, 0}, {1, 0}, {1, 0}, {2, 1}}, got)
		})
	}
}

// startWorkerProcess starts `sluice worker` on url with extra environment
// env and waits for /healthz; the process is killed when the test ends.
func startWorkerProcess(t *testing.T, url string, env ...string) *exec.Cmd {
	t.Helper()
	return startWorkerProcessArgs(t, url, nil, env...)
}

// startWorkerProcessArgs is startWorkerProcess with extra arguments.
func startWorkerProcessArgs(t *testing.T, url string, args []string, env ...string) *exec.Cmd {
	t.Helper()
	addr := freeAddr(t)
	cmd := exec.Command(sluiceBin, append([]string{"worker"}, args...)...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+url, "SLUICE_HTTP_ADDR="+addr, "SLUICE_LOG_LEVEL=warn")
	cmd.Env = append(cmd.Env, env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("worker %s stderr:\n%s", addr, stderr.String())
		}
	})
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 20*time.Second, 20*time.Millisecond)
	return cmd
}

// TestRunOnLimitedKind: sluice run takes a slot as a worker's job would —
// it waits for one, gives up after --wait (exit 1, nothing left behind), or
// ignores the limit when told — and never parks or leaks a slot.
func TestRunOnLimitedKind(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	pool := livePool(t, url)

	// Another job holds the only slot.
	var holder int64
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO river_job (state, kind, args, queue, max_attempts, attempt, attempted_at, attempted_by)
		VALUES ('running', 'demo.sleep', '{"ms": 60000}', 'default', 25, 1, now(), '{elsewhere}') RETURNING id`).Scan(&holder))
	_, err := pool.Exec(ctx, `INSERT INTO concurrency_executions (job_id, kind, worker_id) VALUES ($1, 'demo.sleep', 'elsewhere')`, holder)
	require.NoError(t, err)
	code, out := sluice(t, url, "limits", "set", "demo.sleep", "1")
	require.Equal(t, 0, code, out)
	jobsOfRun := func() int {
		return qInt(t, pool, "SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND id <> $1", holder)
	}

	code, out = sluice(t, url, "run", "demo.sleep", "--args", `{"ms": 1}`, "--wait", "400ms")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "no demo.sleep slot free within --wait 400ms (1 of 1 slots taken)")
	require.Zero(t, jobsOfRun(), "the job is deleted unrun")
	require.Equal(t, 1, qInt(t, pool, "SELECT count(*) FROM concurrency_executions"), "only the holder's slot")

	code, out = sluice(t, url, "run", "demo.sleep", "--args", `{"ms": 1}`, "--wait", "-1s")
	require.Equal(t, 2, code, out)
	require.Contains(t, out, "invalid --wait -1s")

	// --ignore-limit runs it at once, without a slot.
	code, out = sluice(t, url, "run", "demo.sleep", "--args", `{"ms": 1}`, "--ignore-limit")
	require.Equal(t, 0, code, out)
	require.Regexp(t, `^demo\.sleep job \d+ completed`, out)

	// The slot frees while run waits: run takes it, then gives it back.
	go func() {
		time.Sleep(500 * time.Millisecond)
		_, _ = pool.Exec(context.Background(), `UPDATE river_job SET state = 'completed', finalized_at = now() WHERE id = $1`, holder)
		_, _ = pool.Exec(context.Background(), `DELETE FROM concurrency_executions WHERE job_id = $1`, holder)
		_, _ = pool.Exec(context.Background(), `UPDATE concurrency_limits SET admitted = 0 WHERE kind = 'demo.sleep'`)
	}()
	code, out = sluice(t, url, "run", "demo.sleep", "--args", `{"ms": 1}`, "--wait", "20s")
	require.Equal(t, 0, code, out)
	require.Regexp(t, `^demo\.sleep job \d+ completed`, out)
	require.Zero(t, qInt(t, pool, "SELECT count(*) FROM concurrency_executions"), "no slot leaked")
	require.Zero(t, qInt(t, pool, "SELECT admitted FROM concurrency_limits WHERE kind = 'demo.sleep'"))
	require.Zero(t, qInt(t, pool, "SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND state <> 'completed'"), "nothing parked")
}

// TestKeyedLimitsCLI: per-key and rate limits from the CLI: set, listed
// with their sources, cleared one at a time; and every bad input exits 2
// naming the problem, changing nothing.
func TestKeyedLimitsCLI(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	pool := livePool(t, url)

	code, out := sluice(t, url, "limits", "set", "demo.sleep", "2", "--by-args", "ms")
	require.Equal(t, 0, code, out)
	require.Equal(t, "demo.sleep: at most 2 at once per ms\n", out)
	code, out = sluice(t, url, "limits", "rate", "demo.sleep", "100/1m", "--by-args", "ms")
	require.Equal(t, 0, code, out)
	require.Equal(t, "demo.sleep: at most 100 starts in any 1m0s per ms\n", out)
	code, out = sluice(t, url, "limits", "set", "demo.sleep", "6")
	require.Equal(t, 0, code, out)

	code, out = sluice(t, url, "limits", "list")
	require.Equal(t, 0, code, out)
	require.Regexp(t, `(?m)^demo\.sleep\s+concurrency\s+6\s+sql\s`, out)
	require.Regexp(t, `(?m)^demo\.sleep\s+per key\s+2 by ms\s+sql\s`, out)
	require.Regexp(t, `(?m)^demo\.sleep\s+rate\s+100/1m0s per ms \(0 in window\)\s+sql\s`, out)
	code, out = sluice(t, url, "limits", "list", "--json")
	require.Equal(t, 0, code, out)
	var docs []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &docs))
	require.Len(t, docs, 1)
	require.Equal(t, map[string]any{"max": 2.0, "by_args": []any{"ms"}, "source": "sql"}, docs[0]["per_key"])
	require.Equal(t, map[string]any{"max": 100.0, "by_args": []any{"ms"}, "period_seconds": 60.0, "source": "sql"}, docs[0]["rate"])

	before := testdb.Checksum(t, pool, "concurrency_limits", "concurrency_parked_jobs", "concurrency_executions", "river_job")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"limits", "set", "demo.sleep", "2", "--by-args", "tenant"}, `its args have no field "tenant" (they have: fail, ignore_cancel, ms)`},
		{[]string{"limits", "set", "demo.sleep", "2", "--by-args", "ms,ms"}, `field "ms" given twice`},
		{[]string{"limits", "set", "demo.sleep", "0", "--by-args", "ms"}, "invalid per-key limit 0: want at least 1"},
		{[]string{"limits", "set", "no.such.kind", "2", "--by-args", "ms"}, `unknown job kind "no.such.kind"`},
		{[]string{"limits", "set", "demo.sleep", "2", "--by-args", "fail"}, "the per-key rate is partitioned by ms"},
		{[]string{"limits", "rate", "demo.sleep", "0/1s"}, "N must be 1 to"},
		{[]string{"limits", "rate", "demo.sleep", "-5/1s"}, "unknown shorthand flag"},
		{[]string{"limits", "rate", "demo.sleep", "5/500ms"}, "the window must be at least 1s"},
		{[]string{"limits", "rate", "demo.sleep", "5/1x"}, "DURATION must be a Go duration"},
		{[]string{"limits", "rate", "demo.sleep", "5"}, "want N/DURATION"},
		{[]string{"limits", "rate", "demo.sleep", "five/1s"}, "N must be a whole number"},
		{[]string{"limits", "rate", "demo.sleep", "5/48h"}, "the window must be at most 24h0m0s"},
		{[]string{"limits", "rate", "demo.sleep", "5/1s", "--by-args", "nope"}, `its args have no field "nope"`},
		{[]string{"limits", "rate", "no.such.kind", "5/1s"}, `unknown job kind "no.such.kind"`},
		{[]string{"limits", "rate", "demo.sleep"}, "expects a job KIND and a rate N/DURATION"},
		{[]string{"limits", "clear", "demo.sleep", "--bogus"}, "unknown flag: --bogus"},
	} {
		code, out := sluice(t, url, tc.args...)
		require.Equal(t, 2, code, "%v: %s", tc.args, out)
		require.Contains(t, out, tc.want, "%v", tc.args)
	}
	require.Equal(t, before, testdb.Checksum(t, pool, "concurrency_limits", "concurrency_parked_jobs", "concurrency_executions", "river_job"))

	// Each limit clears alone; the last one takes the row with it.
	code, out = sluice(t, url, "limits", "clear", "demo.sleep", "--rate")
	require.Equal(t, 0, code, out)
	require.Equal(t, "demo.sleep: rate limit cleared\n", out)
	code, out = sluice(t, url, "limits", "clear", "demo.sleep", "--rate")
	require.Equal(t, 2, code, out)
	require.Contains(t, out, `no such limit is set for "demo.sleep"`)
	require.Equal(t, 1, qInt(t, pool, "SELECT count(*) FROM concurrency_limits WHERE key_max = 2 AND max_concurrency = 6 AND rate_max IS NULL"))
	code, out = sluice(t, url, "limits", "clear", "demo.sleep")
	require.Equal(t, 0, code, out)
	require.Equal(t, "demo.sleep: concurrency, per-key limit cleared\n", out)
	require.Zero(t, qInt(t, pool, "SELECT count(*) FROM concurrency_limits"))
}
