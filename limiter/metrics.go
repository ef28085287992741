package limiter

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the Prometheus collectors of concurrency limits, per process.
// The cluster-wide figures (limits, slots in use, parked jobs) are gauges
// of package metrics' Cluster, read from the database by one worker.
type Metrics struct {
	// Parked counts jobs this process parked, per kind.
	Parked *prometheus.CounterVec
	// Resumed counts parked jobs this process moved back into River, per
	// kind.
	Resumed *prometheus.CounterVec
	// RateDelayed counts jobs this process parked because a rate window of
	// their kind (or key) was full, per kind (also counted in Parked).
	RateDelayed *prometheus.CounterVec
}

// NewMetrics creates the concurrency-limit metrics and registers them with
// reg (nil: a private registry).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := &Metrics{
		Parked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_concurrency_parked_total",
			Help: "Jobs parked in place by this process for want of a concurrency slot, per kind (not executions).",
		}, []string{"kind"}),
		Resumed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_concurrency_resumed_total",
			Help: "Parked jobs this process made available again, per kind.",
		}, []string{"kind"}),
		RateDelayed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_rate_limited_total",
			Help: "Jobs this process parked because their kind's (or key's) rate window was full, per kind (also in sluice_concurrency_parked_total).",
		}, []string{"kind"}),
	}
	for _, c := range []prometheus.Collector{m.Parked, m.Resumed, m.RateDelayed} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register concurrency metrics: %w", err)
		}
	}
	return m, nil
}

// Init creates the series of kind at 0.
func (m *Metrics) Init(kind string) {
	m.Parked.WithLabelValues(kind)
	m.Resumed.WithLabelValues(kind)
	m.RateDelayed.WithLabelValues(kind)
}
