package app

import (
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

// initLiveness builds the worker's heartbeat, which records the queues it
// serves and reports the dispatcher's ticks, and its reaper.
func (w *Worker) initLiveness() error {
	return w.live.Init(w.livePool, liveness.InitConfig{
		WorkPool:     w.pool,
		Limiter:      w.jobs.Limiter,
		Registry:     w.jobs.Registry,
		Registerer:   w.registry,
		PollInterval: w.dispatcher.PollInterval(),
		LastTick:     w.dispatcher.LastTick,
		Queues:       servedQueues(w.cfg.Queues, w.cfg.MaintenanceWorkers),
	})
}

// Dispatcher is the worker's schedule dispatcher.
func (w *Worker) Dispatcher() *scheduler.Dispatcher { return w.dispatcher }
