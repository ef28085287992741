package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/testdb"
)

func TestLimitsCLI(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	pool, err := db.Open(context.Background(), url, 10*time.Second)
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
	require.Regexp(t, `(?m)^demo\.sleep\s+-1 \(circuit breaker\)\s+0\s+0\s+-$`, out)

	code, out = sluice(t, url, "limits", "list", "--json")
	require.Equal(t, 0, code, out)
	var rows []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &rows))
	require.Len(t, rows, 1)
	require.EqualValues(t, -1, rows[0]["max_concurrency"])

	// A parked job shows up in parked list.
	code, out = sluice(t, url, "run", "demo.sleep", "--args", `{"ms": 1}`)
	require.Equal(t, 0, code, out)
	code, out = sluice(t, url, "parked", "list", "demo.sleep")
	require.Equal(t, 0, code, out)
	require.Regexp(t, `(?m)^\d+\s+demo\.sleep\s+sluice_run_[0-9a-f]+\s+\S+\s+\d+\s+\{"ms": 1`, out)
	code, out = sluice(t, url, "parked", "list", "--json")
	require.Equal(t, 0, code, out)
	require.NoError(t, json.Unmarshal([]byte(out), &rows))
	require.Len(t, rows, 1)

	code, out = sluice(t, url, "limits", "clear", "demo.sleep")
	require.Equal(t, 0, code, out)
	require.Equal(t, "demo.sleep: unlimited (limit removed)\n", out)

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
		{[]string{"limits", "clear", "demo.sleep"}, `no limit is set for "demo.sleep"`},
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
	pool, err := db.Open(ctx, url, 10*time.Second)
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
		return count("SELECT count(*) FROM concurrency_executions") == 2 && count("SELECT count(*) FROM concurrency_parked_jobs") == 4
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
				if pool.QueryRow(ctx, "SELECT count(*) FROM concurrency_executions").Scan(&c) == nil && c > maxSlots.Load() {
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
		return count("SELECT count(DISTINCT args->>'ms') FROM river_job WHERE kind = 'demo.sleep' AND state = 'completed' AND NOT metadata ? 'sluice_parked'") == n
	}, 2*time.Minute, 50*time.Millisecond)
	require.LessOrEqual(t, maxSlots.Load(), int32(2))
	require.Zero(t, count("SELECT count(*) FROM concurrency_parked_jobs"), "no parked job lost")
	require.Zero(t, count("SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND finalized_at IS NULL"))
	require.Equal(t, n, count("SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND state = 'completed' AND NOT metadata ? 'sluice_parked'"),
		"each job ran to completion exactly once")
	var ms []string
	rows, err := pool.Query(ctx, "SELECT args->>'ms' FROM river_job WHERE kind = 'demo.sleep' AND state = 'completed' AND NOT metadata ? 'sluice_parked'")
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		ms = append(ms, s)
	}
	sort.Strings(ms)
	require.Equal(t, []string{"2000", "2001", "2002", "2003", "2004", "2005"}, ms)
}

// startWorkerProcess starts `sluice worker` on url with extra environment
// env and waits for /healthz; the process is killed when the test ends.
func startWorkerProcess(t *testing.T, url string, env ...string) *exec.Cmd {
	t.Helper()
	addr := freeAddr(t)
	cmd := exec.Command(sluiceBin, "worker")
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
