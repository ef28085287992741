package cli

import (
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/internal/testlog"
)

// TestWorkerTracingEnv: the stock worker refuses OTEL_* values that make
// no sense (exit 2, naming the variable); with an OTLP endpoint that does
// not answer it starts, works jobs, and warns that spans are dropped.
func TestWorkerTracingEnv(t *testing.T) {
	t.Parallel()
	url := testdb.New(t)
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"OTEL_TRACES_EXPORTER=jaeger"}, `invalid $OTEL_TRACES_EXPORTER "jaeger": want otlp or none`},
		{[]string{"OTEL_TRACES_EXPORTER=otlp", "OTEL_EXPORTER_OTLP_ENDPOINT=collector:4318"}, `invalid $OTEL_EXPORTER_OTLP_ENDPOINT "collector:4318"`},
		{[]string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318", "OTEL_EXPORTER_OTLP_PROTOCOL=thrift"}, `invalid $OTEL_EXPORTER_OTLP_PROTOCOL "thrift"`},
	} {
		cmd := exec.Command(sluiceBin, "worker", "--http-addr", "")
		cmd.Env = workerEnv(url, tc.env...)
		out, err := cmd.CombinedOutput()
		var exitErr *exec.ExitError
		require.ErrorAs(t, err, &exitErr, "%v: %s", tc.env, out)
		require.Equal(t, 2, exitErr.ExitCode(), "%v: %s", tc.env, out)
		require.Contains(t, string(out), tc.want)
	}

	cmd := exec.Command(sluiceBin, "worker", "--http-addr", "", "--log-format", "text")
	cmd.Env = workerEnv(url, "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:1", "OTEL_BSP_SCHEDULE_DELAY=50",
		"OTEL_EXPORTER_OTLP_TIMEOUT=300", "OTEL_SERVICE_NAME=tour")
	var out testlog.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	code, enq := sluice(t, url, "enqueue", "demo.sleep", "--args", `{"ms": 1}`)
	require.Equal(t, 0, code, enq)
	require.Eventually(t, func() bool {
		c, o := sluice(t, url, "jobs", "list", "--kind", "demo.sleep", "--state", "completed")
		return c == 0 && strings.Contains(o, "demo.sleep")
	}, 30*time.Second, 100*time.Millisecond, "the job runs with its spans going nowhere")
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "spans not exported") },
		20*time.Second, 50*time.Millisecond, "%s", &out)
	require.Contains(t, out.String(), "tracing on")
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), "%s", &out)
}
