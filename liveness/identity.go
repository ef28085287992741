// Package liveness is how sluice workers know each other alive: each keeps a
// heartbeat row in sluice_workers, and a reaper on every worker rescues the
// running jobs, concurrency slots and maintenance runs of a worker whose
// heartbeat is older than its dead-after. A reaped worker is fenced: its
// connections carry its id and incarnation, and the database refuses its
// writes once its row is gone.
package liveness

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/db"
)

// DefaultDeadAfter is how long after its last heartbeat a worker counts as
// dead (its jobs and slots are rescued by the reaper of a live worker).
const DefaultDeadAfter = 30 * time.Second

// MinDeadAfterBeats is how many heartbeat intervals dead-after must span at
// least, so that a worker is never declared dead between two regular beats.
const MinDeadAfterBeats = 3

// The custom settings every connection of a worker carries (pgx
// RuntimeParams), read by the fence trigger sluice_worker_fence.
const (
	settingWorkerID          = "sluice.worker_id"
	settingWorkerIncarnation = "sluice.worker_incarnation"
)

// maxAppNameLen is Postgres's limit on application_name (NAMEDATALEN - 1).
const maxAppNameLen = 63

// ErrReaped ends a worker that finds its sluice_workers row gone: another
// worker declared it dead (its heartbeat was older than dead-after: the
// process was paused, or cut off from the database) and rescued its jobs,
// which may already run elsewhere. It must not work another job under its
// id; the process exits with ExitReaped so that a supervisor starts a new
// one, under a new id.
var ErrReaped = errors.New("this worker was declared dead and reaped: its jobs were rescued and may run elsewhere")

// ExitReaped is the exit code of `sluice worker` after ErrReaped.
const ExitReaped = 3

// WorkerAppName is the application_name of a worker's connections:
// "sluice worker <id>", or, when that is longer than Postgres keeps (63
// bytes), a prefix of the id and a hash of the whole id, so that the name
// still tells workers apart.
func WorkerAppName(id string) string {
	name := "sluice worker " + id
	if len(name) <= maxAppNameLen {
		return name
	}
	sum := sha256.Sum256([]byte(id))
	suffix := "~" + hex.EncodeToString(sum[:4])
	return name[:maxAppNameLen-len(suffix)] + suffix
}

// liveness is a worker's identity towards the other workers: its id and
// incarnation (set on every connection), whether it is registered, whether
// it was reaped, and the record of its recent heartbeats the reaper's rules
// rely on.
type liveness struct {
	id          string
	incarnation string
	// backendName is the application_name of the worker's connections when
	// sluice chose it (unique to the worker); nil when the connection
	// string sets its own, so the reaper terminates nothing by name.
	backendName *string
	interval    time.Duration
	deadAfter   time.Duration
	logger      *slog.Logger

	registered atomic.Bool
	reapedOnce sync.Once
	reaped     chan struct{}

	mu sync.Mutex
	// streakStart is when the current run of successful heartbeats began
	// (zero: the last beat failed); lastBeat is the last successful one.
	streakStart time.Time
	lastBeat    time.Time
}

// Config configures a worker's liveness.
type Config struct {
	// ID is the worker's id (River's client ID).
	ID string
	// HeartbeatInterval is how often the worker refreshes its row (default
	// DefaultHeartbeatInterval).
	HeartbeatInterval time.Duration
	// DeadAfter is how long after its last heartbeat the worker counts as
	// dead (default DefaultDeadAfter, or MinDeadAfterBeats intervals if
	// longer).
	DeadAfter time.Duration
	// Logger receives the log lines.
	Logger *slog.Logger
}

// DefaultHeartbeatInterval is how often a worker refreshes its
// sluice_workers row.
const DefaultHeartbeatInterval = 5 * time.Second

func newLiveness(cfg Config) *liveness {
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if cfg.DeadAfter <= 0 {
		cfg.DeadAfter = max(DefaultDeadAfter, MinDeadAfterBeats*cfg.HeartbeatInterval)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &liveness{
		id:          cfg.ID,
		incarnation: hex.EncodeToString(b[:]),
		interval:    cfg.HeartbeatInterval,
		deadAfter:   cfg.DeadAfter,
		logger:      cfg.Logger,
		reaped:      make(chan struct{}),
	}
}

// configurePool sets up a pool configuration for the worker: its
// connections are named WorkerAppName(id) (unless the configuration names
// them), carry the worker's id and incarnation as custom settings, and, once
// the worker is registered, are refused when its row is gone.
func (l *liveness) configurePool(config *pgxpool.Config) {
	params := config.ConnConfig.RuntimeParams
	if _, ok := params["application_name"]; !ok {
		name := WorkerAppName(l.id)
		params["application_name"] = name
		l.backendName = &name
	}
	params[settingWorkerID] = l.id
	params[settingWorkerIncarnation] = l.incarnation
	next := config.AfterConnect
	config.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		if next != nil {
			if err := next(ctx, conn); err != nil {
				return err
			}
		}
		return l.afterConnect(ctx, conn)
	}
}

// afterConnect refuses a new connection of a registered worker whose row is
// gone: a reaped worker does nothing more under its id, not even on a
// connection it opens after the reaper terminated its old ones. The check
// waits for a reap in progress (the row is locked).
func (l *liveness) afterConnect(ctx context.Context, conn *pgx.Conn) error {
	if !l.registered.Load() {
		return nil
	}
	rows, err := db.New(conn).WorkerRegistered(ctx, db.WorkerRegisteredParams{ID: l.id, Incarnation: l.incarnation})
	if err != nil {
		return fmt.Errorf("check worker registration: %w", err)
	}
	if len(rows) == 0 {
		l.markReaped("a new connection found the worker's row gone")
		return ErrReaped
	}
	return nil
}

// markReaped records that the worker's row is gone and wakes Reaped.
func (l *liveness) markReaped(how string) {
	l.reapedOnce.Do(func() {
		l.logger.Error("worker reaped: another worker declared it dead; exiting without touching its jobs",
			"worker_id", l.id, "detected_by", how, "exit_code", ExitReaped)
		close(l.reaped)
	})
}

// Reaped is closed when the worker finds itself reaped.
func (l *liveness) Reaped() <-chan struct{} { return l.reaped }

// isReaped reports whether the worker found itself reaped.
func (l *liveness) isReaped() bool {
	select {
	case <-l.reaped:
		return true
	default:
		return false
	}
}

// beatSucceeded records a successful heartbeat at now. A beat later than
// two intervals after the previous one (the process was paused, or the beat
// loop stalled) starts a new streak.
func (l *liveness) beatSucceeded(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.streakStart.IsZero() || now.Sub(l.lastBeat) > 2*l.interval {
		l.streakStart = now
	}
	l.lastBeat = now
}

// beatFailed records a failed heartbeat: the streak is over.
func (l *liveness) beatFailed() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.streakStart = time.Time{}
}

// streak is how long the worker has been heartbeating successfully without
// a gap, as of now; 0 when its last beat failed or is more than two
// intervals old.
func (l *liveness) streak(now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.streakStart.IsZero() || now.Sub(l.lastBeat) > 2*l.interval {
		return 0
	}
	return now.Sub(l.streakStart)
}
