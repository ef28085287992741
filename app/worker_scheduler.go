package app

import (
	"context"

	"github.com/sluice-dev/sluice/liveness"
	"github.com/sluice-dev/sluice/scheduler"
)

// initScheduler builds the worker's schedule dispatcher (its metrics on the
// worker's registry).
func (w *Worker) initScheduler() error {
	metrics, err := scheduler.NewMetrics(w.registry)
	if err != nil {
		return err
	}
	w.dispatcher, err = scheduler.New(scheduler.Config{
		Pool:         w.pool,
		Client:       w.client,
		Registry:     w.jobs.Registry,
		Logger:       w.cfg.Logger,
		Metrics:      metrics,
		PollInterval: w.cfg.SchedulePollInterval,
		BatchSize:    w.cfg.ScheduleBatchSize,
	})
	return err
}

// initLiveness builds the worker's heartbeat, which reports the
// dispatcher's ticks, and its reaper.
func (w *Worker) initLiveness() error {
	return w.live.Init(w.pool, liveness.InitConfig{
		Limiter:      w.jobs.Limiter,
		Registry:     w.jobs.Registry,
		Registerer:   w.registry,
		PollInterval: w.dispatcher.PollInterval(),
		LastTick:     w.dispatcher.LastTick,
	})
}

// startScheduler starts the dispatcher. stopDispatcher ends it (it finishes
// its batch in flight) and waits for it. The worker's row and heartbeat are
// started before (liveness.Service.Start).
func (w *Worker) startScheduler(ctx context.Context) (stopDispatcher func()) {
	dispCtx, cancelDisp := context.WithCancel(context.WithoutCancel(ctx))
	dispDone := make(chan struct{})
	go func() {
		defer close(dispDone)
		if err := w.dispatcher.Run(dispCtx); err != nil {
			w.cfg.Logger.Error("schedule dispatcher stopped", "error", err)
		}
	}()
	return func() { cancelDisp(); <-dispDone }
}

// Dispatcher is the worker's schedule dispatcher.
func (w *Worker) Dispatcher() *scheduler.Dispatcher { return w.dispatcher }
