package app

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/jobs"
)

// initLiveness builds the worker's reaper (its metrics on the worker's
// registry); the heartbeat is built by initScheduler.
func (w *Worker) initLiveness() error {
	metrics, err := newReaperMetrics(w.registry)
	if err != nil {
		return err
	}
	w.reaper = &reaper{
		pool:     w.pool,
		limiter:  w.deps.Limiter,
		registry: jobs.NewRegistry(),
		live:     w.live,
		logger:   w.cfg.Logger,
		metrics:  metrics,
	}
	return nil
}

// register inserts the worker's sluice_workers row before the worker takes
// any job. If a row with its id exists (the id was given with --id and is
// reused), it waits: a row that is reaped meanwhile, or that turns dead,
// is taken over — once this process has been in touch with the database
// for the row's dead-after, it reaps it itself (rescuing its jobs) and
// registers; a row that keeps heartbeating belongs to a live process, and
// registering fails.
func (w *Worker) register(ctx context.Context) error {
	q := db.New(w.pool)
	interval := w.live.interval
	var (
		seen                *db.GetWorkerLivenessRow
		streakStart, lastOK time.Time
		warned              bool
	)
	for {
		ok, err := w.heartbeat.register(ctx)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		row, err := q.GetWorkerLiveness(ctx, w.live.id)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // reaped meanwhile
		}
		if err != nil {
			return fmt.Errorf("register worker: read the row of id %q: %w", w.live.id, err)
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
				w.live.id, row.Host, row.Pid)
		}
		deadAfter := time.Duration(row.DeadAfter.Microseconds) * time.Microsecond
		if row.Dead && now.Sub(streakStart) >= deadAfter {
			if err := w.takeOver(ctx, row); err != nil {
				return err
			}
			continue
		}
		if !warned {
			warned = true
			w.cfg.Logger.Warn("worker id in use by a worker that stopped heartbeating; waiting for it to count as dead, then taking over its jobs",
				"worker_id", w.live.id, "previous_host", row.Host, "previous_pid", row.Pid,
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
func (w *Worker) takeOver(ctx context.Context, row *db.GetWorkerLivenessRow) error {
	d := deadWorker{ID: row.ID, Incarnation: row.Incarnation, Host: row.Host, Pid: row.Pid,
		BackendName: row.BackendName, HeartbeatAge: time.Duration(row.HeartbeatAgeSeconds * float64(time.Second))}
	logger := w.cfg.Logger.With("dead_worker_id", d.ID, "dead_worker_host", d.Host, "dead_worker_pid", d.Pid)
	var res *reapResult
	err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		var err error
		res, err = w.reaper.reapTx(ctx, tx, d, true)
		return err
	})
	w.pool.Reset()
	switch {
	case errors.Is(err, errReaperBusy):
		return nil // another reaper is at it: try again
	case err != nil:
		return fmt.Errorf("register worker: take over id %q: %w", d.ID, err)
	case res != nil:
		w.reaper.record(logger, d, res)
	}
	return nil
}

// startLiveness starts the heartbeat and the reaper; the returned functions
// stop them and wait for them.
func (w *Worker) startLiveness(ctx context.Context) (stopReaper, stopHeartbeat func()) {
	background := context.WithoutCancel(ctx)
	hbCtx, cancelHB := context.WithCancel(background)
	hbDone := make(chan struct{})
	go func() {
		defer close(hbDone)
		w.heartbeat.run(hbCtx)
	}()
	reapCtx, cancelReap := context.WithCancel(background)
	reapDone := make(chan struct{})
	go func() {
		defer close(reapDone)
		w.reaper.run(reapCtx)
	}()
	return func() { cancelReap(); <-reapDone }, func() { cancelHB(); <-hbDone }
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
