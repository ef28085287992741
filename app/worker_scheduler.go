package app

import (
	"context"
	"log/slog"

	"github.com/sluice-dev/sluice/liveness"
	"github.com/sluice-dev/sluice/policy"
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
		Tracer:       w.jobs.Tracing.Tracer(),
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

// syncDeclarations writes the limits, the enqueue policies and the
// schedules the program declares (each in a transaction of its own), and
// logs what changed in the policies and schedules: added, updated to a new
// declaration, kept as an operator changed them, removed as no longer
// declared.
func (w *Worker) syncDeclarations(ctx context.Context) error {
	if err := w.jobs.Limiter.SyncDeclared(ctx, w.cfg.Limits, w.jobs.Registry.Names()); err != nil {
		return err
	}
	pol, err := policy.NewStore(w.pool).SyncDeclared(ctx, w.cfg.Policies, w.cfg.ID)
	if err != nil {
		return err
	}
	if len(pol.Written)+len(pol.Removed) > 0 {
		w.cfg.Logger.Info("declared enqueue policies written", slog.Any("written", pol.Written), slog.Any("removed", pol.Removed))
	}
	for _, kind := range pol.Kept {
		w.cfg.Logger.Info("enqueue policy kept as an operator changed it; `policy reset` restores the declared one",
			slog.String("kind", kind))
	}
	res, err := scheduler.NewStore(w.pool, w.jobs.Registry).SyncDeclared(ctx, w.schedules, w.cfg.ID)
	if err != nil {
		return err
	}
	if len(res.Added)+len(res.Updated)+len(res.Removed) > 0 {
		w.cfg.Logger.Info("declared schedules written", slog.Any("added", res.Added),
			slog.Any("updated", res.Updated), slog.Any("removed", res.Removed))
	}
	for _, name := range res.Kept {
		w.cfg.Logger.Info("declared schedule kept as an operator changed it; `schedule reset` restores the declared one",
			slog.String("schedule", name))
	}
	return nil
}
