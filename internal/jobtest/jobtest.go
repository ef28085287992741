// Package jobtest starts real River clients with sluice's workers and
// middleware for tests, on a database from testdb.
package jobtest

import (
	"cmp"
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testlog"
	"github.com/sluice-dev/sluice/kinds"
	"github.com/sluice-dev/sluice/maintenance"
	"github.com/sluice-dev/sluice/module"
	"github.com/sluice-dev/sluice/modules"
)

// Logger is a test logger: quiet unless SLUICE_TEST_LOG is set.
func Logger(tb testing.TB) *slog.Logger {
	tb.Helper()
	return testlog.Logger(tb)
}

// Program is the stock program: every built-in module on.
func Program() app.Program { return app.Program{Modules: Modules()} }

// Modules are the stock program's modules: every built-in module.
func Modules() []module.Module { return modules.All() }

// NewJobs returns the jobs of the stock program on pool with a private
// metrics registry.
func NewJobs(tb testing.TB, pool *pgxpool.Pool) (*app.Jobs, *prometheus.Registry) {
	tb.Helper()
	return NewJobsConfig(tb, pool, app.JobsConfig{})
}

// NewJobsConfig is NewJobs with cfg, whose program (default the stock
// program), logger and worker id default to the test's; its metrics go to
// the private registry returned.
func NewJobsConfig(tb testing.TB, pool *pgxpool.Pool, cfg app.JobsConfig) (*app.Jobs, *prometheus.Registry) {
	tb.Helper()
	reg := prometheus.NewRegistry()
	if cfg.Program.Workers == nil && cfg.Program.Modules == nil {
		cfg.Program = Program()
	}
	cfg.Logger = cmp.Or(cfg.Logger, Logger(tb))
	cfg.Registerer = reg
	cfg.WorkerID = cmp.Or(cfg.WorkerID, "test-"+tb.Name())
	j, err := app.NewJobs(pool, cfg)
	if err != nil {
		tb.Fatalf("jobtest: jobs: %v", err)
	}
	return j, reg
}

// Config tweaks a test client.
type Config struct {
	// ID is the client ID; default derived from the test name.
	ID string
	// Queues to work; default default and maintenance with 10 workers each.
	Queues map[string]river.QueueConfig
	// Configure, if set, edits the River config before the client is made.
	Configure func(*river.Config)
}

// Client is a started River client with its event subscription.
type Client struct {
	*river.Client[pgx.Tx]
	Events <-chan *river.Event

	mu   sync.Mutex
	seen map[int64]*river.Event // finished events not yet asked for
}

// Start builds a client working j's jobs with sluice's middleware,
// subscribes to job-finished events and starts it; it is stopped when tb
// ends.
func Start(tb testing.TB, pool *pgxpool.Pool, j *app.Jobs, cfg Config) *Client {
	tb.Helper()
	queues := cfg.Queues
	if queues == nil {
		queues = map[string]river.QueueConfig{
			river.QueueDefault: {MaxWorkers: 10},
			maintenance.Queue:  {MaxWorkers: 10},
		}
	}
	riverCfg := &river.Config{
		ID:                cfg.ID,
		FetchCooldown:     10 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		Logger:            j.Env.Logger,
		Queues:            queues,
		Schema:            pgkit.SchemasOf(pool).River,
		TestOnly:          true,
		WorkerMiddleware:  j.Middleware(),
		Workers:           j.Workers,
	}
	if cfg.Configure != nil {
		cfg.Configure(riverCfg)
	}
	driver, err := app.WorkDriver(pool, j.Limiter, riverCfg.Workers)
	if err != nil {
		tb.Fatalf("jobtest: driver: %v", err)
	}
	client, err := river.NewClient(driver, riverCfg)
	if err != nil {
		tb.Fatalf("jobtest: client: %v", err)
	}
	j.SetClient(client)
	events, cancel := client.Subscribe(
		river.EventKindJobCancelled, river.EventKindJobCompleted,
		river.EventKindJobFailed, river.EventKindJobSnoozed,
	)
	if err := client.Start(context.Background()); err != nil {
		tb.Fatalf("jobtest: start: %v", err)
	}
	tb.Cleanup(func() {
		cancel()
		ctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		defer stop()
		_ = client.StopAndCancel(ctx)
		j.Limiter.Flush() // give back leased slots, write the releases
	})
	return &Client{Client: client, Events: events, seen: map[int64]*river.Event{}}
}

// WaitFinished waits for the job-finished events of ids (in any order) and
// returns them by id.
func (c *Client) WaitFinished(tb testing.TB, timeout time.Duration, ids ...int64) map[int64]*river.Event {
	tb.Helper()
	want := map[int64]bool{}
	for _, id := range ids {
		want[id] = true
	}
	got := map[int64]*river.Event{}
	c.mu.Lock()
	defer c.mu.Unlock()
	for id := range want {
		if ev, ok := c.seen[id]; ok {
			got[id] = ev
			delete(c.seen, id)
		}
	}
	deadline := time.After(timeout)
	for len(got) < len(want) {
		select {
		case ev := <-c.Events:
			switch {
			case ev == nil || ev.Job == nil || ev.Kind == river.EventKindJobSnoozed:
			case want[ev.Job.ID]:
				got[ev.Job.ID] = ev
			default:
				c.seen[ev.Job.ID] = ev
			}
		case <-deadline:
			tb.Fatalf("jobtest: %d of %d jobs finished within %s", len(got), len(want), timeout)
		}
	}
	return got
}

// InsertAndWait inserts args and waits for the job to finish.
func (c *Client) InsertAndWait(tb testing.TB, args river.JobArgs, opts *river.InsertOpts) *rivertype.JobRow {
	tb.Helper()
	res, err := c.Insert(context.Background(), args, opts)
	if err != nil {
		tb.Fatalf("jobtest: insert: %v", err)
	}
	return c.WaitFinished(tb, 30*time.Second, res.Job.ID)[res.Job.ID].Job
}

// Registry is the kinds of the stock program.
func Registry(tb testing.TB) *kinds.Registry {
	tb.Helper()
	r, err := Program().Registry()
	if err != nil {
		tb.Fatalf("jobtest: registry: %v", err)
	}
	return r
}
