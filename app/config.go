package app

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/riverqueue/river"

	"github.com/sluice-dev/sluice/limiter"
	"github.com/sluice-dev/sluice/liveness"
	"github.com/sluice-dev/sluice/maintenance"
	"github.com/sluice-dev/sluice/metrics"
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

// Config configures a worker process.
type Config struct {
	// Program is the application's workers and migrations, and the modules
	// turned on.
	Program Program
	// DatabaseURL is the pgx connection string.
	DatabaseURL string
	// HTTPAddr is the listen address of the HTTP server; empty disables it.
	// Off loopback (web.IsLoopback) it needs HTTPToken.
	HTTPAddr string
	// HTTPToken, when set, guards the HTTP handler (the worker's own server
	// and Handler) but /healthz and /readyz: a request needs it as a bearer
	// token or a basic-auth password (web.RequireToken), on loopback too.
	// At least web.MinTokenLength characters; never logged.
	HTTPToken string
	// HTTPPrefix is the path the handler is served under, such as "/jobs"
	// (empty: the root). The worker's own server serves it there, and an
	// application that mounts Handler in its own server mounts it there with
	// http.StripPrefix: River UI builds its URLs from it.
	HTTPPrefix string
	// Pprof serves Go's runtime profiles (net/http/pprof) at /debug/pprof/
	// on the HTTP handler, behind the token like everything but /healthz
	// and /readyz. Off by default.
	Pprof bool
	// ID names the process: River's client ID (river_job.attempted_by) and
	// maintenance_runs.worker_id. Empty generates host-pid-random.
	ID string
	// DefaultWorkers is the size of the default queue when Queues is empty
	// (DefaultDefaultWorkers when 0).
	DefaultWorkers int
	// Queues are the queues the worker serves besides maintenance, each
	// with how many of its jobs run at once (`--queues default=20,emails=5`);
	// empty: the default queue with DefaultWorkers. Setting both Queues and
	// DefaultWorkers is an error: give the default queue's size in Queues.
	Queues map[string]int
	// MaintenanceWorkers is the size of the maintenance queue.
	MaintenanceWorkers int
	// ShutdownTimeout is how long a stop waits for running jobs before
	// cancelling them.
	ShutdownTimeout time.Duration
	// HardStopGrace is how long cancelled jobs get to return on stop.
	HardStopGrace time.Duration
	// FetchCooldown is the least time between two fetches of a queue
	// (River's FetchCooldown).
	FetchCooldown time.Duration
	// FetchPollInterval is how often a queue is polled when no insert
	// notification arrives (River's FetchPollInterval).
	FetchPollInterval time.Duration
	// RescueStuckJobsAfter is when River's rescuer considers a running job
	// stuck (its worker presumed dead).
	RescueStuckJobsAfter time.Duration
	// JobTimeout is River's client-level job timeout.
	JobTimeout time.Duration
	// ParkAfter is how long a job of a limited kind waits in the worker for
	// a slot before it parks (limiter.DefaultParkAfter when 0).
	ParkAfter time.Duration
	// MaintenanceTimeout bounds a maintenance run.
	MaintenanceTimeout time.Duration
	// Logger receives every log line.
	Logger *slog.Logger
	// SchedulePollInterval is the longest the schedule dispatcher sleeps
	// between ticks (it also wakes for the next due time and on NOTIFY).
	SchedulePollInterval time.Duration
	// ScheduleBatchSize is how many due schedules one dispatcher
	// transaction claims.
	ScheduleBatchSize int
	// HeartbeatInterval is how often the worker refreshes its
	// sluice_workers row.
	HeartbeatInterval time.Duration
	// DeadAfter is how long after its last heartbeat the worker counts as
	// dead to the other workers' reapers; at least MinDeadAfterBeats
	// heartbeat intervals.
	DeadAfter time.Duration
	// MetricsInterval is how often the worker, while it exports them (as
	// River's leader), reads the cluster-wide gauges from the database
	// (metrics.DefaultClusterInterval when 0).
	MetricsInterval time.Duration
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
		out.Logger = slog.New(slog.DiscardHandler)
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
