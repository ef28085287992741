package maintenance

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the Prometheus collectors of maintenance runs.
type Metrics struct {
	// Runs counts maintenance runs per kind and status.
	Runs *prometheus.CounterVec
	// Affected counts rows changed by maintenance runs per kind.
	Affected *prometheus.CounterVec
}

// NewMetrics creates the maintenance metrics and registers them with reg
// (nil: a private registry).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := &Metrics{
		Runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_maintenance_runs_total",
			Help: "Maintenance runs, per kind and status (succeeded, skipped_locked, failed).",
		}, []string{"kind", "status"}),
		Affected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_maintenance_affected_total",
			Help: "Rows changed by maintenance runs, per kind.",
		}, []string{"kind"}),
	}
	for _, c := range []prometheus.Collector{m.Runs, m.Affected} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register maintenance metrics: %w", err)
		}
	}
	return m, nil
}

// Init creates a maintenance kind's series at 0 (every run status), so that
// rate() and increase() see its first run.
func (m *Metrics) Init(kind string) {
	for _, status := range []string{RunSucceeded, RunSkippedLocked, RunFailed} {
		m.Runs.WithLabelValues(kind, status)
	}
	m.Affected.WithLabelValues(kind)
}
