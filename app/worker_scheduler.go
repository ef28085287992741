package app

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/jobs"
	"github.com/sluice-dev/sluice/scheduler"
)

// initScheduler builds the worker's schedule dispatcher (its metrics on the
// worker's registry) and heartbeat.
func (w *Worker) initScheduler() error {
	metrics, err := scheduler.NewMetrics(w.registry)
	if err != nil {
		return err
	}
	w.dispatcher, err = scheduler.New(scheduler.Config{
		Pool:         w.pool,
		Client:       w.client,
		Registry:     jobs.NewRegistry(),
		Logger:       w.cfg.Logger,
		Metrics:      metrics,
		PollInterval: w.cfg.SchedulePollInterval,
		BatchSize:    w.cfg.ScheduleBatchSize,
	})
	if err != nil {
		return err
	}
	w.heartbeat = newHeartbeat(db.New(w.pool), w.cfg.ID, w.cfg.HeartbeatInterval,
		w.dispatcher.PollInterval(), w.dispatcher.LastTick, w.cfg.Logger)
	return nil
}

// startScheduler registers the worker's sluice_workers row and starts the
// heartbeat and the dispatcher. stopDispatcher ends the dispatcher (it
// finishes its batch in flight) and waits for it; stopHeartbeat ends the
// heartbeat, which keeps beating while running jobs finish. The row stays
// until removeHeartbeat.
func (w *Worker) startScheduler(ctx context.Context) (stopDispatcher, stopHeartbeat func(), err error) {
	if err := w.heartbeat.beat(ctx); err != nil {
		return nil, nil, fmt.Errorf("register worker: %w", err)
	}
	background := context.WithoutCancel(ctx)
	hbCtx, cancelHB := context.WithCancel(background)
	hbDone := make(chan struct{})
	go func() {
		defer close(hbDone)
		w.heartbeat.run(hbCtx)
	}()
	dispCtx, cancelDisp := context.WithCancel(background)
	dispDone := make(chan struct{})
	go func() {
		defer close(dispDone)
		if err := w.dispatcher.Run(dispCtx); err != nil {
			w.cfg.Logger.Error("schedule dispatcher stopped", "error", err)
		}
	}()
	return func() { cancelDisp(); <-dispDone }, func() { cancelHB(); <-hbDone }, nil
}

// removeHeartbeat deletes the worker's row on a clean shutdown.
func (w *Worker) removeHeartbeat() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := w.heartbeat.remove(ctx); err != nil {
		w.cfg.Logger.Warn("worker row not removed; it goes stale", "error", err)
	}
}

// Dispatcher is the worker's schedule dispatcher.
func (w *Worker) Dispatcher() *scheduler.Dispatcher { return w.dispatcher }
