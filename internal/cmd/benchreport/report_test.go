package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// jsonStream renders test2json events as go test -json prints them.
func jsonStream(t *testing.T, events ...event) string {
	t.Helper()
	var b strings.Builder
	for _, e := range events {
		line, err := json.Marshal(e)
		require.NoError(t, err)
		b.Write(line)
		b.WriteByte('\n')
	}
	return b.String()
}

func TestParseJSON(t *testing.T) {
	t.Parallel()

	const jobs = "github.com/sluice-dev/sluice/jobs"
	const e2e = "github.com/sluice-dev/sluice/e2e"
	in := jsonStream(t,
		event{Action: "output", Package: jobs, Output: "cpu: AMD EPYC\n"},
		event{Action: "run", Package: jobs, Test: "BenchmarkConcurrencyLimitParked"},
		event{Action: "output", Package: jobs, Test: "BenchmarkConcurrencyLimitParked", Output: "=== RUN   BenchmarkConcurrencyLimitParked\n"},
		event{Action: "output", Package: jobs, Test: "BenchmarkConcurrencyLimitParked", Output: "BenchmarkConcurrencyLimitParked\n"},
		// A result line split over two events, as go test emits it.
		event{Action: "output", Package: jobs, Test: "BenchmarkConcurrencyLimitParked", Output: "BenchmarkConcurrencyLimitParked-2   \t"},
		event{Action: "output", Package: jobs, Test: "BenchmarkConcurrencyLimitParked", Output: "       1\t5555 ns/op\t  5500 ms/run\t 5000 ideal-ms/run\t 0.9091 ratio\t 0.9000 target\t 61.50 p50-release-to-start-ms\t 90.00 p99-release-to-start-ms\n"},
		event{Action: "pass", Package: jobs, Test: "BenchmarkConcurrencyLimitParked"},
		event{Action: "run", Package: jobs, Test: "BenchmarkDropCancelingBuilds"},
		event{Action: "output", Package: jobs, Test: "BenchmarkDropCancelingBuilds", Output: "BenchmarkDropCancelingBuilds-2 \t 1\t 9 ns/op\t 420.0 ms/run\t 100.0 baseline-ms/run\t 4.200 ratio\t 3.000 target\n"},
		event{Action: "run", Package: e2e, Test: "BenchmarkNoopAsynq"},
		event{Action: "output", Package: e2e, Test: "BenchmarkNoopAsynq", Output: "    noop_bench_test.go:88: no Redis answers at 127.0.0.1:6379 (refused): asynq not measured\n"},
		event{Action: "output", Package: e2e, Test: "BenchmarkNoopAsynq", Output: "--- SKIP: BenchmarkNoopAsynq\n"},
		event{Action: "skip", Package: e2e, Test: "BenchmarkNoopAsynq"},
		event{Action: "run", Package: e2e, Test: "BenchmarkNew"},
		event{Action: "output", Package: e2e, Test: "BenchmarkNew", Output: "BenchmarkNew-2 \t 1\t 9 ns/op\t 12.5 widgets/s\t 10 baseline-widgets/s\t 1.25 ratio\t 1.1 target\n"},
		event{Action: "run", Package: e2e, Test: "BenchmarkBroken"},
		event{Action: "output", Package: e2e, Test: "BenchmarkBroken", Output: "    x_test.go:5: connection refused\n"},
		event{Action: "fail", Package: e2e, Test: "BenchmarkBroken"},
		event{Action: "fail", Package: e2e},
	)
	var echo bytes.Buffer
	run, err := Parse(strings.NewReader(in), &echo)
	require.NoError(t, err)
	require.Equal(t, "AMD EPYC", run.CPU)
	require.Equal(t, []string{e2e}, run.FailedPackages)
	require.NotContains(t, echo.String(), "=== RUN")
	require.Contains(t, echo.String(), "BenchmarkConcurrencyLimitParked-2   \t       1\t5555 ns/op")

	rows := Rows(run.Results)
	byName := map[string]Row{}
	var order []string
	for _, r := range rows {
		byName[r.Benchmark] = r
		order = append(order, r.Benchmark)
	}
	require.Equal(t, []string{
		"BenchmarkConcurrencyLimitParked", "BenchmarkConcurrencyLimitParked#latency",
		"BenchmarkDropCancelingBuilds", "BenchmarkNoopAsynq", "BenchmarkNoopAsynq#river", "BenchmarkNew", "BenchmarkBroken",
	}, order)

	require.Equal(t, Row{
		Benchmark: "BenchmarkConcurrencyLimitParked", What: specs["BenchmarkConcurrencyLimitParked"].What,
		Figure: "5500 ms/run", Comparison: "5000 ideal-ms/run", Ratio: "0.9091", Target: "ratio ≥ 0.9", Met: "yes",
	}, byName["BenchmarkConcurrencyLimitParked"])
	latency := byName["BenchmarkConcurrencyLimitParked#latency"]
	require.Equal(t, "61.5 p50-release-to-start-ms", latency.Figure)
	require.Equal(t, "90.0 p99-release-to-start-ms", latency.Comparison)
	require.Equal(t, "p50-release-to-start-ms < 50", latency.Target)
	require.Equal(t, "no", latency.Met)
	require.Equal(t, "1.23", latency.Ratio)

	drop := byName["BenchmarkDropCancelingBuilds"]
	require.Equal(t, "4.2", drop.Ratio)
	require.Equal(t, "ratio ≤ 3", drop.Target)
	require.Equal(t, "no", drop.Met)

	require.Equal(t, "skipped: no Redis answers at 127.0.0.1:6379 (refused): asynq not measured", byName["BenchmarkNoopAsynq"].Figure)
	require.Equal(t, "FAILED: connection refused", byName["BenchmarkBroken"].Figure)

	unknown := byName["BenchmarkNew"]
	require.Equal(t, "12.5 widgets/s", unknown.Figure)
	require.Equal(t, "10.0 baseline-widgets/s", unknown.Comparison)
	require.Equal(t, "ratio ? 1.1", unknown.Target)
	require.Equal(t, "?", unknown.Met)
}

func TestParsePlain(t *testing.T) {
	t.Parallel()

	in := `goos: linux
pkg: github.com/sluice-dev/sluice/scheduler
cpu: AMD EPYC
BenchmarkIdleTick: EXPLAIN (ANALYZE, BUFFERS) of the idle check:
Index Only Scan using schedules_due_idx on schedules
BenchmarkIdleTick-2   	       1	  999 ns/op	         0.1500 ms/tick	  0.3000 p99-ms/tick	  9.000 seqscan-ms/check	 0.01667 ratio	 5.000 target
BenchmarkDispatchLag-2   	       1	  999 ns/op	  80.00 p50-ms	  950.0 p99-ms	  1200 max-ms	  400.0 baseline-ms	  2.375 ratio	  2.000 target
PASS
ok  	github.com/sluice-dev/sluice/scheduler	12.3s
FAIL	github.com/sluice-dev/sluice/jobs	99.9s
`
	var echo bytes.Buffer
	run, err := Parse(strings.NewReader(in), &echo)
	require.NoError(t, err)
	require.Equal(t, in, echo.String())
	require.Equal(t, []string{"github.com/sluice-dev/sluice/jobs"}, run.FailedPackages)
	require.Len(t, run.Results, 2)
	require.Equal(t, "github.com/sluice-dev/sluice/scheduler", run.Results[0].Package)

	rows := Rows(run.Results)
	require.Equal(t, "0.150 ms/tick", rows[0].Figure)
	require.Equal(t, "9.00 seqscan-ms/check", rows[0].Comparison)
	require.Equal(t, "ms/tick < 5", rows[0].Target)
	require.Equal(t, "yes", rows[0].Met)
	require.Equal(t, "950 p99-ms", rows[1].Figure)
	require.Equal(t, "400 baseline-ms", rows[1].Comparison)
	require.Equal(t, "2.375", rows[1].Ratio)
	require.Equal(t, "ratio ≤ 2", rows[1].Target)
	require.Equal(t, "no", rows[1].Met)

	var table bytes.Buffer
	WriteTable(&table, rows)
	lines := strings.Split(strings.TrimSpace(table.String()), "\n")
	require.Len(t, lines, 4)
	require.True(t, strings.HasPrefix(lines[2], "| BenchmarkIdleTick | scheduler: "), lines[2])
}

func TestBaseName(t *testing.T) {
	t.Parallel()

	require.Equal(t, "BenchmarkX", baseName("BenchmarkX-2"))
	require.Equal(t, "BenchmarkX/n-10", baseName("BenchmarkX/n-10-16"))
	require.Equal(t, "BenchmarkX", baseName("BenchmarkX"))
}

func TestFormatPrecise(t *testing.T) {
	t.Parallel()

	for v, want := range map[float64]string{0.89996: "0.9", 0.8999: "0.8999", 1.0: "1", 0.0065194: "0.006519", 1234.5: "1234", 1e-9: "1e-09"} {
		require.Equal(t, want, formatPrecise(v), "%v", v)
	}
}

func TestFormatNumber(t *testing.T) {
	t.Parallel()

	for v, want := range map[float64]string{0: "0", 0.0012: "0.0012", 0.25: "0.250", 2.5: "2.50", 25.25: "25.2", 1234.6: "1235", -3: "-3.00"} {
		require.Equal(t, want, formatNumber(v), "%v", v)
	}
}
