package cli

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
)

// sluice runs the binary with DATABASE_URL=url and returns its exit code
// and combined output.
func sluice(t *testing.T, url string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(sluiceBin, args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+url)
	out, err := cmd.CombinedOutput()
	if exitErr, ok := err.(*exec.ExitError); ok {
		return exitErr.ExitCode(), string(out)
	}
	require.NoError(t, err)
	return 0, string(out)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

func TestMigrateTwice(t *testing.T) {
	t.Parallel()

	url := testdb.NewEmpty(t)
	code, out := sluice(t, url, "migrate", "up")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "00001_foundation.sql")
	code, out = sluice(t, url, "migrate")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "database schema is up to date")
	code, out = sluice(t, url, "migrate", "status")
	require.Equal(t, 0, code, out)
	require.NotRegexp(t, `(?m)^\S+\s+pending`, out)
}

func TestRunDemoSleep(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	code, out := sluice(t, url, "run", "demo.sleep", "--args", `{"ms":10}`)
	require.Equal(t, 0, code, out)
	require.Regexp(t, `^demo\.sleep job \d+ completed in \S+\n$`, out)
}

func TestEnqueueAndCancel(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	code, out := sluice(t, url, "enqueue", "demo.sleep", "--args", `{"ms":1}`, "--at", time.Now().Add(time.Hour).Format(time.RFC3339))
	require.Equal(t, 0, code, out)
	id, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	require.NoError(t, err, out)

	code, out = sluice(t, url, "jobs", "cancel", strconv.FormatInt(id, 10))
	require.Equal(t, 0, code, out)
	require.Equal(t, fmt.Sprintf("job %d (demo.sleep) cancelled\n", id), out)

	code, out = sluice(t, url, "jobs", "cancel", strconv.FormatInt(id, 10))
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "already cancelled")
}

// TestWorkerSIGTERM starts a real worker process, gives it work, and stops it
// with SIGTERM: running jobs finish, the process exits 0 within the timeout.
func TestWorkerSIGTERM(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	addr := freeAddr(t)
	cmd := exec.Command(sluiceBin, "worker", "--shutdown-timeout", "20s")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+url, "SLUICE_HTTP_ADDR="+addr, "SLUICE_LOG_FORMAT=json")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	logs := make(chan string, 1000)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logs <- sc.Text()
		}
		close(logs)
	}()

	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 20*time.Second, 20*time.Millisecond)

	var ids []string
	for range 3 {
		code, out := sluice(t, url, "enqueue", "demo.sleep", "--args", `{"ms":1500}`)
		require.Equal(t, 0, code, out)
		ids = append(ids, strings.TrimSpace(out))
	}
	pool, err := pgkit.Open(context.Background(), url, 10*time.Second)
	require.NoError(t, err)
	defer pool.Close()
	require.Eventually(t, func() bool {
		var running int
		require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM river_job WHERE state = 'running' AND kind = 'demo.sleep'").Scan(&running))
		return running == 3
	}, 20*time.Second, 20*time.Millisecond)

	start := time.Now()
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	// Every line up to the exit, read before Wait closes the pipe (reading
	// after it could lose the last ones).
	var all strings.Builder
	for line := range logs {
		all.WriteString(line + "\n")
	}
	require.NoError(t, cmd.Wait(), "a graceful stop exits 0")
	require.Less(t, time.Since(start), 20*time.Second)

	var completed int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM river_job WHERE state = 'completed' AND kind = 'demo.sleep'").Scan(&completed))
	require.Equal(t, 3, completed, "running jobs finish before the worker exits")

	require.Regexp(t, regexp.MustCompile(`"msg":"worker stopping: finishing running jobs"`), all.String())
	require.Contains(t, all.String(), `"msg":"worker stopped"`)
}
