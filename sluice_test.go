package sluice_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/kinds"
	"github.com/sluice-dev/sluice/migrations"
	"github.com/sluice-dev/sluice/modules/demo"
	"github.com/sluice-dev/sluice/web"
)

// testConfig is a Config on a fresh database with the test's logger.
func testConfig(t *testing.T, workers *river.Workers, mods ...sluice.Module) sluice.Config {
	t.Helper()
	return sluice.Config{
		DatabaseURL: testdb.New(t),
		Logger:      jobtest.Logger(t),
		Workers:     workers,
		Modules:     mods,
	}
}

func greetWorkers() *river.Workers {
	workers := river.NewWorkers()
	river.AddWorker(workers, &GreetWorker{})
	return workers
}

// stop stops w within a minute.
func stop(t *testing.T, w *sluice.Worker) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return w.Stop(ctx)
}

func TestNewNothingToWork(t *testing.T) {
	t.Parallel()

	for name, workers := range map[string]*river.Workers{"nil bundle": nil, "empty bundle": river.NewWorkers()} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			w, err := sluice.New(context.Background(), testConfig(t, workers))
			require.Nil(t, w)
			require.ErrorIs(t, err, app.ErrNothingToWork)
			require.ErrorContains(t, err, "nothing to work")
		})
	}
}

func TestNewKindRegisteredTwice(t *testing.T) {
	t.Parallel()

	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(func(context.Context, *river.Job[SleepKindArgs]) error { return nil }))
	w, err := sluice.New(context.Background(), testConfig(t, workers, demo.Module()))
	require.Nil(t, w)
	require.EqualError(t, err, `sluice: job kind "demo.sleep" is registered twice (Config.Workers and module demo)`)
}

func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("out-of-range setting", func(t *testing.T) {
		t.Parallel()
		_, err := sluice.New(ctx, sluice.Config{DatabaseURL: testdb.DefaultServerURL, Workers: greetWorkers(), DefaultWorkers: -1})
		require.ErrorContains(t, err, "default queue workers must be between 1 and 10000, got -1")
	})

	t.Run("HTTP off loopback without a token", func(t *testing.T) {
		t.Parallel()
		_, err := sluice.New(ctx, sluice.Config{DatabaseURL: testdb.DefaultServerURL, Workers: greetWorkers(), HTTPAddr: ":8089"})
		require.ErrorIs(t, err, web.ErrTokenRequired)
		_, err = sluice.New(ctx, sluice.Config{DatabaseURL: testdb.DefaultServerURL, Workers: greetWorkers(), HTTPToken: "short"})
		require.ErrorContains(t, err, "HTTP token (SLUICE_HTTP_TOKEN) too short")
		_, err = sluice.New(ctx, sluice.Config{DatabaseURL: testdb.DefaultServerURL, Workers: greetWorkers(), HTTPPrefix: "jobs/"})
		require.ErrorContains(t, err, `invalid HTTP prefix "jobs/"`)
	})

	t.Run("bad queues", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			queues         map[string]int
			defaultWorkers int
			want           string
		}{
			{map[string]int{"Emails": 5}, 0, `invalid queues: invalid queue name "Emails"`},
			{map[string]int{"emails": 0}, 0, `invalid queues: queue "emails": jobs at once must be between 1 and 10000, got 0`},
			{map[string]int{"maintenance": 2}, 0, `invalid queues: queue "maintenance" is sluice's own and always served`},
			{map[string]int{"emails": 5}, 5, "queues (--queues) and default queue workers (--default-workers) are both set"},
		} {
			_, err := sluice.New(ctx, sluice.Config{DatabaseURL: testdb.DefaultServerURL, Workers: greetWorkers(),
				Queues: tc.queues, DefaultWorkers: tc.defaultWorkers})
			require.ErrorContains(t, err, tc.want)
		}
	})

	t.Run("unmigrated database", func(t *testing.T) {
		t.Parallel()
		_, err := sluice.New(ctx, sluice.Config{DatabaseURL: testdb.NewEmpty(t), Workers: greetWorkers(), Logger: jobtest.Logger(t)})
		require.ErrorIs(t, err, migrations.ErrNotMigrated)
	})
}

func TestNewLeavesWorkersAlone(t *testing.T) {
	t.Parallel()

	workers := greetWorkers()
	before, err := kinds.FromWorkers(workers)
	require.NoError(t, err)
	require.Equal(t, []kinds.Kind{kinds.Of[GreetArgs]()}, before)

	w, err := sluice.New(context.Background(), testConfig(t, workers, demo.Module()))
	require.NoError(t, err)
	require.NoError(t, w.Start(context.Background()))

	after, err := kinds.FromWorkers(workers)
	require.NoError(t, err)
	require.Equal(t, before, after, "sluice works a copy of the bundle, with its own workers added")

	// The copy works both the application's kind and the module's.
	events, cancel := w.Client().Subscribe(river.EventKindJobCompleted, river.EventKindJobFailed)
	defer cancel()
	greet, err := w.Client().Insert(context.Background(), GreetArgs{Name: "test"}, nil)
	require.NoError(t, err)
	sleep, err := w.Client().Insert(context.Background(), demo.SleepArgs{}, nil)
	require.NoError(t, err)
	states := map[int64]rivertype.JobState{}
	for len(states) < 2 {
		select {
		case ev := <-events:
			if ev.Job.ID == greet.Job.ID || ev.Job.ID == sleep.Job.ID { // (sluice's own schedules may complete jobs too)
				states[ev.Job.ID] = ev.Job.State
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("jobs finished: %v", states)
		}
	}
	require.Equal(t, map[int64]rivertype.JobState{
		greet.Job.ID: rivertype.JobStateCompleted,
		sleep.Job.ID: rivertype.JobStateCompleted,
	}, states)

	require.NoError(t, stop(t, w))
	after, err = kinds.FromWorkers(workers)
	require.NoError(t, err)
	require.Equal(t, before, after)
}

// TestWorkerServesConfiguredQueues: Config.Queues are the queues the
// worker serves, each with its concurrency, besides maintenance; it records
// them in its sluice_workers row, and leaves the queues it does not serve
// alone.
func TestWorkerServesConfiguredQueues(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	cfg := testConfig(t, greetWorkers())
	cfg.Queues = map[string]int{"greetings": 2}
	w, err := sluice.New(ctx, cfg)
	require.NoError(t, err)
	require.NoError(t, w.Start(ctx))
	defer func() { require.NoError(t, stop(t, w)) }()

	var queues string
	require.NoError(t, w.Pool().QueryRow(ctx, "SELECT queues::text FROM sluice_workers").Scan(&queues))
	require.JSONEq(t, `{"greetings": 2, "maintenance": 4}`, queues)

	events, cancel := w.Client().Subscribe(river.EventKindJobCompleted)
	defer cancel()
	unserved, err := w.Client().Insert(ctx, GreetArgs{Name: "nobody"}, nil)
	require.NoError(t, err)
	served, err := w.Client().Insert(ctx, GreetArgs{Name: "queue"}, &river.InsertOpts{Queue: "greetings"})
	require.NoError(t, err)
	for done := false; !done; {
		select {
		case ev := <-events:
			done = ev.Job.ID == served.Job.ID // (sluice's own schedules may complete jobs too)
		case <-time.After(30 * time.Second):
			t.Fatal("the job on the served queue did not complete")
		}
	}
	job, err := w.Client().JobGet(ctx, unserved.Job.ID)
	require.NoError(t, err)
	require.Equal(t, rivertype.JobStateAvailable, job.State, "the default queue is not served")
}

func TestWorkerStartStop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	cfg := testConfig(t, greetWorkers())
	cfg.HTTPAddr = "127.0.0.1:0"
	w, err := sluice.New(ctx, cfg)
	require.NoError(t, err)

	select {
	case <-w.Stopped():
		t.Fatal("Stopped closed before Start")
	default:
	}

	require.NoError(t, w.Start(ctx))
	require.EqualError(t, w.Start(ctx), "sluice: worker already started")

	// It serves HTTP once started.
	require.NotEmpty(t, w.HTTPAddr())
	resp, err := http.Get("http://" + w.HTTPAddr() + "/healthz")
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	// It is registered as a live worker.
	var rows int
	require.NoError(t, w.Pool().QueryRow(ctx, "SELECT count(*) FROM sluice_workers").Scan(&rows))
	require.Equal(t, 1, rows)

	select {
	case <-w.Stopped():
		t.Fatal("Stopped closed while running")
	default:
	}

	require.NoError(t, stop(t, w))
	select {
	case <-w.Stopped():
	default:
		t.Fatal("Stopped not closed after Stop")
	}
	require.NoError(t, w.Err())

	// Stopping again reports the same; starting again is refused.
	require.NoError(t, stop(t, w))
	require.EqualError(t, w.Start(ctx), "sluice: worker already started")

	// A clean stop removes its row (read on a pool of our own: the worker's
	// is closed).
	pool := openPool(t, cfg.DatabaseURL)
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM sluice_workers").Scan(&rows))
	require.Equal(t, 0, rows)

	_, err = http.Get("http://" + w.HTTPAddr() + "/healthz")
	require.Error(t, err, "the HTTP server is shut down")
}

func TestWorkerStopTimesOut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// A job that ignores cancellation keeps the worker from stopping within
	// a short ctx; Stop reports ctx's error and the worker still stops.
	cfg := testConfig(t, nil, demo.Module())
	cfg.ShutdownTimeout = 100 * time.Millisecond
	w, err := sluice.New(ctx, cfg)
	require.NoError(t, err)
	require.NoError(t, w.Start(ctx))
	res, err := w.Client().Insert(ctx, demo.SleepArgs{MS: 1500, IgnoreCancel: true}, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		job, err := w.Client().JobGet(ctx, res.Job.ID)
		return err == nil && job.State == rivertype.JobStateRunning
	}, 10*time.Second, 10*time.Millisecond)

	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancelShort()
	err = w.Stop(short)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	select {
	case <-w.Stopped():
	case <-time.After(time.Minute):
		t.Fatal("worker did not stop")
	}
	require.NoError(t, w.Err())

	// The job that ignored cancellation finished within the hard-stop grace.
	var state string
	require.NoError(t, openPool(t, cfg.DatabaseURL).QueryRow(ctx,
		"SELECT state FROM river_job WHERE id = $1", res.Job.ID).Scan(&state))
	require.Equal(t, string(rivertype.JobStateCompleted), state)
}

// openPool opens a pool of the test's own on url.
func openPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgkit.Open(context.Background(), url, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func TestWorkerStartFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// Two workers under one id: the second finds the first alive.
	cfg := testConfig(t, greetWorkers())
	cfg.ID = "twin"
	cfg.HeartbeatInterval = 100 * time.Millisecond
	first, err := sluice.New(ctx, cfg)
	require.NoError(t, err)
	require.NoError(t, first.Start(ctx))
	defer func() { require.NoError(t, stop(t, first)) }()

	second, err := sluice.New(ctx, cfg)
	require.NoError(t, err)
	started := make(chan error, 1)
	go func() { started <- second.Start(ctx) }()
	select {
	case err = <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("Start did not return")
	}
	require.ErrorContains(t, err, `worker id "twin" is in use by a live worker`)
	select {
	case <-second.Stopped():
	default:
		t.Fatal("Stopped not closed after a failed Start")
	}
	require.Equal(t, err, second.Err())
}

// TestWorkerStopBeforeStart: as River's Client.Stop, Stop of a worker never
// started returns nil; it releases the worker's pool, and the worker can no
// longer start.
func TestWorkerStopBeforeStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	w, err := sluice.New(ctx, testConfig(t, greetWorkers()))
	require.NoError(t, err)
	require.NoError(t, w.Stop(ctx))
	require.NoError(t, w.Stop(ctx), "a second Stop is harmless")
	select {
	case <-w.Stopped():
	default:
		t.Fatal("Stopped not closed by a Stop before Start")
	}
	require.NoError(t, w.Err())
	require.Zero(t, w.Pool().Stat().TotalConns(), "the pool is closed")
	require.ErrorContains(t, w.Start(ctx), "stopped before it was started")
}

// TestHandlerUnderPrefix: an application mounts Worker.Handler in its own
// server under a prefix, as the README shows: the JSON endpoints, sluice's
// pages and River UI all work there, behind the token but /healthz.
func TestHandlerUnderPrefix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	const token = "library-token-0123456789"
	cfg := testConfig(t, greetWorkers(), demo.Module())
	cfg.HTTPPrefix, cfg.HTTPToken = "/jobs", token
	w, err := sluice.New(ctx, cfg)
	require.NoError(t, err)
	require.NoError(t, w.Start(ctx))
	t.Cleanup(func() { _ = stop(t, w) })
	require.Empty(t, w.HTTPAddr(), "no server of its own")

	mux := http.NewServeMux()
	mux.Handle("/jobs/", http.StripPrefix("/jobs", w.Handler()))
	mux.HandleFunc("/", func(rw http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(rw, "the application") })
	srv := httptest.NewServer(mux)
	defer srv.Close()
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(path string, auth bool) (int, http.Header, string) {
		req, err := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		require.NoError(t, err)
		req.Header.Set("Accept", "text/html")
		if auth {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, resp.Header, string(body)
	}

	code, _, _ := get("/jobs/healthz", false)
	require.Equal(t, http.StatusOK, code)
	code, _, _ = get("/jobs/ui/workers", false)
	require.Equal(t, http.StatusUnauthorized, code)
	code, header, _ := get("/jobs/", true)
	require.Equal(t, http.StatusFound, code)
	require.Equal(t, "ui/", header.Get("Location"), "relative: /jobs/ui/")
	code, _, body := get("/jobs/ui/workers", true)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `href="../riverui/"`, "relative: /jobs/riverui/")
	code, _, body = get("/jobs/riverui/", true)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `{"apiUrl":"/jobs/riverui/api","base":"/jobs/riverui"}`)
	i := strings.Index(body, `src="/jobs/riverui/assets/`)
	require.Positive(t, i, body)
	asset := body[i+len(`src="`):]
	asset = asset[:strings.IndexByte(asset, '"')]
	code, _, _ = get(asset, true)
	require.Equal(t, http.StatusOK, code, asset)
	res, err := w.Client().Insert(ctx, GreetArgs{Name: "ada"}, &river.InsertOpts{ScheduledAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	code, _, body = get("/jobs/riverui/api/jobs/"+strconv.FormatInt(res.Job.ID, 10), true)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `"kind":"greet"`)
	code, _, body = get("/", false)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "the application", body)
}
