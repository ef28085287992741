package limiter

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/db"
)

// Metrics are the Prometheus collectors of concurrency limits.
type Metrics struct {
	// Parked counts jobs this process parked, per kind.
	Parked *prometheus.CounterVec
	// Resumed counts parked jobs this process moved back into River, per
	// kind.
	Resumed *prometheus.CounterVec
}

// NewMetrics creates the concurrency-limit metrics and registers them with
// reg (nil: a private registry), together with gauges of parked and
// admitted jobs per kind that read sluice_concurrency_overview through pool
// at scrape time (none when pool is nil).
func NewMetrics(reg prometheus.Registerer, pool *pgxpool.Pool, logger *slog.Logger) (*Metrics, error) {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	m := &Metrics{
		Parked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_concurrency_parked_total",
			Help: "Jobs parked (deferred) by the concurrency limit, per kind.",
		}, []string{"kind"}),
		Resumed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_concurrency_resumed_total",
			Help: "Parked jobs resumed into River, per kind.",
		}, []string{"kind"}),
	}
	collectors := []prometheus.Collector{m.Parked, m.Resumed}
	if pool != nil {
		collectors = append(collectors, &concurrencyGauges{pool: pool, logger: logger})
	}
	for _, c := range collectors {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register concurrency metrics: %w", err)
		}
	}
	return m, nil
}

var (
	parkedDesc = prometheus.NewDesc("sluice_concurrency_parked_jobs",
		"Jobs parked now, per kind (all workers).", []string{"kind"}, nil)
	admittedDesc = prometheus.NewDesc("sluice_concurrency_admitted_jobs",
		"Slots taken now (admitted and reserved jobs, and slots leased by workers), per kind (all workers).", []string{"kind"}, nil)
	limitDesc = prometheus.NewDesc("sluice_concurrency_limit",
		"The concurrency limit per kind (0 unlimited, < 0 circuit breaker).", []string{"kind"}, nil)
)

// concurrencyGauges reads the overview view when scraped.
type concurrencyGauges struct {
	pool   *pgxpool.Pool
	logger *slog.Logger
}

func (c *concurrencyGauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- parkedDesc
	ch <- admittedDesc
	ch <- limitDesc
}

func (c *concurrencyGauges) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rows, err := db.New(c.pool).ConcurrencyOverview(ctx)
	if err != nil {
		c.logger.Warn("concurrency gauges not collected", "error", err)
		return
	}
	for _, r := range rows {
		ch <- prometheus.MustNewConstMetric(parkedDesc, prometheus.GaugeValue, float64(r.Parked), r.Kind)
		ch <- prometheus.MustNewConstMetric(admittedDesc, prometheus.GaugeValue, float64(r.Admitted), r.Kind)
		if r.MaxConcurrency != nil {
			ch <- prometheus.MustNewConstMetric(limitDesc, prometheus.GaugeValue, float64(*r.MaxConcurrency), r.Kind)
		}
	}
}
