package cli

import (
	"bytes"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/testdb"
)

// workerEnv is the test's environment without any SLUICE_HTTP_* setting,
// with DATABASE_URL=url and extra.
func workerEnv(url string, extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLUICE_HTTP_") {
			env = append(env, kv)
		}
	}
	return append(append(env, "DATABASE_URL="+url), extra...)
}

// TestWorkerHTTPToken: `sluice worker` off loopback needs $SLUICE_HTTP_TOKEN
// (exit 2 without one, or with a malformed one, saying why and never
// quoting it); with it, /healthz and /readyz answer anyone and everything
// else only the token, as a bearer token or a basic-auth password.
func TestWorkerHTTPToken(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	for _, tc := range []struct {
		args, env []string
		want      string
	}{
		{[]string{"worker", "--http-addr", "0.0.0.0:0"}, nil, `HTTP address "0.0.0.0:0" is off loopback and no token is set: set SLUICE_HTTP_TOKEN`},
		{[]string{"worker", "--http-addr", ":0"}, nil, `HTTP address ":0" is off loopback`},
		{[]string{"worker"}, []string{"SLUICE_HTTP_ADDR=[::]:0"}, `HTTP address "[::]:0" is off loopback`},
		{[]string{"worker", "--http-addr", "0.0.0.0:0"}, []string{"SLUICE_HTTP_TOKEN=tiny-pw"}, "HTTP token (SLUICE_HTTP_TOKEN) too short: want at least 16 characters, got 7"},
		{[]string{"worker"}, []string{"SLUICE_HTTP_TOKEN=tiny-pw"}, "too short" /* on loopback too */},
		{[]string{"worker"}, []string{"SLUICE_HTTP_TOKEN=a-token with-a-space"}, "not printable ASCII (or a space) at byte 8"},
	} {
		cmd := exec.Command(sluiceBin, tc.args...)
		cmd.Env = workerEnv(url, tc.env...)
		out, err := cmd.CombinedOutput()
		var exitErr *exec.ExitError
		require.ErrorAs(t, err, &exitErr, "%v %v: %s", tc.args, tc.env, out)
		require.Equal(t, 2, exitErr.ExitCode(), "%v %v: %s", tc.args, tc.env, out)
		require.True(t, strings.HasPrefix(string(out), "sluice: "), "%s", out)
		require.Contains(t, string(out), tc.want)
		require.NotContains(t, string(out), "tiny-pw")
		require.NotContains(t, string(out), "with-a-space")
	}

	// A worker on every interface, with its token.
	const token = "cli-test-token-0123456789"
	_, port, err := net.SplitHostPort(freeAddr(t))
	require.NoError(t, err)
	cmd := exec.Command(sluiceBin, "worker", "--http-addr", "0.0.0.0:"+port, "--log-level", "debug")
	cmd.Env = workerEnv(url, "SLUICE_HTTP_TOKEN="+token)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	base := "http://127.0.0.1:" + port
	status := func(path string, header ...string) int {
		req, err := http.NewRequest(http.MethodGet, base+path, nil)
		require.NoError(t, err)
		if len(header) == 2 {
			req.Header.Set(header[0], header[1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Eventually(t, func() bool { return status("/healthz") == http.StatusOK }, 20*time.Second, 20*time.Millisecond)
	require.Equal(t, http.StatusOK, status("/readyz"))
	require.Equal(t, http.StatusUnauthorized, status("/metrics"))
	require.Equal(t, http.StatusUnauthorized, status("/ui/", "Authorization", "Bearer not-the-token-at-all"))
	require.Equal(t, http.StatusOK, status("/metrics", "Authorization", "Bearer "+token))
	req, _ := http.NewRequest(http.MethodGet, "/", nil)
	req.SetBasicAuth("ops", token)
	require.Equal(t, http.StatusOK, status("/ui/workers", "Authorization", req.Header.Get("Authorization")))

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait())
	require.Contains(t, out.String(), `"http_token":true`)
	require.NotContains(t, out.String(), token, "the token was logged")
}
