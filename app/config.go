package app

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/riverqueue/river"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/limiter"
	"github.com/sluice-dev/sluice/liveness"
	"github.com/sluice-dev/sluice/maintenance"
	"github.com/sluice-dev/sluice/metrics"
	"github.com/sluice-dev/sluice/module"
	"github.com/sluice-dev/sluice/policy"
	"github.com/sluice-dev/sluice/scheduler"
	"github.com/sluice-dev/sluice/web"
)

// Defaults of Config.
const (
	DefaultHTTPAddr           = "127.0.0.1:8089"
	DefaultDefaultWorkers     = 50
	DefaultMaintenanceWorkers = 4
	DefaultShutdownTimeout    = 30 * time.Second
	// DefaultFetchCooldown is lower than River's 100ms so that a parked job
	// resumed into a freed slot starts promptly; a fetch per 20ms per queue
	// is still a trivial load.
	DefaultFetchCooldown        = 5 * time.Millisecond
	DefaultFetchPollInterval    = time.Second
	DefaultRescueStuckJobsAfter = time.Hour
	// DefaultHardStopGrace is how long a stopping worker waits, after
	// cancelling the jobs still running at the shutdown timeout, for them
	// to return. Jobs that ignore cancellation longer than this are left
	// behind (River rescues them later) and the process exits anyway.
	DefaultHardStopGrace = 5 * time.Second
	// DefaultHeartbeatInterval is how often a worker refreshes its
	// sluice_workers row.
	DefaultHeartbeatInterval = liveness.DefaultHeartbeatInterval
	// PoolOverhead is how many connections a worker's pool has beyond one
	// per job it may run at once, unless the connection string sets
	// pool_max_conns: River's fetches and completions, the dispatcher,
	// maintenance locks, the limiter's batches.
	PoolOverhead = 10
	// LivenessPoolSize is the size of the pool the heartbeat and the
	// reaper have to themselves.
	LivenessPoolSize = 2
	// DefaultJobTimeout is River's own default job timeout.
	DefaultJobTimeout = time.Minute
	// DefaultDeadAfter is how long after its last heartbeat a worker counts
	// as dead.
	DefaultDeadAfter = liveness.DefaultDeadAfter
	// MinDeadAfterBeats is how many heartbeat intervals dead-after spans at
	// least.
	MinDeadAfterBeats = liveness.MinDeadAfterBeats
)

// Config configures a sluice program: what it is made of (its River
// workers, migrations, modules, declared limits and schedules, River
// config and tracer provider) and how its workers run. sluice.Config is
// this type. New and Migrate use every field; Main takes them as the
// defaults of its flags and environment variables (flag > environment >
// Config > built-in default), and DatabaseURL, Logger and HTTPToken from
// the environment only.
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
	Modules []module.Module
	// Limits declares limits of the program's kinds: every worker writes
	// them at start (concurrency_limits, source "config"). A limit set by
	// the CLI or SQL wins over the declared one until `sluice limits
	// clear`, which falls back to it: an operator's change at runtime must
	// outlive the next deploy. A kind the program no longer declares loses
	// its declared limits at the next start.
	Limits []limiter.Limit
	// Schedules declares durable schedules in Go: every worker writes them
	// into the schedules table at start (source "config"), where the
	// dispatcher runs each exactly once per due time, as any other
	// schedule. An operator's change by the CLI or SQL wins until `sluice
	// schedule reset NAME` goes back to the declared one; a schedule the
	// program no longer declares is removed at the next start, unless an
	// operator changed it. Bad declarations are refused before anything
	// runs, naming the schedule.
	Schedules []scheduler.Declared
	// Policies declares enqueue policies of the program's kinds: every
	// worker writes them at start (enqueue_policies, source "config"). An
	// operator's change by `sluice policy` or SQL (a clear too) wins until
	// `sluice policy reset KIND`; a kind the program no longer declares
	// loses its declared policy at the next start, unless an operator
	// changed it. Bad declarations are refused before anything runs.
	Policies []policy.Policy
	// River, if set, is your River configuration: sluice calls it on the
	// river.Config it built for a worker, before the client is created (in
	// New, and in Main's worker and run), and on the config of the client
	// with which every other command of Main inserts or manages jobs
	// (enqueue, schedule trigger, limits, jobs, queues, the modules'
	// commands; that config has no Workers and no Queues), so that its
	// defaults, insert middleware and hooks apply to every insert of the
	// program. Whatever it sets is used as River documents it:
	// ErrorHandler, Middleware, Hooks, JobInsertMiddleware, RetryPolicy,
	// MaxAttempts, the retention periods, PeriodicJobs (run as River runs
	// them: on the leader, in memory; run's client, which never leads,
	// leaves them out), FetchCooldown, FetchPollInterval, JobTimeout,
	// Plugins. The fields sluice sets are checked after the call: a change
	// to Workers, Queues, ID, Schema, Logger, RescueStuckJobsAfter,
	// LeaderElectionDisabled or TestOnly is refused before anything runs
	// (New returns the error, Main's command exits 1), naming the field and
	// the sluice setting to use. sluice's own worker
	// middleware stays outermost: your Middleware and WorkerMiddleware run
	// inside the limiter, so a job that parks never reaches them and a job
	// that runs passes through them once (README, "Your River config").
	River func(*river.Config)
	// TracerProvider makes sluice's OpenTelemetry spans: the insert, the
	// job's work (a child of the inserter's span, whose W3C trace context
	// travels in the job's metadata), the limiter's park, resume and wait
	// events, dispatcher ticks and maintenance runs (README, "Tracing").
	// Nil: OpenTelemetry's global provider, a no-op unless the program sets
	// one. Main's worker sets one from the standard OTEL_* variables.
	TracerProvider trace.TracerProvider

	// Name is the program's name in its help and messages ("Run 'NAME
	// enqueue --help'") and its OpenTelemetry service name; Main's default
	// is the binary's file name, "sluice" elsewhere.
	Name string

	// Schema is the Postgres schema of sluice's tables, views, functions
	// and migration versions (default "sluice"; --schema, $SLUICE_SCHEMA).
	Schema string
	// RiverSchema is where River's tables live (River's own Config.Schema);
	// empty: where the connection's search_path puts them, usually public
	// (--river-schema, $SLUICE_RIVER_SCHEMA).
	RiverSchema string

	// DatabaseURL is the pgx connection string (URL or key=value); Main
	// reads it from --database-url or $DATABASE_URL.
	DatabaseURL string
	// Logger receives every log line. Nil: slog's default logger, from WARN
	// up, as River logs without a logger of its own (slog.New(
	// slog.DiscardHandler) for none). Main logs to stderr.
	Logger *slog.Logger
	// ID names the worker: River's client ID (river_job.attempted_by) and
	// maintenance_runs.worker_id (--id). Empty: host-pid-random.
	ID string
	// HTTPAddr, if set, is where the worker serves its HTTP endpoints
	// (--http-addr; Main's default DefaultHTTPAddr); an application that
	// has its own server mounts Worker.Handler instead. An address off
	// loopback (anything but localhost, 127.0.0.0/8 and ::1; ":8089" and
	// "0.0.0.0:8089" included) needs HTTPToken: New refuses it without one.
	HTTPAddr string
	// HTTPToken, when set, guards the worker's HTTP endpoints, on its own
	// server and on Worker.Handler alike, wherever they listen: every
	// request but /healthz and /readyz needs "Authorization: Bearer TOKEN"
	// or the token as a basic-auth password (any user name), else 401. At
	// least web.MinTokenLength (16) characters; never logged. Main reads
	// it from $SLUICE_HTTP_TOKEN only, so it stays out of process listings.
	HTTPToken string
	// HTTPPrefix is the path Worker.Handler is mounted under in the
	// application's server, such as "/jobs" for
	// mux.Handle("/jobs/", http.StripPrefix("/jobs", w.Handler())): River UI
	// builds its URLs from it (sluice's pages link relatively). The worker's
	// own server (HTTPAddr) serves under it too. Empty: the root.
	HTTPPrefix string
	// Pprof serves Go's runtime profiles (net/http/pprof) at /debug/pprof/
	// on the HTTP handler, behind the token like everything but /healthz
	// and /readyz (--pprof). Off by default.
	Pprof bool
	// DefaultWorkers is how many jobs of the default queue run at once
	// when Queues is empty (--default-workers; default
	// DefaultDefaultWorkers). Setting both Queues and DefaultWorkers is an
	// error: give the default queue's size in Queues.
	DefaultWorkers int
	// Queues are the queues the worker serves besides maintenance, each with
	// how many of its jobs run at once, such as {"default": 20, "emails": 5}
	// (--queues default=20,emails=5). Empty: the default queue with
	// DefaultWorkers. Names follow River's rule for queue names; each count
	// is between 1 and MaxQueueWorkers.
	Queues map[string]int
	// MaintenanceWorkers is how many jobs of the maintenance queue, always
	// served, run at once (--maintenance-workers; default 4).
	MaintenanceWorkers int
	// JobTimeout is River's job timeout for kinds without their own
	// (--job-timeout; default 1 minute).
	JobTimeout time.Duration
	// ShutdownTimeout is how long a stop lets running jobs finish before it
	// cancels them (--shutdown-timeout; default 30 seconds).
	ShutdownTimeout time.Duration
	// HardStopGrace is how long cancelled jobs get to return on stop
	// (default DefaultHardStopGrace).
	HardStopGrace time.Duration
	// FetchCooldown is the least time between two fetches of a queue
	// (River's FetchCooldown; --fetch-cooldown, default
	// DefaultFetchCooldown). A Config.River that sets River's own wins.
	FetchCooldown time.Duration
	// FetchPollInterval is how often a queue is polled when no insert
	// notification arrives (River's FetchPollInterval;
	// --fetch-poll-interval, default 1 second). A Config.River that sets
	// River's own wins.
	FetchPollInterval time.Duration
	// RescueStuckJobsAfter is when River's rescuer considers a running job
	// stuck (--rescue-stuck-jobs-after; default 1 hour).
	RescueStuckJobsAfter time.Duration
	// ParkAfter is how long a job of a limited kind waits in the worker for
	// a slot before it parks (--park-after; default 1 second). A job resumed
	// ahead of a free slot waits as long as it takes (its place is the
	// line's); one whose line moves in the worker fast enough to start it
	// within another ParkAfter waits on.
	ParkAfter time.Duration
	// MaintenanceTimeout bounds a maintenance run (--maintenance-timeout;
	// default 30 minutes).
	MaintenanceTimeout time.Duration
	// SchedulePollInterval is the longest the schedule dispatcher sleeps
	// between ticks (--schedule-poll-interval; default 1 second); it also
	// wakes for the next due time and on NOTIFY.
	SchedulePollInterval time.Duration
	// ScheduleBatchSize is how many due schedules one dispatcher
	// transaction claims (--schedule-batch-size; default
	// scheduler.DefaultBatchSize, 2000).
	ScheduleBatchSize int
	// HeartbeatInterval is how often the worker refreshes its
	// sluice_workers row (--heartbeat-interval; default 5 seconds).
	HeartbeatInterval time.Duration
	// DeadAfter is how long after its last heartbeat a worker counts as
	// dead to the other workers' reapers (--dead-after; default 30
	// seconds); at least MinDeadAfterBeats heartbeat intervals.
	DeadAfter time.Duration
	// MetricsInterval is how often the worker, while it exports them (as
	// River's leader), reads the cluster-wide gauges from the database
	// (--metrics-interval; default metrics.DefaultClusterInterval).
	MetricsInterval time.Duration
}

// Program is what c's program is made of besides its settings.
func (c Config) Program() Program {
	return Program{Workers: c.Workers, Migrations: c.Migrations, Modules: c.Modules, Limits: c.Limits,
		Schedules: c.Schedules, Policies: c.Policies, River: c.River, TracerProvider: c.TracerProvider,
		Schemas: pgkit.Schemas{Sluice: c.Schema, River: c.RiverSchema}}
}

// WithProgram returns c made of p: p's workers, migrations, modules,
// declarations, River config, tracer provider and schemas, c's settings.
func (c Config) WithProgram(p Program) Config {
	c.Workers, c.Migrations, c.Modules, c.Limits = p.Workers, p.Migrations, p.Modules, p.Limits
	c.Schedules, c.Policies, c.River, c.TracerProvider = p.Schedules, p.Policies, p.River, p.TracerProvider
	c.Schema, c.RiverSchema = p.Schemas.Sluice, p.Schemas.River
	return c
}

func (c *Config) withDefaults() Config {
	out := *c
	if len(out.Queues) == 0 {
		out.Queues = map[string]int{river.QueueDefault: cmp.Or(out.DefaultWorkers, DefaultDefaultWorkers)}
	} else {
		out.Queues = maps.Clone(out.Queues)
	}
	if out.MaintenanceWorkers == 0 {
		out.MaintenanceWorkers = DefaultMaintenanceWorkers
	}
	if out.ShutdownTimeout == 0 {
		out.ShutdownTimeout = DefaultShutdownTimeout
	}
	if out.FetchCooldown == 0 {
		out.FetchCooldown = DefaultFetchCooldown
	}
	if out.FetchPollInterval == 0 {
		out.FetchPollInterval = DefaultFetchPollInterval
	}
	if out.RescueStuckJobsAfter == 0 {
		out.RescueStuckJobsAfter = DefaultRescueStuckJobsAfter
	}
	if out.HardStopGrace == 0 {
		out.HardStopGrace = DefaultHardStopGrace
	}
	if out.JobTimeout == 0 {
		out.JobTimeout = DefaultJobTimeout
	}
	if out.ParkAfter == 0 {
		out.ParkAfter = limiter.DefaultParkAfter
	}
	if out.MaintenanceTimeout == 0 {
		out.MaintenanceTimeout = maintenance.DefaultTimeout
	}
	if out.ID == "" {
		out.ID = NewID()
	}
	if out.SchedulePollInterval == 0 {
		out.SchedulePollInterval = scheduler.DefaultPollInterval
	}
	if out.ScheduleBatchSize == 0 {
		out.ScheduleBatchSize = scheduler.DefaultBatchSize
	}
	if out.HeartbeatInterval == 0 {
		out.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if out.DeadAfter == 0 {
		out.DeadAfter = max(DefaultDeadAfter, MinDeadAfterBeats*out.HeartbeatInterval)
	}
	if out.MetricsInterval == 0 {
		out.MetricsInterval = metrics.DefaultClusterInterval
	}
	if out.Logger == nil {
		out.Logger = slog.New(&minLevelHandler{Handler: slog.Default().Handler(), min: slog.LevelWarn})
	}
	return out
}

// Validate reports the first out-of-range setting.
func (c *Config) Validate() error {
	if c.HTTPAddr != "" {
		if err := validateListenAddr(c.HTTPAddr); err != nil {
			return fmt.Errorf("invalid HTTP address %q (SLUICE_HTTP_ADDR): %w", c.HTTPAddr, err)
		}
	}
	if err := web.CheckExposure(c.HTTPAddr, c.HTTPToken); err != nil {
		return err
	}
	if err := web.ValidatePrefix(c.HTTPPrefix); err != nil {
		return err
	}
	if len(c.Queues) > 0 {
		if c.DefaultWorkers != 0 {
			return fmt.Errorf("queues (--queues) and default queue workers (--default-workers) are both set: give the default queue's size in the queues, such as default=%d", c.DefaultWorkers)
		}
		if err := ValidateQueues(c.Queues); err != nil {
			return fmt.Errorf("invalid queues: %w", err)
		}
	}
	switch {
	case c.DefaultWorkers < 0 || c.DefaultWorkers > MaxQueueWorkers:
		return fmt.Errorf("default queue workers must be between 1 and %d, got %d", MaxQueueWorkers, c.DefaultWorkers)
	case c.MaintenanceWorkers < 0 || c.MaintenanceWorkers > 1000:
		return fmt.Errorf("maintenance queue workers must be between 1 and 1000, got %d", c.MaintenanceWorkers)
	case c.ShutdownTimeout < 0:
		return fmt.Errorf("shutdown timeout must not be negative, got %s", c.ShutdownTimeout)
	case c.JobTimeout < 0:
		return fmt.Errorf("job timeout must not be negative, got %s", c.JobTimeout)
	case c.ParkAfter < 0 || (c.ParkAfter > 0 && c.ParkAfter < time.Millisecond) || c.ParkAfter > time.Hour:
		return fmt.Errorf("park-after must be between 1ms and 1h, got %s", c.ParkAfter)
	case c.MaintenanceTimeout < 0:
		return fmt.Errorf("maintenance timeout must not be negative, got %s", c.MaintenanceTimeout)
	case c.FetchCooldown < 0 || (c.FetchCooldown > 0 && c.FetchCooldown < time.Millisecond):
		return fmt.Errorf("fetch cooldown must be at least 1ms, got %s", c.FetchCooldown)
	case c.FetchPollInterval < 0 || (c.FetchPollInterval > 0 && c.FetchPollInterval < c.FetchCooldown):
		return fmt.Errorf("fetch poll interval must be at least the fetch cooldown, got %s", c.FetchPollInterval)
	case c.RescueStuckJobsAfter < 0:
		return fmt.Errorf("rescue-stuck-jobs-after must not be negative, got %s", c.RescueStuckJobsAfter)
	case c.RescueStuckJobsAfter > 0 && c.RescueStuckJobsAfter < max(c.JobTimeout, DefaultJobTimeout):
		return fmt.Errorf("rescue-stuck-jobs-after (%s) must be at least the job timeout (%s)", c.RescueStuckJobsAfter, max(c.JobTimeout, DefaultJobTimeout))
	case len(c.ID) > 100:
		return fmt.Errorf("worker id must be at most 100 characters, got %d", len(c.ID))
	case c.SchedulePollInterval < 0 || (c.SchedulePollInterval > 0 && c.SchedulePollInterval < 10*time.Millisecond):
		return fmt.Errorf("schedule poll interval must be at least 10ms, got %s", c.SchedulePollInterval)
	case c.ScheduleBatchSize < 0 || c.ScheduleBatchSize > scheduler.MaxBatchSize:
		return fmt.Errorf("schedule batch size must be between 1 and %d, got %d", scheduler.MaxBatchSize, c.ScheduleBatchSize)
	case c.HeartbeatInterval < 0 || (c.HeartbeatInterval > 0 && c.HeartbeatInterval < 100*time.Millisecond):
		return fmt.Errorf("heartbeat interval must be at least 100ms, got %s", c.HeartbeatInterval)
	case c.MetricsInterval < 0 || (c.MetricsInterval > 0 && c.MetricsInterval < time.Second):
		return fmt.Errorf("metrics interval must be at least 1s, got %s", c.MetricsInterval)
	case c.DeadAfter < 0:
		return fmt.Errorf("dead-after must be positive, got %s", c.DeadAfter)
	case c.DeadAfter > 0 && c.DeadAfter < MinDeadAfterBeats*cmp.Or(c.HeartbeatInterval, DefaultHeartbeatInterval):
		return fmt.Errorf("dead-after (%s) must be at least %d heartbeat intervals (%s)", c.DeadAfter,
			MinDeadAfterBeats, MinDeadAfterBeats*cmp.Or(c.HeartbeatInterval, DefaultHeartbeatInterval))
	}
	return nil
}

// NewID returns a process id of the form host-pid-random.
func NewID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "host"
	}
	host = strings.ReplaceAll(host, ".", "_")
	if len(host) > 60 {
		host = host[:60]
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// validateListenAddr checks that addr is host:port with a port number.
func validateListenAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return errors.New("want host:port, such as 127.0.0.1:8089")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("port %q is not a number from 0 to 65535", port)
	}
	return nil
}

// ErrReaped ends a worker that found itself declared dead by another
// worker (liveness.ErrReaped).
var ErrReaped = liveness.ErrReaped

// ExitReaped is the exit code of `sluice worker` after ErrReaped.
const ExitReaped = liveness.ExitReaped
