package main

import (
	"log/slog"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/jobs"
	"github.com/sluice-dev/sluice/scheduler"
)

func newWorkerCmd(g *globals) *cobra.Command {
	var cfg app.Config
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Run a worker: River client, schedule dispatcher, HTTP server",
		Long: `worker works jobs from the default and maintenance queues, runs the schedule
dispatcher (it inserts the jobs of due schedules) and serves HTTP:
  /healthz  the process is alive
  /readyz   the database answers
  /metrics  Prometheus metrics
  /stats    the stats document (as sluice stats --json)
  /health   workers, dispatchers and schedules (as 'sluice health --json';
            503 when CRITICAL)

The worker keeps a row in sluice_workers (its id, host, pid, heartbeat and
last dispatcher tick), refreshed every --heartbeat-interval and deleted on a
clean stop.

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
			if cfg.ScheduleBatchSize < 1 {
				return usagef("--schedule-batch-size must be at least 1")
			}
			if cfg.SchedulePollInterval <= 0 || cfg.HeartbeatInterval <= 0 {
				return usagef("--schedule-poll-interval and --heartbeat-interval must be positive")
			}
			if err := cfg.Validate(); err != nil {
				return asUsage(err)
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
	f.StringVar(&cfg.HTTPAddr, "http-addr", app.DefaultHTTPAddr, "HTTP listen address; empty disables the server")
	f.StringVar(&cfg.ID, "id", "", "worker id (River client ID); default host-pid-random")
	f.IntVar(&cfg.DefaultWorkers, "default-workers", app.DefaultDefaultWorkers, "jobs worked at once from the default queue")
	f.IntVar(&cfg.MaintenanceWorkers, "maintenance-workers", app.DefaultMaintenanceWorkers, "jobs worked at once from the maintenance queue")
	f.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", app.DefaultShutdownTimeout, "on SIGINT/SIGTERM, how long running jobs may finish before they are cancelled")
	f.DurationVar(&cfg.JobTimeout, "job-timeout", time.Minute, "River's job timeout for kinds without their own")
	f.DurationVar(&cfg.MaintenanceTimeout, "maintenance-timeout", 30*time.Minute, "bound of one maintenance run (the lock's lease)")
	f.DurationVar(&cfg.FetchCooldown, "fetch-cooldown", app.DefaultFetchCooldown, "least time between two fetches of a queue (River's FetchCooldown)")
	f.DurationVar(&cfg.FetchPollInterval, "fetch-poll-interval", app.DefaultFetchPollInterval, "poll a queue this often when no insert notification arrives")
	f.DurationVar(&cfg.RescueStuckJobsAfter, "rescue-stuck-jobs-after", app.DefaultRescueStuckJobsAfter, "River's rescuer retries a job running longer than this (its worker presumed dead)")
	f.DurationVar(&cfg.SchedulePollInterval, "schedule-poll-interval", scheduler.DefaultPollInterval, "longest the schedule dispatcher sleeps between ticks (it also wakes for the next due time and on NOTIFY)")
	f.IntVar(&cfg.ScheduleBatchSize, "schedule-batch-size", scheduler.DefaultBatchSize, "due schedules one dispatcher transaction claims")
	f.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", app.DefaultHeartbeatInterval, "how often the worker refreshes its sluice_workers row")
	bindEnv(f, "http-addr", "SLUICE_HTTP_ADDR")
	bindEnv(f, "fetch-cooldown", "SLUICE_FETCH_COOLDOWN")
	bindEnv(f, "fetch-poll-interval", "SLUICE_FETCH_POLL_INTERVAL")
	bindEnv(f, "rescue-stuck-jobs-after", "SLUICE_RESCUE_STUCK_JOBS_AFTER")
	bindEnv(f, "id", "SLUICE_WORKER_ID")
	bindEnv(f, "default-workers", "SLUICE_DEFAULT_WORKERS")
	bindEnv(f, "maintenance-workers", "SLUICE_MAINTENANCE_WORKERS")
	bindEnv(f, "shutdown-timeout", "SLUICE_SHUTDOWN_TIMEOUT")
	bindEnv(f, "job-timeout", "SLUICE_JOB_TIMEOUT")
	bindEnv(f, "maintenance-timeout", "SLUICE_MAINTENANCE_TIMEOUT")
	f.StringVar(&cfg.ExportDir, "export-dir", jobs.DefaultExportDir, "directory export.project writes project export archives to")
	bindEnv(f, "export-dir", "SLUICE_EXPORT_DIR")
	bindEnv(f, "schedule-poll-interval", "SLUICE_SCHEDULE_POLL_INTERVAL")
	bindEnv(f, "schedule-batch-size", "SLUICE_SCHEDULE_BATCH_SIZE")
	bindEnv(f, "heartbeat-interval", "SLUICE_HEARTBEAT_INTERVAL")
	return cmd
}
