package exports

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the Prometheus collectors of project exports.
type Metrics struct {
	// Exports counts exports export.project ended, per status (finished,
	// failed).
	Exports *prometheus.CounterVec
	// StuckFailed counts exports export.stuck_jobs marked failed (GitLab's
	// stuck_export_jobs event).
	StuckFailed prometheus.Counter
}

// NewMetrics creates the export metrics and registers them with reg
// (nil: a private registry).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := &Metrics{
		Exports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_project_exports_total",
			Help: "Project exports ended by export.project, per status (finished, failed).",
		}, []string{"status"}),
		StuckFailed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_stuck_export_jobs_total",
			Help: "Stuck project exports (River job finished or gone, export still queued or started) marked failed by export.stuck_jobs.",
		}),
	}
	for _, c := range []prometheus.Collector{m.Exports, m.StuckFailed} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register export metrics: %w", err)
		}
	}
	// Every status's series exists at 0 from the start.
	for _, status := range []string{ExportFinished, ExportFailed} {
		m.Exports.WithLabelValues(status)
	}
	return m, nil
}
