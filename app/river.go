package app

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/kinds"
	"github.com/sluice-dev/sluice/limiter"
	"github.com/sluice-dev/sluice/tracing"
)

// Client is the River client type sluice uses.
type Client = river.Client[pgx.Tx]

// NewInsertClient returns a River client that inserts and manages jobs but
// works none, of no program (no Config.River): Program{TracerProvider:
// tp}.InsertClient(pool, nil), its inserts traced on tp (nil:
// OpenTelemetry's global provider).
func NewInsertClient(pool *pgxpool.Pool, tp trace.TracerProvider) (*Client, error) {
	return Program{TracerProvider: tp}.InsertClient(pool, nil)
}

// InsertClient returns the program's River client that inserts and manages
// jobs but works none (no workers, no queues), for the commands of Main
// other than worker and run (enqueue, schedule trigger, limits, jobs,
// queues, the modules' commands). Its River config is built as a worker's
// is (configureRiver): sluice's insert middleware (the insert span, on
// p.TracerProvider), then p.River, whose change to a field sluice owns is
// refused; so River's client-level defaults (MaxAttempts), the program's
// insert middleware and its hooks apply to these inserts as to its own.
// logger receives River's lines (riverLogger; nil: River's default).
func (p Program) InsertClient(pool *pgxpool.Pool, logger *slog.Logger) (*Client, error) {
	cfg := &river.Config{Schema: pgkit.SchemasOf(pool).River}
	if logger != nil {
		cfg.Logger = riverLogger(logger)
	}
	ins := []rivertype.JobInsertMiddleware{tracing.New(p.TracerProvider).InsertMiddleware()}
	if err := configureRiver(cfg, p.River, ins, nil); err != nil {
		return nil, err
	}
	client, err := river.NewClient(riverpgxv5.New(pool), cfg)
	if err != nil {
		return nil, fmt.Errorf("create River client: %w", err)
	}
	return client, nil
}

type clientOpts struct {
	fetchCooldown        time.Duration
	fetchPollInterval    time.Duration
	rescueStuckJobsAfter time.Duration
	id                   string
	queues               map[string]river.QueueConfig
	jobTimeout           time.Duration
	leaderElectionOff    bool
	softStopTimeout      time.Duration
	// configure is the program's Config.River (nil: none).
	configure func(*river.Config)
}

// newWorkClient builds a River client working the program's jobs, with
// sluice's middleware, and gives it to the workers that insert jobs.
func newWorkClient(pool *pgxpool.Pool, j *Jobs, logger *slog.Logger, opts clientOpts) (*Client, error) {
	driver, err := WorkDriver(pool, j.Limiter, j.Workers)
	if err != nil {
		return nil, err
	}
	cfg := &river.Config{
		FetchCooldown:          opts.fetchCooldown,
		FetchPollInterval:      opts.fetchPollInterval,
		ID:                     opts.id,
		RescueStuckJobsAfter:   opts.rescueStuckJobsAfter,
		Schema:                 pgkit.SchemasOf(pool).River,
		JobTimeout:             opts.jobTimeout,
		LeaderElectionDisabled: opts.leaderElectionOff,
		Logger:                 riverLogger(logger),
		Queues:                 opts.queues,
		SoftStopTimeout:        opts.softStopTimeout,
		Workers:                j.Workers,
	}
	if err := configureRiver(cfg, opts.configure, j.InsertMiddleware(), j.Middleware()); err != nil {
		return nil, err
	}
	if opts.leaderElectionOff {
		// River runs periodic jobs on the leader only, and refuses them on
		// a client that never leads (run's): the program's are its
		// workers'.
		cfg.PeriodicJobs = nil
	}
	client, err := river.NewClient(driver, cfg)
	if err != nil {
		return nil, fmt.Errorf("create River client: %w", err)
	}
	j.SetClient(client)
	return client, nil
}

// WorkDriver is the River driver of a client that works workers on pool:
// River's pgx driver, with lim deciding the fetched jobs of limited kinds
// together, in job-id order, right after each fetch (limiter.Driver). It
// starts lim's services (limiter.Limiter.Start): a client built on it works
// jobs; Limiter.Flush stops them once it stopped.
func WorkDriver(pool *pgxpool.Pool, lim *limiter.Limiter, workers *river.Workers) (riverdriver.Driver[pgx.Tx], error) {
	ks, err := kinds.FromWorkers(workers)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(ks))
	for i, k := range ks {
		names[i] = k.Name
	}
	lim.Start(context.Background())
	return lim.Driver(riverpgxv5.New(pool), names), nil
}

// riverLogger is the logger River's client logs to: sluice's, but from WARN
// up, unless sluice's logs debug lines (--log-level debug). River logs a
// line at INFO for each of its producers and services starting and
// stopping, which would drown a worker's own lines.
func riverLogger(logger *slog.Logger) *slog.Logger {
	if logger.Enabled(context.Background(), slog.LevelDebug) {
		return logger
	}
	return slog.New(&minLevelHandler{Handler: logger.Handler(), min: slog.LevelWarn})
}

// minLevelHandler drops the records below min.
type minLevelHandler struct {
	slog.Handler
	min slog.Level
}

// Enabled reports whether the level is at least min and enabled below.
func (h *minLevelHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return level >= h.min && h.Handler.Enabled(ctx, level)
}

// WithAttrs keeps the minimum on the derived handler.
func (h *minLevelHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &minLevelHandler{Handler: h.Handler.WithAttrs(attrs), min: h.min}
}

// WithGroup keeps the minimum on the derived handler.
func (h *minLevelHandler) WithGroup(name string) slog.Handler {
	return &minLevelHandler{Handler: h.Handler.WithGroup(name), min: h.min}
}
