package sluice

import (
	"io/fs"
	"log/slog"
	"time"

	"github.com/riverqueue/river"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/limiter"
	"github.com/sluice-dev/sluice/module"
)

// Module is a set of job kinds with their workers, migrations, default
// schedules and commands that a program turns on as a whole (see package
// modules for sluice's own).
type Module = module.Module

// Limit is the limits of one job kind a program declares in Go: a per-kind
// concurrency limit, a per-key one over args fields, a rate limit (see
// Config.Limits).
type Limit = limiter.Limit

// Rate is a rate limit: at most Max starts of a kind (or of each key) in any
// window of Per.
type Rate = limiter.Rate

// Config configures a sluice program.
type Config struct {
	// Workers are the application's River workers, registered with
	// river.AddWorker. sluice works them with its middleware (concurrency
	// limits, metrics) and knows their kinds everywhere: enqueue, run and
	// schedule decode args strictly into each kind's args type and call its
	// Validate() error where it has one. sluice never changes the bundle: it
	// works a copy with its own workers added.
	Workers *river.Workers

	// Migrations are the application's goose migrations (such as an
	// embed.FS of SQL files), applied by `migrate up` after sluice's own and
	// tracked in a version table of their own.
	Migrations fs.FS

	// Modules are the modules to turn on. sluice's core (scheduler, limits
	// and parking, liveness, the maintenance framework, metrics and health)
	// is always on.
	Modules []Module

	// Limits declares limits of the program's kinds: every worker writes
	// them at start (concurrency_limits, source "config"). A limit set by
	// the CLI or SQL wins over the declared one until `sluice limits
	// clear`, which falls back to it: an operator's change at runtime must
	// outlive the next deploy. A kind the program no longer declares loses
	// its declared limits at the next start.
	Limits []Limit

	// River, if set, is your River configuration: sluice calls it on the
	// river.Config it built for a worker, before the client is created (in
	// New, and in Main's worker and run). Whatever it sets is used as River
	// documents it: ErrorHandler, Middleware, Hooks, JobInsertMiddleware,
	// RetryPolicy, MaxAttempts, the retention periods, PeriodicJobs (run as
	// River runs them: on the leader, in memory), FetchCooldown,
	// FetchPollInterval, JobTimeout, Plugins. The fields sluice sets are
	// checked after the call: a change to Workers, Queues, ID, Schema,
	// Logger, RescueStuckJobsAfter, LeaderElectionDisabled or TestOnly is
	// refused before anything runs (New returns the error, Main exits 1),
	// naming the field and the sluice setting to use. sluice's own worker
	// middleware stays outermost: your Middleware and WorkerMiddleware run
	// inside the limiter, so a job that parks never reaches them and a job
	// that runs passes through them once (README, "Your River config").
	River func(*river.Config)

	// Schema is the Postgres schema of sluice's tables, views, functions
	// and migration versions (default "sluice"). Main's --schema and
	// $SLUICE_SCHEMA override it.
	Schema string
	// RiverSchema is where River's tables live (River's own Config.Schema);
	// empty: where the connection's search_path puts them, usually public.
	// Main's --river-schema and $SLUICE_RIVER_SCHEMA override it.
	RiverSchema string

	// The settings below are New's and Migrate's; Main reads its own from
	// the command line and the environment.

	// DatabaseURL is the pgx connection string (URL or key=value).
	DatabaseURL string
	// Logger receives every log line (nil: none).
	Logger *slog.Logger
	// ID names the worker: River's client ID. Empty: host-pid-random.
	ID string
	// HTTPAddr, if set, is where the worker serves its HTTP endpoints; an
	// application that has its own server mounts Worker.Handler instead.
	// An address off loopback (anything but localhost, 127.0.0.0/8 and ::1;
	// ":8089" and "0.0.0.0:8089" included) needs HTTPToken: New refuses it
	// without one.
	HTTPAddr string
	// HTTPToken, when set, guards the worker's HTTP endpoints, on its own
	// server and on Worker.Handler alike, wherever they listen: every
	// request but /healthz and /readyz needs "Authorization: Bearer TOKEN"
	// or the token as a basic-auth password (any user name), else 401. At
	// least 16 characters; never logged.
	HTTPToken string
	// HTTPPrefix is the path Worker.Handler is mounted under in the
	// application's server, such as "/jobs" for
	// mux.Handle("/jobs/", http.StripPrefix("/jobs", w.Handler())): River UI
	// builds its URLs from it (sluice's pages link relatively). The worker's
	// own server (HTTPAddr) serves under it too. Empty: the root.
	HTTPPrefix string
	// DefaultWorkers is how many jobs of the default queue run at once
	// (default 50) when Queues is empty; MaintenanceWorkers those of the
	// maintenance queue (default 4), always served.
	DefaultWorkers, MaintenanceWorkers int
	// Queues are the queues the worker serves besides maintenance, each with
	// how many of its jobs run at once, such as {"default": 20, "emails": 5}
	// (Main's --queues default=20,emails=5). Empty: the default queue with
	// DefaultWorkers; set one or the other. Names follow River's rule for
	// queue names; each count is between 1 and 10000.
	Queues map[string]int
	// JobTimeout is River's job timeout for kinds without their own
	// (default 1 minute).
	JobTimeout time.Duration
	// ShutdownTimeout is how long Stop lets running jobs finish before it
	// cancels them (default 30 seconds).
	ShutdownTimeout time.Duration
	// HeartbeatInterval is how often the worker refreshes its row in
	// sluice_workers (default 5 seconds); DeadAfter how long after its last
	// heartbeat it counts as dead (default 30 seconds).
	HeartbeatInterval, DeadAfter time.Duration
	// ParkAfter is how long a job of a limited kind waits in the worker for
	// a slot before it parks (default 1 second).
	ParkAfter time.Duration
	// SchedulePollInterval is the longest the schedule dispatcher sleeps
	// between ticks (default 1 second).
	SchedulePollInterval time.Duration
}

func (c Config) program() app.Program {
	return app.Program{Workers: c.Workers, Migrations: c.Migrations, Modules: c.Modules, Limits: c.Limits,
		Schemas: db.Schemas{Sluice: c.Schema, River: c.RiverSchema}, River: c.River}
}

func (c Config) appConfig() app.Config {
	return app.Config{
		Program:              c.program(),
		DatabaseURL:          c.DatabaseURL,
		Logger:               c.Logger,
		ID:                   c.ID,
		HTTPAddr:             c.HTTPAddr,
		HTTPToken:            c.HTTPToken,
		HTTPPrefix:           c.HTTPPrefix,
		DefaultWorkers:       c.DefaultWorkers,
		Queues:               c.Queues,
		MaintenanceWorkers:   c.MaintenanceWorkers,
		JobTimeout:           c.JobTimeout,
		ShutdownTimeout:      c.ShutdownTimeout,
		HeartbeatInterval:    c.HeartbeatInterval,
		DeadAfter:            c.DeadAfter,
		ParkAfter:            c.ParkAfter,
		SchedulePollInterval: c.SchedulePollInterval,
	}
}
