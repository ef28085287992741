package metrics

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/db"
)

// DefaultClusterInterval is how often the exporting worker reads the
// cluster-wide gauges from the database.
const DefaultClusterInterval = 15 * time.Second

// clusterLeaderTimeout bounds the leadership check of a scrape.
const clusterLeaderTimeout = 2 * time.Second

// ClusterSource reads one part of the cluster-wide gauges.
type ClusterSource func(ctx context.Context, q *db.Queries) ([]prometheus.Metric, error)

// ClusterConfig configures a Cluster.
type ClusterConfig struct {
	// Pool is the database pool.
	Pool *pgxpool.Pool
	// Logger receives the failed refreshes.
	Logger *slog.Logger
	// ClientID is this worker's River client ID: the worker that River
	// elected leader exports the gauges.
	ClientID string
	// Interval is how often the gauges are read (default
	// DefaultClusterInterval).
	Interval time.Duration
	// Sources are the modules' sources, beside the core's (CoreSources).
	Sources []ClusterSource
}

// Cluster exports the cluster-wide gauges: figures read from the database,
// the same whichever worker reads them, so exactly one worker exports them
// at a time (River's elected leader; the others export none), and sum() and
// max() over the fleet both give the truth. It is a prometheus.Collector;
// Start refreshes the figures every Interval while this worker leads.
type Cluster struct {
	cfg     ClusterConfig
	q       *db.Queries
	sources []ClusterSource

	exporter      prometheus.Gauge
	refreshErrors prometheus.Counter

	mu     sync.Mutex
	cached []prometheus.Metric

	runMu sync.Mutex
	stop  func()
}

// NewCluster returns the cluster-wide gauges of cfg (the core's and
// cfg.Sources), registered with reg.
func NewCluster(cfg ClusterConfig, reg prometheus.Registerer) (*Cluster, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultClusterInterval
	}
	c := &Cluster{
		cfg:     cfg,
		q:       db.New(cfg.Pool),
		sources: append(CoreSources(), cfg.Sources...),
		exporter: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_cluster_exporter",
			Help: "1 on the worker that exports the cluster-wide gauges (River's elected leader), 0 on the others.",
		}),
		refreshErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_cluster_refresh_errors_total",
			Help: "Failed reads of the cluster-wide gauges by this worker while it exported them.",
		}),
	}
	for _, col := range []prometheus.Collector{c, c.exporter, c.refreshErrors} {
		if err := reg.Register(col); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Describe sends nothing: the gauges' series depend on the database (an
// unchecked collector).
func (c *Cluster) Describe(chan<- *prometheus.Desc) {}

// Collect sends the figures of the last refresh, if this worker is River's
// leader now (checked at each scrape, so that a fleet never exports them
// twice for longer than a leader handover).
func (c *Cluster) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), clusterLeaderTimeout)
	defer cancel()
	if !c.leads(ctx) {
		return
	}
	c.mu.Lock()
	cached := c.cached
	c.mu.Unlock()
	for _, m := range cached {
		ch <- m
	}
}

func (c *Cluster) leads(ctx context.Context) bool {
	leader, err := c.q.MetricsLeader(ctx)
	return err == nil && leader != "" && leader == c.cfg.ClientID
}

// Refresh reads every source now, if this worker leads; otherwise it drops
// what it read before.
func (c *Cluster) Refresh(ctx context.Context) error {
	if !c.leads(ctx) {
		c.exporter.Set(0)
		c.mu.Lock()
		c.cached = nil
		c.mu.Unlock()
		return nil
	}
	c.exporter.Set(1)
	var out []prometheus.Metric
	var errs []error
	for _, src := range c.sources {
		ms, err := src(ctx, c.q)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, ms...)
	}
	if err := errors.Join(errs...); err != nil {
		c.refreshErrors.Inc()
		c.cfg.Logger.Warn("cluster-wide gauges not all read; the last figures stay", "error", err)
		if len(out) == 0 {
			return err
		}
	}
	c.mu.Lock()
	c.cached = out
	c.mu.Unlock()
	return nil
}

// Start refreshes the figures every Interval, in the background, until
// Stop. The first refresh waits one Interval: a worker just started is busy
// with its first fetches, and a scrape comes at most that often anyway.
func (c *Cluster) Start(ctx context.Context) {
	c.runMu.Lock()
	defer c.runMu.Unlock()
	if c.stop != nil {
		return
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	c.stop = func() { cancel(); <-done }
	go func() {
		defer close(done)
		ticker := time.NewTicker(c.cfg.Interval)
		defer ticker.Stop()
		for {
			select {
			case <-runCtx.Done():
				return
			case <-ticker.C:
			}
			refreshCtx, cancelRefresh := context.WithTimeout(runCtx, c.cfg.Interval)
			_ = c.Refresh(refreshCtx)
			cancelRefresh()
		}
	}()
}

// Stop stops the refreshes and waits for the one in flight.
func (c *Cluster) Stop() {
	c.runMu.Lock()
	stop := c.stop
	c.stop = nil
	c.runMu.Unlock()
	if stop != nil {
		stop()
	}
}
