package app_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/internal/testlog"
	"github.com/sluice-dev/sluice/modules/demo"
)

// startWorker runs a worker on url until the returned stop is called; stop
// returns Run's error and how long the stop took.
func startWorker(t *testing.T, cfg app.Config) (*app.Worker, func() (error, time.Duration)) {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = jobtest.Logger(t)
	}
	if cfg.HTTPAddr == "" {
		cfg.HTTPAddr = "127.0.0.1:0"
	}
	w, err := app.NewWorker(context.Background(), cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	stopped := false
	stop := func() (error, time.Duration) {
		stopped = true
		start := time.Now()
		cancel()
		select {
		case err := <-done:
			return err, time.Since(start)
		case <-time.After(time.Minute):
			t.Fatal("worker did not stop within a minute")
			return nil, 0
		}
	}
	t.Cleanup(func() {
		if !stopped {
			_, _ = stop()
		}
	})
	// Started once it serves HTTP (the server starts after the River client).
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + w.HTTPAddr() + cfg.HTTPPrefix + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 10*time.Second, 10*time.Millisecond)
	return w, stop
}

func insert(t *testing.T, url string, args river.JobArgs) int64 {
	t.Helper()
	ctx := context.Background()
	pool, err := pgkit.Open(ctx, url, 10*time.Second)
	require.NoError(t, err)
	defer pool.Close()
	client, err := app.NewInsertClient(pool, nil)
	require.NoError(t, err)
	res, err := client.Insert(ctx, args, nil)
	require.NoError(t, err)
	return res.Job.ID
}

func jobState(t *testing.T, url string, id int64) rivertype.JobState {
	t.Helper()
	ctx := context.Background()
	pool, err := pgkit.Open(ctx, url, 10*time.Second)
	require.NoError(t, err)
	defer pool.Close()
	var state string
	require.NoError(t, pool.QueryRow(ctx, "SELECT state FROM river_job WHERE id = $1", id).Scan(&state))
	return rivertype.JobState(state)
}

func waitState(t *testing.T, url string, id int64, want rivertype.JobState) {
	t.Helper()
	require.Eventually(t, func() bool { return jobState(t, url, id) == want }, 20*time.Second, 20*time.Millisecond,
		"job %d never reached %s", id, want)
}

func TestWorkerRefusesUnmigratedDatabase(t *testing.T) {
	t.Parallel()

	url := testdb.NewEmpty(t)
	_, err := app.NewWorker(context.Background(), app.Config{Modules: jobtest.Modules(), DatabaseURL: url, HTTPAddr: "127.0.0.1:0"})
	require.ErrorContains(t, err, "sluice migrate up")
}

func TestWorkerHTTP(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	w, _ := startWorker(t, app.Config{Modules: jobtest.Modules(), DatabaseURL: url})
	base := "http://" + w.HTTPAddr()

	get := func(path string) (int, string) {
		resp, err := http.Get(base + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body)
	}

	code, body := get("/healthz")
	require.Equal(t, http.StatusOK, code)
	require.JSONEq(t, `{"status":"ok"}`, body)

	code, _ = get("/readyz")
	require.Equal(t, http.StatusOK, code)

	id := insert(t, url, demo.SleepArgs{MS: 1})
	waitState(t, url, id, rivertype.JobStateCompleted)
	require.Eventually(t, func() bool {
		_, body = get("/metrics")
		return strings.Contains(body, `sluice_jobs_total{kind="demo.sleep",outcome="completed",queue="default"} 1`)
	}, 5*time.Second, 20*time.Millisecond)
	require.Contains(t, body, `sluice_job_duration_seconds_bucket{kind="demo.sleep",queue="default"`)
	require.Contains(t, body, "go_goroutines")
	require.Contains(t, body, "process_cpu_seconds_total")
}

func TestWorkerReadyzReportsDatabaseDown(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	w, _ := startWorker(t, app.Config{Modules: jobtest.Modules(), DatabaseURL: url})

	// Kill every connection of the worker and forbid new ones: the database
	// is unreachable for it.
	admin, err := pgkit.Open(context.Background(), testdb.ServerURL(), 10*time.Second)
	require.NoError(t, err)
	defer admin.Close()
	dbName := strings.TrimPrefix(urlDatabase(t, url), "/")
	_, err = admin.Exec(context.Background(), "ALTER DATABASE "+dbName+" ALLOW_CONNECTIONS false")
	require.NoError(t, err)
	_, err = admin.Exec(context.Background(), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", dbName)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "ALTER DATABASE "+dbName+" ALLOW_CONNECTIONS true")
	})

	resp, err := http.Get("http://" + w.HTTPAddr() + "/readyz")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	var body map[string]string
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	require.Equal(t, "unavailable", body["status"])

	resp2, err := http.Get("http://" + w.HTTPAddr() + "/healthz")
	require.NoError(t, err)
	resp2.Body.Close()
	require.Equal(t, http.StatusOK, resp2.StatusCode, "the process itself is alive")
}

func TestWorkerGracefulShutdown(t *testing.T) {
	t.Parallel()

	t.Run("running jobs finish", func(t *testing.T) {
		t.Parallel()
		url := testdb.New(t)
		_, stop := startWorker(t, app.Config{Modules: jobtest.Modules(), DatabaseURL: url, ShutdownTimeout: 10 * time.Second})
		ids := []int64{
			insert(t, url, demo.SleepArgs{MS: 800}),
			insert(t, url, demo.SleepArgs{MS: 800}),
		}
		for _, id := range ids {
			waitState(t, url, id, rivertype.JobStateRunning)
		}
		err, took := stop()
		require.NoError(t, err)
		require.Less(t, took, 10*time.Second)
		for _, id := range ids {
			require.Equal(t, rivertype.JobStateCompleted, jobState(t, url, id))
		}
	})

	t.Run("jobs still running at the timeout are cancelled", func(t *testing.T) {
		t.Parallel()
		url := testdb.New(t)
		_, stop := startWorker(t, app.Config{Modules: jobtest.Modules(), DatabaseURL: url, ShutdownTimeout: 300 * time.Millisecond})
		id := insert(t, url, demo.SleepArgs{MS: 60_000})
		waitState(t, url, id, rivertype.JobStateRunning)
		err, took := stop()
		require.NoError(t, err)
		require.Less(t, took, 5*time.Second)
		// Interrupted by the stop, the job goes back to be retried (River
		// makes a retry due within a second available at once).
		require.Contains(t, []rivertype.JobState{rivertype.JobStateRetryable, rivertype.JobStateAvailable}, jobState(t, url, id))
	})

	t.Run("jobs ignoring cancellation do not block the exit", func(t *testing.T) {
		t.Parallel()
		url := testdb.New(t)
		_, stop := startWorker(t, app.Config{Modules: jobtest.Modules(), DatabaseURL: url, ShutdownTimeout: 200 * time.Millisecond, HardStopGrace: 300 * time.Millisecond})
		id := insert(t, url, demo.SleepArgs{MS: 60_000, IgnoreCancel: true})
		waitState(t, url, id, rivertype.JobStateRunning)
		err, took := stop()
		require.NoError(t, err)
		require.Less(t, took, 5*time.Second)
	})
}

func urlDatabase(t *testing.T, url string) string {
	t.Helper()
	cfg, err := testdb.PoolConfig(url)
	require.NoError(t, err)
	return cfg.ConnConfig.Database
}

// TestRiverLogsQuietUnlessDebug: River's own INFO lines (its client and
// producers starting and stopping) stay out of a worker's log at the INFO
// level, and come back at DEBUG; the worker's own lines are there either
// way.
func TestRiverLogsQuietUnlessDebug(t *testing.T) {
	t.Parallel()
	for level, wantRiver := range map[slog.Level]bool{slog.LevelInfo: false, slog.LevelDebug: true} {
		t.Run(level.String(), func(t *testing.T) {
			t.Parallel()
			logs := &testlog.Buffer{}
			logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: level}))
			_, stop := startWorker(t, app.Config{Modules: jobtest.Modules(), DatabaseURL: testdb.New(t), Logger: logger})
			err, _ := stop()
			require.NoError(t, err)
			out := logs.String()
			require.Contains(t, out, `msg="worker started"`)
			require.Regexp(t, `msg="worker started" worker_id=\S+ database="host=\S+ port=\d+ user=\S+ database=\S+"`, out,
				"the start line says which database, without a password")
			require.Equal(t, wantRiver, strings.Contains(out, `msg="River client started"`), out)
		})
	}
}

// TestWorkerClosedUnrunLeavesNoConnection: a worker built and closed
// without running (a program that gives up before Run) stops the limiter's
// services that its River client started: the listener's connection of
// its own does not outlive Close.
func TestWorkerClosedUnrunLeavesNoConnection(t *testing.T) {
	t.Parallel()
	url := testdb.New(t)
	pool := openPool(t, url)
	cfg := app.Config{Modules: jobtest.Modules(), DatabaseURL: url, ID: "closed-unrun", Logger: jobtest.Logger(t)}
	w, err := app.NewWorker(context.Background(), cfg)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return countRows(t, pool, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'sluice worker closed-unrun' AND query LIKE '%LISTEN %'`) > 0
	}, 10*time.Second, 10*time.Millisecond, "the limiter's listener is up")
	w.Close()
	require.Eventually(t, func() bool {
		return countRows(t, pool, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'sluice worker closed-unrun'`) == 0
	}, 10*time.Second, 10*time.Millisecond, "the worker's connections are closed")
}
