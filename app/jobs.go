package app

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/sluice-dev/sluice/kinds"
	"github.com/sluice-dev/sluice/limiter"
	"github.com/sluice-dev/sluice/maintenance"
	"github.com/sluice-dev/sluice/metrics"
	"github.com/sluice-dev/sluice/module"
	"github.com/sluice-dev/sluice/settings"
	"github.com/sluice-dev/sluice/tracing"
)

// JobsConfig configures NewJobs.
type JobsConfig struct {
	// Program is the application's workers and the modules.
	Program Program
	// Logger receives every log line.
	Logger *slog.Logger
	// Registerer takes every metric (nil: a private registry).
	Registerer prometheus.Registerer
	// WorkerID is the process's id (River's client ID).
	WorkerID string
	// JobTimeout is River's client-level job timeout.
	JobTimeout time.Duration
	// MaintenanceTimeout bounds a maintenance run.
	MaintenanceTimeout time.Duration
	// LockCheckInterval is how often a maintenance run checks its lock.
	LockCheckInterval time.Duration
	// ParkAfter is how long a job of a limited kind waits for a slot in its
	// worker before it parks.
	ParkAfter time.Duration
	// IgnoreLimits and NeverPark are the Limiter's (sluice run).
	IgnoreLimits, NeverPark bool
	// LimiterGrants configures the Limiter's grant watch (zero: its
	// defaults).
	LimiterGrants limiter.GrantWatchConfig
}

// Jobs is everything a River client of a sluice program works with: the
// kinds, the workers (the application's, the core's and the modules'), the
// middleware, and the services they share.
type Jobs struct {
	// Registry is every kind the program works.
	Registry *kinds.Registry
	// Workers is the bundle of every worker: a copy of the application's,
	// with the core's and the modules' added.
	Workers *river.Workers
	// Limiter enforces the concurrency limits (the outermost middleware).
	Limiter *limiter.Limiter
	// Maintenance runs maintenance runs.
	Maintenance *maintenance.Runner
	// Metrics are the job metrics.
	Metrics *metrics.Metrics
	// Env is what the modules' workers were built with.
	Env *module.Env
	// ClusterSources are the modules' cluster-wide gauges.
	ClusterSources []metrics.ClusterSource
	// Tracing makes the spans of inserts, work, dispatcher ticks and
	// maintenance runs (Program.TracerProvider).
	Tracing *tracing.Tracing

	resume *limiter.ResumeWorker
}

// NewJobs assembles the jobs of cfg.Program on pool.
func NewJobs(pool *pgxpool.Pool, cfg JobsConfig) (*Jobs, error) {
	registry, err := cfg.Program.Registry()
	if err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	reg := cfg.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	jobMetrics, err := metrics.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	limitMetrics, err := limiter.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	for _, k := range registry.Kinds() {
		jobMetrics.Init(k.Name, k.DefaultQueue())
		limitMetrics.Init(k.Name)
	}
	lim, err := limiter.New(limiter.Config{
		Pool: pool, Logger: logger, Metrics: limitMetrics, WorkerID: cfg.WorkerID,
		IgnoreLimits: cfg.IgnoreLimits, NeverPark: cfg.NeverPark, ParkAfter: cfg.ParkAfter, Grants: cfg.LimiterGrants,
	})
	if err != nil {
		return nil, err
	}
	maintMetrics, err := maintenance.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	for _, k := range registry.Kinds() {
		if k.DefaultQueue() == maintenance.Queue {
			maintMetrics.Init(k.Name)
		}
	}
	tr := tracing.New(cfg.Program.TracerProvider)
	runner, err := maintenance.NewRunner(maintenance.Config{
		Pool: pool, Logger: logger, Metrics: maintMetrics, WorkerID: cfg.WorkerID, Tracer: tr.Tracer(),
		LockCheckInterval: cfg.LockCheckInterval, Timeout: cfg.MaintenanceTimeout,
	})
	if err != nil {
		return nil, err
	}
	workers, err := kinds.CloneWorkers(cfg.Program.Workers)
	if err != nil {
		return nil, err
	}
	j := &Jobs{
		Registry:    registry,
		Workers:     workers,
		Limiter:     lim,
		Maintenance: runner,
		Metrics:     jobMetrics,
		Tracing:     tr,
		Env: &module.Env{
			Pool: pool, Logger: logger, Registerer: reg, Settings: settings.New(pool),
			Maintenance: runner, Registry: registry, WorkerID: cfg.WorkerID, JobTimeout: cfg.JobTimeout,
		},
		resume: limiter.NewResumeWorker(lim, registry),
	}
	if err := river.AddWorkerSafely(workers, j.resume); err != nil {
		return nil, fmt.Errorf("sluice: add the worker of %s: %w", limiter.ResumeKind, err)
	}
	for _, m := range cfg.Program.Modules {
		if m.AddWorkers == nil {
			continue
		}
		if err := m.AddWorkers(workers, j.Env); err != nil {
			return nil, fmt.Errorf("sluice: module %s: add workers: %w", m.Name, err)
		}
		if m.ClusterSources != nil {
			j.ClusterSources = append(j.ClusterSources, m.ClusterSources(j.Env)...)
		}
	}
	if err := j.checkWorkers(); err != nil {
		return nil, err
	}
	return j, nil
}

// checkWorkers verifies that the bundle works exactly the registry's kinds:
// a module that declares a kind it adds no worker for (or the reverse)
// would otherwise accept jobs nobody works.
func (j *Jobs) checkWorkers() error {
	have, err := kinds.FromWorkers(j.Workers)
	if err != nil {
		return err
	}
	worked := map[string]bool{}
	for _, k := range have {
		worked[k.Name] = true
		if !j.Registry.Has(k.Name) {
			return fmt.Errorf("sluice: a module added a worker for kind %q without declaring it in its Kinds", k.Name)
		}
	}
	for _, name := range j.Registry.Names() {
		if !worked[name] {
			return fmt.Errorf("sluice: kind %q is declared but no worker works it", name)
		}
	}
	return nil
}

// Middleware is the worker middleware of every sluice client, outermost
// first: the limiter (a job that parks never runs further), the work span
// (one per job that runs), then the job metrics (which so count real
// executions only).
func (j *Jobs) Middleware() []rivertype.WorkerMiddleware {
	return []rivertype.WorkerMiddleware{j.Limiter, j.Tracing.WorkMiddleware(), metrics.NewMiddleware(j.Metrics)}
}

// InsertMiddleware is the insert middleware of every sluice client: the
// insert span, whose trace context goes into the jobs' metadata.
func (j *Jobs) InsertMiddleware() []rivertype.JobInsertMiddleware {
	return []rivertype.JobInsertMiddleware{j.Tracing.InsertMiddleware()}
}

// SetClient gives the workers that insert jobs (concurrency_limit.resume)
// and the limiter the River client, once it is built.
func (j *Jobs) SetClient(client *Client) {
	j.resume.SetClient(client)
	j.Limiter.SetClient(client)
}
