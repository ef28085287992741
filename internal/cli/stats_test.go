package cli

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
)

// requireStatsShape checks the contract of the stats document: a JSON
// object whose "task_cancellation" maps each kind to exactly
// {"current_count_post_cancel": N, "total_count_post_cancel": N}; it
// returns that section.
func requireStatsShape(t *testing.T, doc string) map[string]map[string]int64 {
	t.Helper()
	var top map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(doc), &top), doc)
	require.Contains(t, top, "task_cancellation")
	require.Contains(t, top, "queues")
	var section map[string]map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(top["task_cancellation"], &section), doc)
	out := map[string]map[string]int64{}
	for kind, fields := range section {
		require.Len(t, fields, 2, "kind %s: %s", kind, top["task_cancellation"])
		out[kind] = map[string]int64{}
		for _, name := range []string{"current_count_post_cancel", "total_count_post_cancel"} {
			raw, ok := fields[name]
			require.True(t, ok, "kind %s lacks %s", kind, name)
			var n int64
			require.NoError(t, json.Unmarshal(raw, &n), "kind %s: %s is not an integer: %s", kind, name, raw)
			out[kind][name] = n
		}
	}
	return out
}

// TestStatsEndToEnd: a real worker process works a job that ignores
// cancellation; `sluice jobs cancel` cancels it, `sluice run
// task_cancellation.monitor` counts it, and `sluice stats [--json]` and the
// worker's /stats report it.
func TestStatsEndToEnd(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	pool, err := pgkit.Open(ctx, url, 10*time.Second)
	require.NoError(t, err)
	defer pool.Close()

	code, out := sluice(t, url, "stats", "--json")
	require.Equal(t, 0, code, out)
	require.Empty(t, requireStatsShape(t, out))

	addr := freeAddr(t)
	worker := exec.Command(sluiceBin, "worker", "--shutdown-timeout", "100ms")
	worker.Env = append(os.Environ(), "DATABASE_URL="+url, "SLUICE_HTTP_ADDR="+addr)
	require.NoError(t, worker.Start())
	t.Cleanup(func() {
		_ = worker.Process.Kill()
		_ = worker.Wait()
	})

	code, out = sluice(t, url, "enqueue", "demo.sleep", "--args", `{"ms": 600000, "ignore_cancel": true}`)
	require.Equal(t, 0, code, out)
	id := strings.TrimSpace(out)
	require.Eventually(t, func() bool {
		var state string
		require.NoError(t, pool.QueryRow(ctx, "SELECT state FROM river_job WHERE id = $1", id).Scan(&state))
		return state == "running"
	}, 30*time.Second, 20*time.Millisecond)
	_, err = pool.Exec(ctx, `UPDATE settings SET value = '0' WHERE key = 'task_cancellation.duration_millis'`)
	require.NoError(t, err)

	code, out = sluice(t, url, "jobs", "cancel", id)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "is running: cancellation requested")
	code, out = sluice(t, url, "run", "task_cancellation.monitor")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "task_cancellation.monitor job")

	code, out = sluice(t, url, "stats", "--json")
	require.Equal(t, 0, code, out)
	want := map[string]map[string]int64{"demo.sleep": {"current_count_post_cancel": 1, "total_count_post_cancel": 1}}
	require.Equal(t, want, requireStatsShape(t, out))

	code, out = sluice(t, url, "stats")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "Jobs per kind and state (sluice.queue_overview)")
	require.Regexp(t, `(?m)^\s+demo\.sleep\s+running\s+1\s*$`, out)
	require.Contains(t, out, "Task cancellation (jobs still running 0s after their cancellation; monitor enabled, all kinds)")
	require.Regexp(t, `(?m)^\s+KIND\s+CURRENT\s+TOTAL$`, out)
	require.Regexp(t, `(?m)^\s+demo\.sleep\s+1\s+1$`, out)

	var body string
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + addr + "/stats")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		body = string(b)
		return err == nil && resp.StatusCode == http.StatusOK
	}, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, want, requireStatsShape(t, body))
}

// TestStatsBadInput: bad flags and arguments are usage errors (exit 2); an
// unmigrated database is a runtime failure (exit 1) that says what to do.
func TestStatsBadInput(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	pool, err := pgkit.Open(context.Background(), url, 10*time.Second)
	require.NoError(t, err)
	defer pool.Close()
	before := testdb.Checksum(t, pool, append(sluiceTables, "task_cancellation_tracker", "task_cancellation_counters")...)

	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"extra argument", []string{"--database-url", url, "stats", "now"}, 2, "sluice stats expects no arguments, got 1 argument(s)"},
		{"unknown flag", []string{"--database-url", url, "stats", "--jsn"}, 2, "unknown flag: --jsn"},
		{"bad bool", []string{"--database-url", url, "stats", "--json=maybe"}, 2, `invalid argument "maybe" for "--json"`},
		{"bad log format", []string{"--database-url", url, "--log-format", "xml", "stats"}, 2, `invalid --log-format (or $SLUICE_LOG_FORMAT) "xml"`},
		{"no database", []string{"--database-url", "", "stats"}, 2, "no database URL"},
		{"unmigrated database", []string{"--database-url", testdb.NewEmpty(t), "stats", "--json"}, 1, "run `sluice migrate up`"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, tc.args...)
			require.Equal(t, tc.code, code, "stdout=%q stderr=%q", stdout, stderr)
			require.True(t, strings.HasPrefix(stderr, "sluice: "), stderr)
			require.Contains(t, stderr, tc.want)
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			require.True(t, len(lines) == 1 || (len(lines) == 2 && strings.HasPrefix(lines[1], "Run 'sluice stats --help'")),
				"the error is one line (plus the usage hint): %q", stderr)
			require.Empty(t, stdout)
		})
	}
	require.Equal(t, before, testdb.Checksum(t, pool, append(sluiceTables, "task_cancellation_tracker", "task_cancellation_counters")...))
}
