package liveness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/kinds"
	"github.com/sluice-dev/sluice/limiter"
)

// Service is a worker's liveness: its identity towards the other workers,
// its heartbeat row and its reaper of dead workers.
//
// Its life: New, ConfigurePool on the configuration of the worker's pool,
// Init once the pool is open, Register before the worker takes a job, Start
// (heartbeat and reaper), and at the end StopReaper, Stop and, on a clean
// stop, Remove.
type Service struct {
	live      *liveness
	logger    *slog.Logger
	pool      *pgxpool.Pool
	workPool  *pgxpool.Pool
	heartbeat *heartbeat
	reaper    *reaper

	stopMu                    sync.Mutex
	stopReaper, stopHeartbeat func()
}

// New returns the liveness of the worker cfg describes.
func New(cfg Config) *Service {
	live := newLiveness(cfg)
	return &Service{live: live, logger: live.logger}
}

// ConfigurePool sets up the configuration of the worker's pool: its
// connections carry the worker's identity (the fence refuses them once the
// worker is reaped) and, unless the configuration names them, the
// application_name WorkerAppName(id).
func (s *Service) ConfigurePool(config *pgxpool.Config) { s.live.configurePool(config) }

// InitConfig is what Init needs besides the pool.
type InitConfig struct {
	// WorkPool is the worker's main pool, set up by ConfigurePool too: a
	// take-over of the worker's own id drops its connections, which the
	// reap of the predecessor (same application_name) may have terminated.
	WorkPool *pgxpool.Pool
	// Limiter releases the concurrency slots of reaped workers.
	Limiter *limiter.Limiter
	// Registry is the program's kinds: a rescued job of an unknown kind is
	// discarded, as River's rescuer does.
	Registry *kinds.Registry
	// Registerer takes the reaper's metrics (nil: none).
	Registerer prometheus.Registerer
	// PollInterval is the worker's dispatcher poll interval, recorded in
	// its row (0: it runs no dispatcher).
	PollInterval time.Duration
	// LastTick reports the end of the dispatcher's last tick (nil: none).
	LastTick func() time.Time
	// Queues are the queues the worker serves, each with how many of its
	// jobs it works at once, recorded in its row at registration (nil:
	// none recorded, read as the default and maintenance queues).
	Queues map[string]int
}

// Init builds the heartbeat and reaper on pool, which ConfigurePool set up:
// a small pool of their own, which jobs cannot starve.
func (s *Service) Init(pool *pgxpool.Pool, cfg InitConfig) error {
	metrics, err := newReaperMetrics(cfg.Registerer)
	if err != nil {
		return err
	}
	if cfg.Registry != nil {
		for _, name := range cfg.Registry.Names() {
			metrics.init(name)
		}
	}
	s.pool = pool
	s.workPool = cfg.WorkPool
	s.heartbeat = newHeartbeat(db.New(pool), s.live, s.live.interval, cfg.PollInterval, cfg.LastTick, s.logger)
	if cfg.Queues != nil {
		if s.heartbeat.queues, err = json.Marshal(cfg.Queues); err != nil {
			return fmt.Errorf("encode the worker's queues: %w", err)
		}
	}
	s.heartbeat.beatAt = metrics.heartbeat
	s.reaper = &reaper{
		pool:     pool,
		limiter:  cfg.Limiter,
		registry: cfg.Registry,
		live:     s.live,
		logger:   s.logger,
		metrics:  metrics,
	}
	return nil
}

// ID is the worker's id.
func (s *Service) ID() string { return s.live.id }

// DeadAfter is how long after its last heartbeat the worker counts as dead.
func (s *Service) DeadAfter() time.Duration { return s.live.deadAfter }

// Reaped is closed when the worker finds itself reaped.
func (s *Service) Reaped() <-chan struct{} { return s.live.Reaped() }

// IsReaped reports whether the worker found itself reaped.
func (s *Service) IsReaped() bool { return s.live.isReaped() }

// Register inserts the worker's sluice_workers row before the worker takes
// any job. If a row with its id exists (the id was given with --id and is
// reused), it waits: a row that is reaped meanwhile, or that turns dead,
// is taken over — once this process has been in touch with the database
// for the row's dead-after, it reaps it itself (rescuing its jobs) and
// registers; a row that keeps heartbeating belongs to a live process, and
// registering fails.
func (s *Service) Register(ctx context.Context) error {
	q := db.New(s.pool)
	interval := s.live.interval
	var (
		seen                *db.GetWorkerLivenessRow
		streakStart, lastOK time.Time
		warned, slowWarned  bool
	)
	for {
		ok, err := s.heartbeat.register(ctx)
		if err != nil && errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			// The statement took longer than a heartbeat may (a loaded
			// database): try again, as a heartbeat would.
			if !slowWarned {
				slowWarned = true
				s.logger.Warn("worker registration slow; trying again", "worker_id", s.live.id, "error", err)
			}
			continue
		}
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		row, err := q.GetWorkerLiveness(ctx, s.live.id)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // reaped meanwhile
		}
		if err != nil {
			return fmt.Errorf("register worker: read the row of id %q: %w", s.live.id, err)
		}
		if row.Incarnation == s.live.incarnation {
			// A registration that timed out had committed: the row is ours.
			s.heartbeat.registered(time.Now())
			return nil
		}
		now := time.Now()
		if streakStart.IsZero() || now.Sub(lastOK) > 2*interval {
			streakStart = now
		}
		lastOK = now
		if seen == nil {
			seen = row
		} else if row.Incarnation != seen.Incarnation || row.HeartbeatAt.After(seen.HeartbeatAt) {
			return fmt.Errorf("worker id %q is in use by a live worker (host %s, pid %d): give each worker its own --id",
				s.live.id, row.Host, row.Pid)
		}
		deadAfter := time.Duration(row.DeadAfter.Microseconds) * time.Microsecond
		if row.Dead && now.Sub(streakStart) >= deadAfter {
			if err := s.takeOver(ctx, row); err != nil {
				return err
			}
			continue
		}
		if !warned {
			warned = true
			s.logger.Warn("worker id in use by a worker that stopped heartbeating; waiting for it to count as dead, then taking over its jobs",
				"worker_id", s.live.id, "previous_host", row.Host, "previous_pid", row.Pid,
				"heartbeat_age", fmt.Sprintf("%.1fs", row.HeartbeatAgeSeconds), "dead_after", deadAfter.String())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("register worker: %w", context.Cause(ctx))
		case <-time.After(interval):
		}
	}
}

// takeOver reaps the dead row of this worker's own id (a predecessor's) and
// drops every pooled connection, some of which the reap may have terminated
// (they carry the same application_name).
func (s *Service) takeOver(ctx context.Context, row *db.GetWorkerLivenessRow) error {
	d := deadWorker{ID: row.ID, Incarnation: row.Incarnation, Host: row.Host, Pid: row.Pid,
		BackendName: row.BackendName, HeartbeatAge: time.Duration(row.HeartbeatAgeSeconds * float64(time.Second))}
	logger := s.logger.With("dead_worker_id", d.ID, "dead_worker_host", d.Host, "dead_worker_pid", d.Pid)
	var res *reapResult
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		res, err = s.reaper.reapTx(ctx, tx, d, true)
		return err
	})
	s.pool.Reset()
	if s.workPool != nil {
		s.workPool.Reset()
	}
	switch {
	case errors.Is(err, errReaperBusy):
		return nil // another reaper is at it: try again
	case err != nil:
		return fmt.Errorf("register worker: take over id %q: %w", d.ID, err)
	case res != nil:
		s.reaper.record(logger, d, res)
	}
	return nil
}

// Start starts the heartbeat and the reaper in the background, until
// StopReaper and Stop; the cancellation of ctx does not stop them (a
// stopping worker keeps heartbeating while its jobs finish).
func (s *Service) Start(ctx context.Context) {
	background := context.WithoutCancel(ctx)
	hbCtx, cancelHB := context.WithCancel(background)
	hbDone := make(chan struct{})
	go func() {
		defer close(hbDone)
		s.heartbeat.run(hbCtx)
	}()
	reapCtx, cancelReap := context.WithCancel(background)
	reapDone := make(chan struct{})
	go func() {
		defer close(reapDone)
		s.reaper.run(reapCtx)
	}()
	s.stopMu.Lock()
	s.stopReaper = func() { cancelReap(); <-reapDone }
	s.stopHeartbeat = func() { cancelHB(); <-hbDone }
	s.stopMu.Unlock()
}

// StopReaper stops the reaper and waits for it; the heartbeat goes on (a
// stopping worker keeps its row alive while its jobs finish).
func (s *Service) StopReaper() {
	s.stopMu.Lock()
	stop := s.stopReaper
	s.stopReaper = nil
	s.stopMu.Unlock()
	if stop != nil {
		stop()
	}
}

// Stop stops the reaper and the heartbeat and waits for them.
func (s *Service) Stop() {
	s.StopReaper()
	s.stopMu.Lock()
	stop := s.stopHeartbeat
	s.stopHeartbeat = nil
	s.stopMu.Unlock()
	if stop != nil {
		stop()
	}
}

// Remove deletes the worker's row on a clean shutdown; a failure is logged
// (the row goes stale and is reaped).
func (s *Service) Remove() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.heartbeat.remove(ctx); err != nil {
		s.logger.Warn("worker row not removed; it goes stale", "error", err)
	}
}
