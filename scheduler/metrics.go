package scheduler

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the Prometheus collectors of the dispatcher.
type Metrics struct {
	// Dispatched counts jobs inserted. No per-schedule label: per-schedule
	// detail is in the sluice.schedule_status view.
	Dispatched prometheus.Counter
	// Failures counts failed dispatches.
	Failures prometheus.Counter
	// Skipped counts due times not run because of the misfire policy.
	Skipped prometheus.Counter
	// Lag observes insert time - due time of every inserted job.
	Lag prometheus.Histogram
	// TickDuration observes how long a dispatcher tick took.
	TickDuration prometheus.Histogram
}

// NewMetrics creates the dispatcher metrics and registers them with reg
// (nil: a private registry).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := &Metrics{
		Dispatched: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_schedule_dispatched_total",
			Help: "Jobs inserted by this process's schedule dispatcher (per schedule: the sluice.schedule_status view).",
		}),
		Failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_schedule_dispatch_failures_total",
			Help: "Failed schedule dispatches (invalid row or failed insert) by this process.",
		}),
		Skipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_schedule_runs_skipped_total",
			Help: "Due times this process did not run because of the schedule's misfire policy.",
		}),
		Lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_schedule_dispatch_lag_seconds",
			Help:    "Time from a run's due time to the commit of its job's insert.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 3600},
		}),
		TickDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_schedule_tick_duration_seconds",
			Help:    "Duration of a dispatcher tick (idle check, and dispatch of every due row).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
	}
	for _, c := range []prometheus.Collector{m.Dispatched, m.Failures, m.Skipped, m.Lag, m.TickDuration} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register scheduler metrics: %w", err)
		}
	}
	return m, nil
}
