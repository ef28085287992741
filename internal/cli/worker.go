package cli

import (
	"cmp"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/limiter"
	"github.com/sluice-dev/sluice/maintenance"
	"github.com/sluice-dev/sluice/metrics"
	"github.com/sluice-dev/sluice/scheduler"
)

func newWorkerCmd(g *globals) *cobra.Command {
	// The program's Config gives the flags their defaults (flag >
	// environment > Config > built-in default).
	base := g.base
	cfg := base
	var queues string
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Run a worker: River client, schedule dispatcher, HTTP server",
		Long: `worker works jobs from its queues and the maintenance queue, runs the
schedule dispatcher (it inserts the jobs of due schedules) and serves HTTP:
  /healthz   the process is alive
  /readyz    the database answers
  /metrics   Prometheus metrics
  /stats     the stats document (as sluice stats --json)
  /health    workers, dispatchers, schedules and queues (as 'sluice health
             --json'; 503 when CRITICAL)
  /riverui/  River UI: River's jobs and queues (list, cancel, retry, ...)
  /ui/       sluice's pages (/ leads there): schedules, concurrency limits
             and parked jobs, workers, maintenance runs, cancellation monitor

--http-addr is loopback by default (127.0.0.1:8089). Any other address
(":8089", "0.0.0.0:8089", a host name) needs a token in $SLUICE_HTTP_TOKEN
(at least 16 characters; environment only, so that it stays out of process
listings), else the worker refuses to start (exit 2). With a token set
(on loopback too), every path but /healthz and /readyz needs it, as
"Authorization: Bearer TOKEN" or as the basic-auth password (any user):
else 401, and a browser asks for it.

The worker keeps a row in sluice_workers (its id, host, pid, heartbeat and
last dispatcher tick), refreshed every --heartbeat-interval and deleted on a
clean stop. A worker whose heartbeat is older than its --dead-after is dead:
the reaper of a live worker (one at a time, every heartbeat interval)
makes its running jobs retryable ("worker <id> lost"; discarded when out
of attempts, cancelled when their cancellation was requested), frees their
concurrency slots, resumes parked jobs into them, marks its maintenance runs
failed, resigns its River leadership if it led, and deletes its row. A
reaper acts only after its own worker has heartbeated without a gap for the
dead worker's dead-after, so a database outage does not make workers reap
each other. A worker that finds itself reaped (it was paused or cut off for
longer than --dead-after) cancels its jobs, writes nothing more (its
sessions are fenced in the database) and exits with code 3, for its
supervisor to start a new one. A worker started with an --id that a live
worker uses exits 1; with the --id of a dead worker, it waits until that
worker counts as dead, reaps it and takes the id over.

Queues: --queues default=20,emails=5 (or $SLUICE_QUEUES) serves those
queues, each with its own number of jobs at once (1 to 10000; names by
River's rule, each once); without it the worker serves the default queue
with --default-workers jobs at once. Give one or the other: both is a usage
error. The maintenance queue (--maintenance-workers) is always served. The
worker records its queues in its sluice_workers row ('sluice queues list'
shows who serves what, and 'sluice health' warns about available jobs in a
queue no live worker serves).

Tracing: with an OTLP endpoint in $OTEL_EXPORTER_OTLP_ENDPOINT (or
OTEL_TRACES_EXPORTER=otlp) the worker exports OpenTelemetry spans of its
inserts, jobs, waits and parkings, dispatcher ticks and maintenance runs
(protocol $OTEL_EXPORTER_OTLP_PROTOCOL: http/protobuf or grpc; service
$OTEL_SERVICE_NAME). Off by default; a value that makes no sense is exit 2;
an endpoint that does not answer drops spans and logs a warning.

A program built on the sluice library gives these flags its own defaults
in Go (sluice.Config): a flag wins over its variable, which wins over the
program's Config, which wins over the default shown.

Any number of workers, on any number of machines, may run against one
database. SIGINT or SIGTERM stops a worker gracefully: it stops dispatching
and fetching, lets running jobs finish for up to --shutdown-timeout, then
cancels them and exits 0.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := g.logger(slog.LevelInfo)
			if err != nil {
				return err
			}
			if err := g.requireDatabaseURL(); err != nil {
				return err
			}
			if cfg.DefaultWorkers < 1 || cfg.MaintenanceWorkers < 1 {
				return usagef("--default-workers and --maintenance-workers must be at least 1")
			}
			// A flag wins over its environment variable, and over the other
			// setting's: --queues over $SLUICE_DEFAULT_WORKERS,
			// --default-workers over $SLUICE_QUEUES. Both flags, or both
			// variables, conflict.
			queuesFlag, dwFlag := cmd.Flags().Changed("queues"), cmd.Flags().Changed("default-workers")
			queuesEnv, dwEnv := !queuesFlag && os.Getenv("SLUICE_QUEUES") != "", !dwFlag && os.Getenv("SLUICE_DEFAULT_WORKERS") != ""
			useQueues := queuesFlag || (queuesEnv && !dwFlag)
			switch {
			case useQueues:
				if (queuesFlag && dwFlag) || (queuesEnv && dwEnv) {
					return usagef("--queues (or $SLUICE_QUEUES) and --default-workers (or $SLUICE_DEFAULT_WORKERS) are both set: give the default queue's size in --queues, such as default=%d", cfg.DefaultWorkers)
				}
				if cfg.Queues, err = app.ParseQueues(queues); err != nil {
					return usagef("invalid --queues (or $SLUICE_QUEUES) %q: %v", queues, err)
				}
				cfg.DefaultWorkers = 0
			case dwFlag || dwEnv || len(base.Queues) == 0:
				cfg.Queues = nil
			default: // the Config's queues
				cfg.DefaultWorkers = 0
			}
			if cfg.ScheduleBatchSize < 1 {
				return usagef("--schedule-batch-size must be at least 1")
			}
			if cfg.SchedulePollInterval <= 0 || cfg.HeartbeatInterval <= 0 {
				return usagef("--schedule-poll-interval and --heartbeat-interval must be positive")
			}
			if cmd.Flags().Changed("dead-after") || os.Getenv("SLUICE_DEAD_AFTER") != "" {
				if least := app.MinDeadAfterBeats * cfg.HeartbeatInterval; cfg.DeadAfter < least {
					return usagef("--dead-after (%s) must be at least %d heartbeat intervals (%s)", cfg.DeadAfter, app.MinDeadAfterBeats, least)
				}
			} else {
				cfg.DeadAfter = base.DeadAfter // unset: 30s, or 3 heartbeat intervals if that is longer
			}
			cfg.HTTPToken = cmp.Or(os.Getenv("SLUICE_HTTP_TOKEN"), base.HTTPToken)
			if err := cfg.Validate(); err != nil {
				return asUsage(err)
			}
			cfg = cfg.WithProgram(g.prog)
			if cfg.TracerProvider, err = g.tracerProvider(cmd.Context(), logger); err != nil {
				return err
			}
			cfg.DatabaseURL = g.databaseURL
			cfg.Logger = logger
			w, err := app.NewWorker(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			return w.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.HTTPAddr, "http-addr", cmp.Or(base.HTTPAddr, app.DefaultHTTPAddr), "HTTP listen address; empty disables the server; off loopback it needs $SLUICE_HTTP_TOKEN")
	f.StringVar(&cfg.ID, "id", base.ID, "worker id (River client ID); default host-pid-random")
	f.IntVar(&cfg.DefaultWorkers, "default-workers", cmp.Or(base.DefaultWorkers, app.DefaultDefaultWorkers), "jobs worked at once from the default queue, without --queues")
	f.StringVar(&queues, "queues", "", "queues to serve with their jobs at once, such as default=20,emails=5 (default: the program's Config.Queues, else default=--default-workers); the maintenance queue is always served")
	f.IntVar(&cfg.MaintenanceWorkers, "maintenance-workers", cmp.Or(base.MaintenanceWorkers, app.DefaultMaintenanceWorkers), "jobs worked at once from the maintenance queue")
	f.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", cmp.Or(base.ShutdownTimeout, app.DefaultShutdownTimeout), "on SIGINT/SIGTERM, how long running jobs may finish before they are cancelled")
	f.DurationVar(&cfg.JobTimeout, "job-timeout", cmp.Or(base.JobTimeout, app.DefaultJobTimeout), "River's job timeout for kinds without their own")
	f.DurationVar(&cfg.MaintenanceTimeout, "maintenance-timeout", cmp.Or(base.MaintenanceTimeout, maintenance.DefaultTimeout), "bound of one maintenance run (the lock's lease)")
	f.DurationVar(&cfg.ParkAfter, "park-after", cmp.Or(base.ParkAfter, limiter.DefaultParkAfter), "how long a job of a limited kind waits in the worker for a slot before it parks, unless its line there would start it within another park-after (1ms to 1h)")
	f.DurationVar(&cfg.FetchCooldown, "fetch-cooldown", cmp.Or(base.FetchCooldown, app.DefaultFetchCooldown), "least time between two fetches of a queue (River's FetchCooldown)")
	f.DurationVar(&cfg.FetchPollInterval, "fetch-poll-interval", cmp.Or(base.FetchPollInterval, app.DefaultFetchPollInterval), "poll a queue this often when no insert notification arrives")
	f.DurationVar(&cfg.RescueStuckJobsAfter, "rescue-stuck-jobs-after", cmp.Or(base.RescueStuckJobsAfter, app.DefaultRescueStuckJobsAfter), "River's rescuer retries a job running longer than this (its worker presumed dead)")
	f.DurationVar(&cfg.SchedulePollInterval, "schedule-poll-interval", cmp.Or(base.SchedulePollInterval, scheduler.DefaultPollInterval), "longest the schedule dispatcher sleeps between ticks (it also wakes for the next due time and on NOTIFY)")
	f.IntVar(&cfg.ScheduleBatchSize, "schedule-batch-size", cmp.Or(base.ScheduleBatchSize, scheduler.DefaultBatchSize), "due schedules one dispatcher transaction claims")
	f.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", cmp.Or(base.HeartbeatInterval, app.DefaultHeartbeatInterval), "how often the worker refreshes its sluice_workers row")
	f.DurationVar(&cfg.DeadAfter, "dead-after", cmp.Or(base.DeadAfter, app.DefaultDeadAfter), "a worker whose heartbeat is older than this is dead and its jobs are rescued; at least 3 heartbeat intervals (unset: 30s, or 3 intervals if longer)")
	bindEnv(f, "http-addr", "SLUICE_HTTP_ADDR")
	bindEnv(f, "fetch-cooldown", "SLUICE_FETCH_COOLDOWN")
	bindEnv(f, "park-after", "SLUICE_PARK_AFTER")
	bindEnv(f, "fetch-poll-interval", "SLUICE_FETCH_POLL_INTERVAL")
	bindEnv(f, "rescue-stuck-jobs-after", "SLUICE_RESCUE_STUCK_JOBS_AFTER")
	bindEnv(f, "id", "SLUICE_WORKER_ID")
	bindEnv(f, "default-workers", "SLUICE_DEFAULT_WORKERS")
	bindEnv(f, "queues", "SLUICE_QUEUES")
	bindEnv(f, "maintenance-workers", "SLUICE_MAINTENANCE_WORKERS")
	bindEnv(f, "shutdown-timeout", "SLUICE_SHUTDOWN_TIMEOUT")
	bindEnv(f, "job-timeout", "SLUICE_JOB_TIMEOUT")
	bindEnv(f, "maintenance-timeout", "SLUICE_MAINTENANCE_TIMEOUT")
	g.addModuleFlags(f)
	bindEnv(f, "schedule-poll-interval", "SLUICE_SCHEDULE_POLL_INTERVAL")
	bindEnv(f, "schedule-batch-size", "SLUICE_SCHEDULE_BATCH_SIZE")
	bindEnv(f, "heartbeat-interval", "SLUICE_HEARTBEAT_INTERVAL")
	bindEnv(f, "dead-after", "SLUICE_DEAD_AFTER")
	f.DurationVar(&cfg.MetricsInterval, "metrics-interval", cmp.Or(base.MetricsInterval, metrics.DefaultClusterInterval), "how often the worker exporting the cluster-wide gauges (River's leader) reads them from the database (at least 1s)")
	bindEnv(f, "metrics-interval", "SLUICE_METRICS_INTERVAL")
	f.BoolVar(&cfg.Pprof, "pprof", base.Pprof, "serve Go's runtime profiles (heap, CPU, goroutines) at /debug/pprof/ on the HTTP server, behind its token")
	bindEnv(f, "pprof", "SLUICE_PPROF")
	return cmd
}
