package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/liveness"
	"github.com/sluice-dev/sluice/metrics"
	"github.com/sluice-dev/sluice/migrations"
	"github.com/sluice-dev/sluice/scheduler"
	"github.com/sluice-dev/sluice/web"
)

// Worker is one `sluice worker` process: River client, HTTP server and the
// pool they share.
type Worker struct {
	cfg  Config
	pool *pgxpool.Pool
	// livePool is the heartbeat's and the reaper's own pool.
	livePool *pgxpool.Pool
	client   *Client
	jobs     *Jobs
	registry *prometheus.Registry
	handler  http.Handler
	riverUI  *web.RiverUI
	listener net.Listener
	server   *http.Server
	// dispatcher is the schedule dispatcher.
	dispatcher *scheduler.Dispatcher
	// cluster exports the cluster-wide gauges while this worker leads.
	cluster *metrics.Cluster
	// live is the worker's heartbeat row and its reaper of dead workers.
	live *liveness.Service
	// schedules are the schedules the program declares, compiled.
	schedules []scheduler.DeclaredRow
}

// NewWorker connects to the database, checks that its schema is migrated,
// and builds the River client and HTTP server. Nothing runs until Run.
func NewWorker(ctx context.Context, cfg Config) (*Worker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	registry, err := cfg.Program().Registry()
	if err != nil {
		return nil, err // before connecting: a broken Config needs no database to be found
	}
	schedules, err := cfg.Program().CheckDeclarations(registry)
	if err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()

	live := liveness.New(liveness.Config{ID: cfg.ID, HeartbeatInterval: cfg.HeartbeatInterval,
		DeadAfter: cfg.DeadAfter, Logger: cfg.Logger})
	config, err := pgkit.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	schemas, err := pgkit.UseSchemas(ctx, config, cfg.DatabaseURL, cfg.Program().Schemas)
	if err != nil {
		return nil, err
	}
	cfg.Schema, cfg.RiverSchema = schemas.Sluice, schemas.River
	live.ConfigurePool(config)
	if !pgkit.PoolSizeSet(cfg.DatabaseURL) {
		// Every job may hold a connection (a transaction of its own): the
		// pool covers the queues' workers plus sluice's own needs. It grows
		// only as jobs use it.
		jobs := cfg.MaintenanceWorkers
		for _, n := range cfg.Queues {
			jobs += n
		}
		config.MaxConns = int32(max(pgkit.DefaultMaxConns, jobs+PoolOverhead))
	}
	// The heartbeat and the reaper work on a tiny pool of their own, so
	// that jobs holding every connection of the main pool cannot make a
	// live worker's heartbeat go stale (and another worker reap it).
	liveConfig := config.Copy()
	liveConfig.MaxConns = LivenessPoolSize
	liveConfig.MinConns = 0
	pool, err := pgkit.OpenConfig(ctx, config, cfg.DatabaseURL, 10*time.Second)
	if err != nil {
		return nil, err
	}
	livePool, err := pgkit.OpenConfig(ctx, liveConfig, cfg.DatabaseURL, 10*time.Second)
	if err != nil {
		pool.Close()
		return nil, err
	}
	w := &Worker{cfg: cfg, pool: pool, livePool: livePool, registry: prometheus.NewRegistry(), live: live, schedules: schedules}
	if err := w.init(ctx); err != nil {
		w.Close()
		return nil, err
	}
	return w, nil
}

func (w *Worker) init(ctx context.Context) error {
	if err := migrations.Check(ctx, w.pool, w.cfg.Program().MigrationOptions(w.cfg.Logger)); err != nil {
		return err
	}
	w.registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	if err := metrics.RegisterBuildInfo(w.registry); err != nil {
		return err
	}
	j, err := NewJobs(w.pool, JobsConfig{
		Program:            w.cfg.Program(),
		Logger:             w.cfg.Logger,
		Registerer:         w.registry,
		WorkerID:           w.cfg.ID,
		JobTimeout:         w.cfg.JobTimeout,
		MaintenanceTimeout: w.cfg.MaintenanceTimeout,
		ParkAfter:          w.cfg.ParkAfter,
	})
	if err != nil {
		return err
	}
	w.jobs = j
	w.cluster, err = metrics.NewCluster(metrics.ClusterConfig{
		Pool: w.pool, Logger: w.cfg.Logger, ClientID: w.cfg.ID, Interval: w.cfg.MetricsInterval, Sources: j.ClusterSources,
	}, w.registry)
	if err != nil {
		return err
	}
	w.client, err = newWorkClient(w.pool, j, w.cfg.Logger, clientOpts{
		fetchCooldown:        w.cfg.FetchCooldown,
		fetchPollInterval:    w.cfg.FetchPollInterval,
		rescueStuckJobsAfter: w.cfg.RescueStuckJobsAfter,
		id:                   w.cfg.ID,
		jobTimeout:           w.cfg.JobTimeout,
		queues:               riverQueues(w.cfg.Queues, w.cfg.MaintenanceWorkers),
		configure:            w.cfg.River,
	})
	if err != nil {
		return err
	}
	if err := w.initScheduler(); err != nil {
		return err
	}
	if err := w.initLiveness(); err != nil {
		return err
	}
	w.handler, w.riverUI, err = newHTTPHandler(httpConfig{
		pool: w.pool, registry: w.registry, modules: w.cfg.Modules, client: w.client,
		token: w.cfg.HTTPToken, prefix: w.cfg.HTTPPrefix, logger: w.cfg.Logger, pprof: w.cfg.Pprof,
	})
	if err != nil {
		return err
	}
	if w.cfg.HTTPAddr != "" {
		w.listener, err = net.Listen("tcp", w.cfg.HTTPAddr)
		if err != nil {
			return fmt.Errorf("listen on %s (SLUICE_HTTP_ADDR): %w", w.cfg.HTTPAddr, err)
		}
		w.server = &http.Server{
			Handler:           mountAt(w.cfg.HTTPPrefix, w.handler),
			ReadHeaderTimeout: 5 * time.Second,
		}
	}
	return nil
}

// ID is the worker's id (River client ID).
func (w *Worker) ID() string { return w.cfg.ID }

// HTTPAddr is the address the HTTP server listens on, or "" if disabled.
func (w *Worker) HTTPAddr() string {
	if w.listener == nil {
		return ""
	}
	return w.listener.Addr().String()
}

// Handler serves the worker's HTTP endpoints (/healthz, /readyz, /metrics,
// /stats, /health), River UI (/riverui/) and sluice's pages (/ui/), behind
// HTTPToken when it is set, for an application that mounts them in its own
// server (under HTTPPrefix).
func (w *Worker) Handler() http.Handler { return w.handler }

// Pool is the worker's database pool.
func (w *Worker) Pool() *pgxpool.Pool { return w.pool }

// Client is the worker's River client.
func (w *Worker) Client() *Client { return w.client }

// Jobs is what the worker's River client works with.
func (w *Worker) Jobs() *Jobs { return w.jobs }

// Close releases the pool, the HTTP listener and the limiter's services of
// a worker that was never run; Run releases them itself.
func (w *Worker) Close() {
	if w.listener != nil {
		_ = w.listener.Close()
	}
	if w.jobs != nil {
		// The River client started the limiter's services (its listener
		// holds a connection of its own): they stop before the pool closes.
		w.jobs.Limiter.Flush()
	}
	w.pool.Close()
	w.livePool.Close()
}

// stopReaped ends a worker that found itself reaped: its jobs were rescued
// and may run elsewhere, so it cancels them at once (their completion is
// fenced anyway) instead of letting them finish, and leaves the database
// alone.
func (w *Worker) stopReaped() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = w.client.StopAndCancel(ctx)
}

// Run works jobs and serves HTTP until ctx is cancelled, then stops
// gracefully: it stops fetching, lets running jobs finish for up to
// ShutdownTimeout, cancels those still running, waits HardStopGrace for them
// and returns. The pool is closed on return. If the worker finds itself
// reaped (declared dead by another worker), it cancels its jobs at once and
// returns ErrReaped.
func (w *Worker) Run(ctx context.Context) error { return w.RunNotify(ctx, nil) }

// RunNotify is Run, calling started (if set) once the worker works jobs.
func (w *Worker) RunNotify(ctx context.Context, started func()) error {
	defer w.pool.Close()
	defer w.livePool.Close()
	logger := w.cfg.Logger

	// The row comes first: every job this worker takes is attempted under
	// a registered id, so a reaper can rescue it.
	if err := w.live.Register(ctx); err != nil {
		if w.listener != nil {
			_ = w.listener.Close()
		}
		return stoppedEarly(ctx, logger, w.cfg.ID, err)
	}
	w.live.Start(ctx)
	// The limits and schedules the program declares, before its first job.
	if err := w.syncDeclarations(ctx); err != nil {
		w.live.Stop()
		w.live.Remove()
		if w.listener != nil {
			_ = w.listener.Close()
		}
		return stoppedEarly(ctx, logger, w.cfg.ID, err)
	}
	// The client runs on a context of its own: cancelling ctx must start a
	// graceful stop, not River's hard stop.
	if err := w.client.Start(context.WithoutCancel(ctx)); err != nil {
		w.live.Stop()
		w.live.Remove()
		if w.listener != nil {
			_ = w.listener.Close()
		}
		return fmt.Errorf("start River client: %w", err)
	}
	_ = w.dispatcher.Start(ctx) // a dispatcher of its own, never started before
	w.cluster.Start(ctx)
	// River UI's background services start at its first request and run
	// until the worker has stopped (it serves while jobs finish).
	uiCtx, stopUI := context.WithCancel(context.WithoutCancel(ctx))
	defer stopUI()
	w.riverUI.Run(uiCtx)
	httpErr := make(chan error, 1)
	if w.server != nil {
		go func() { httpErr <- w.server.Serve(w.listener) }()
	}
	if started != nil {
		started()
	}
	logger.Info("worker started", "worker_id", w.cfg.ID, "database", pgkit.Describe(w.pool.Config()),
		"http_addr", w.HTTPAddr(), "http_token", w.cfg.HTTPToken != "",
		"queues", FormatQueues(servedQueues(w.cfg.Queues, w.cfg.MaintenanceWorkers)))

	var runErr error
	select {
	case <-ctx.Done():
		logger.Info("worker stopping: finishing running jobs", "shutdown_timeout", w.cfg.ShutdownTimeout.String())
	case err := <-httpErr:
		runErr = fmt.Errorf("http server: %w", err)
		logger.Error("worker stopping: http server failed", "error", err)
	case <-w.live.Reaped():
	}

	w.live.StopReaper()
	w.dispatcher.Stop()
	w.cluster.Stop()
	if w.live.IsReaped() {
		w.stopReaped()
		w.live.Stop()
		runErr = ErrReaped
	} else {
		clean := w.stopClient()
		w.live.Stop()
		switch {
		case w.live.IsReaped():
			runErr = ErrReaped
		case clean:
			w.live.Remove()
		default:
			logger.Warn("worker row left in place: jobs still running are rescued by a reaper once it counts as dead",
				"dead_after", w.cfg.DeadAfter.String())
		}
	}
	if w.server != nil {
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := w.server.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Warn("http server shutdown", "error", err)
		}
	}
	logger.Info("worker stopped", "worker_id", w.cfg.ID)
	return runErr
}

// stoppedEarly is the outcome of a start that failed with err: a stop asked
// for (ctx cancelled: SIGINT or SIGTERM while the worker started) is a clean
// stop, as it is once the worker runs; anything else is err.
func stoppedEarly(ctx context.Context, logger *slog.Logger, id string, err error) error {
	if ctx.Err() == nil {
		return err
	}
	logger.Info("worker stopped before it started", "worker_id", id)
	return nil
}

// stopClient stops the River client gracefully; false when jobs that
// ignored cancellation were left running.
func (w *Worker) stopClient() bool {
	logger := w.cfg.Logger
	// Jobs that ended have their concurrency slots released in the
	// background: write those releases before the pool closes.
	defer flushLimiter(w.jobs, logger)
	softCtx, cancel := context.WithTimeout(context.Background(), w.cfg.ShutdownTimeout)
	defer cancel()
	if err := w.client.Stop(softCtx); err == nil {
		return true
	}
	logger.Warn("shutdown timeout reached: cancelling running jobs")
	hardCtx, cancelHard := context.WithTimeout(context.Background(), w.cfg.HardStopGrace)
	defer cancelHard()
	if err := w.client.StopAndCancel(hardCtx); err != nil {
		logger.Error("jobs ignored cancellation: exiting without them; a reaper will rescue them",
			"grace", w.cfg.HardStopGrace.String())
		return false
	}
	return true
}

// flushTimeout bounds the wait for the last concurrency slot releases.
const flushTimeout = 5 * time.Second

// flushLimiter waits (at most flushTimeout) for the concurrency slot
// releases still in flight; releases it gives up on leave stale slot rows
// that concurrency_limit.resume cleans up.
func flushLimiter(j *Jobs, logger *slog.Logger) {
	done := make(chan struct{})
	go func() {
		j.Limiter.Flush()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(flushTimeout):
		logger.Warn("concurrency slot releases still pending at exit; concurrency_limit.resume will free them")
	}
}

// OpenPool opens a pool for a sluice process named appName (shown in
// pg_stat_activity.application_name unless the URL sets one), with the
// schemas on its search_path (pgkit.UseSchemas).
func OpenPool(ctx context.Context, databaseURL, appName string, schemas pgkit.Schemas) (*pgxpool.Pool, error) {
	config, err := pgkit.ParseConfig(databaseURL)
	if err != nil {
		return nil, err
	}
	resolveCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := pgkit.UseSchemas(resolveCtx, config, databaseURL, schemas); err != nil {
		return nil, err
	}
	if _, ok := config.ConnConfig.RuntimeParams["application_name"]; !ok && appName != "" {
		if len(appName) > 63 {
			appName = appName[:63]
		}
		config.ConnConfig.RuntimeParams["application_name"] = appName
	}
	return pgkit.OpenConfig(ctx, config, databaseURL, 10*time.Second)
}
