package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/proc"
	"github.com/sluice-dev/sluice/internal/testdb"
)

// TestGreeter builds the greeter and runs it as a real process against an
// empty database: migrate, enqueue (good and bad input), a worker that works
// the enqueued job and the migration's schedule, limits, and a graceful
// stop.
func TestGreeter(t *testing.T) {
	t.Parallel()

	bin := filepath.Join(t.TempDir(), "greeter")
	build := exec.Command("go", "build", "-o", bin, ".")
	buildOut, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", buildOut)

	url := testdb.NewEmpty(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url) // the connection's own search_path, as the greeter's
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	count := func(sql string, args ...any) int64 {
		t.Helper()
		var n int64
		require.NoError(t, pool.QueryRow(ctx, sql, args...).Scan(&n), sql)
		return n
	}

	run := func(args ...string) (int, string) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+url)
		out, err := cmd.CombinedOutput()
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			return exitErr.ExitCode(), string(out)
		}
		require.NoError(t, err, "greeter %v", args)
		return 0, string(out)
	}
	ok := func(args ...string) string {
		t.Helper()
		code, out := run(args...)
		require.Equal(t, 0, code, "greeter %v: %s", args, out)
		return out
	}

	// migrate up applies River's, sluice's and the greeter's migrations.
	out := ok("migrate", "up")
	require.Regexp(t, `(?m)^app\s+up\s+1 00001_greetings\.sql`, out)
	out = ok("migrate", "status")
	require.Regexp(t, `(?m)^app\s+applied\s+1 00001_greetings\.sql$`, out)
	require.NotRegexp(t, `(?m)^\S+\s+pending`, out)

	// The application's table is in the connection's own schema (public),
	// next to River's; sluice's tables and version tables in schema sluice.
	schemaOf := func(table string) string {
		t.Helper()
		var schemas []string
		rows, err := pool.Query(ctx, "SELECT table_schema FROM information_schema.tables WHERE table_name = $1 ORDER BY 1", table)
		require.NoError(t, err)
		for rows.Next() {
			var s string
			require.NoError(t, rows.Scan(&s))
			schemas = append(schemas, s)
		}
		require.NoError(t, rows.Err())
		return strings.Join(schemas, ",")
	}
	require.Equal(t, "public", schemaOf("greetings"))
	require.Equal(t, "public", schemaOf("river_job"))
	for _, table := range []string{"schedules", "concurrency_limits", "settings", "goose_db_version", "goose_db_version_app"} {
		require.Equal(t, "sluice", schemaOf(table), table)
	}
	require.EqualValues(t, 1, count("SELECT count(*) FROM sluice.schedules WHERE name = 'greeter.every_second' AND kind = 'greeter.greet'"))

	// Good input is inserted; bad input and unknown kinds are refused with
	// exit 2 before anything is written.
	out = ok("enqueue", "greeter.greet", "--args", `{"name":"ada"}`)
	require.Regexp(t, `^\d+\n$`, out)
	code, out := run("enqueue", "greeter.greet", "--args", `{"name":""}`)
	require.Equal(t, 2, code, out)
	require.Contains(t, out, `field "name"`)
	require.Contains(t, out, "greeter: ", "the binary's own name")
	require.Contains(t, out, "Run 'greeter enqueue --help' for usage.")
	code, out = run("enqueue", "greeter.nope", "--args", `{"name":"ada"}`)
	require.Equal(t, 2, code, out)
	require.Contains(t, out, `unknown job kind "greeter.nope"`)
	require.EqualValues(t, 1, count("SELECT count(*) FROM river_job"))

	// A worker greets ada and, every second, cron (the schedule of the
	// greeter's migration).
	worker := exec.Command(bin, "worker", "--id", "greeter-test", "--http-addr", proc.FreeAddr(t),
		"--schedule-poll-interval", "100ms", "--log-format", "text")
	worker.Env = append(os.Environ(), "DATABASE_URL="+url)
	// One writer for both streams: exec writes it from one goroutine, and
	// the log is read only once the process has ended.
	var log bytes.Buffer
	worker.Stdout, worker.Stderr = &log, &log
	require.NoError(t, worker.Start())
	done := make(chan error, 1)
	go func() { done <- worker.Wait() }()
	t.Cleanup(func() {
		_ = worker.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("worker log:\n%s", log.String())
		}
	})
	require.Eventually(t, func() bool {
		return count("SELECT count(*) FROM greetings WHERE name = 'ada'") == 1 &&
			count("SELECT count(*) FROM greetings WHERE name = 'cron'") >= 1
	}, 15*time.Second, 50*time.Millisecond, "greetings of ada and of the schedule")

	// Limits of the greeter's kind, set while the worker runs.
	out = ok("limits", "set", "greeter.greet", "1")
	require.Equal(t, "greeter.greet: 1\n", out)
	out = ok("limits", "list")
	require.Regexp(t, regexp.MustCompile(`(?m)^greeter\.greet\s+concurrency\s+1\s`), out)

	// migrate down refuses while the worker is alive, naming it.
	code, out = run("migrate", "down")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "greeter-test")
	require.Contains(t, out, "--force")
	require.Equal(t, "public", schemaOf("greetings"), "a refused rollback changes nothing")

	// SIGTERM stops the worker gracefully: exit 0.
	require.NoError(t, worker.Process.Signal(syscall.SIGTERM))
	select {
	case <-done:
		require.Equal(t, 0, worker.ProcessState.ExitCode(), "worker exit code")
		done <- nil // for the cleanup
	case <-time.After(15 * time.Second):
		t.Fatal("worker still running 15s after SIGTERM")
	}

	// Without workers, migrate down rolls back the program's own newest
	// migration (component app by default), not sluice's.
	out = ok("migrate", "down")
	require.Regexp(t, `(?m)^app\s+down\s+1 00001_greetings\.sql`, out)
	require.Equal(t, "", schemaOf("greetings"))
	out = ok("migrate", "status")
	require.Regexp(t, `(?m)^app\s+pending\s+1 00001_greetings\.sql$`, out)
	require.Regexp(t, `(?m)^sluice\s+applied\s+14 00014_parking_metadata\.sql$`, out)
}
