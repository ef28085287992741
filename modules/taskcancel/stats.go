package taskcancel

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/db"
)

// TaskCancellationKindStats are the cancellation stats of one job kind, in
// OpenSearch's node-stats shape.
type TaskCancellationKindStats struct {
	// CurrentCountPostCancel is the number of jobs of the kind running right
	// now at least task_cancellation.duration_millis after their
	// cancellation (computed when read).
	CurrentCountPostCancel int64 `json:"current_count_post_cancel"`
	// TotalCountPostCancel is the cumulative number of jobs of the kind the
	// monitor counted.
	TotalCountPostCancel int64 `json:"total_count_post_cancel"`
}

// TaskCancellationStats are the cancellation stats per job kind: the
// "task_cancellation" section of /stats and `sluice stats --json`.
type TaskCancellationStats map[string]TaskCancellationKindStats

// ReadTaskCancellationStats reads the view sluice_task_cancellation_stats.
// The result is never nil, so it encodes as {} when no kind has stats.
func ReadTaskCancellationStats(ctx context.Context, q *db.Queries) (TaskCancellationStats, error) {
	rows, err := q.TaskCancellationStats(ctx)
	if err != nil {
		return nil, fmt.Errorf("read task cancellation stats: %w", err)
	}
	out := make(TaskCancellationStats, len(rows))
	for _, r := range rows {
		out[r.Kind] = TaskCancellationKindStats{
			CurrentCountPostCancel: r.CurrentCountPostCancel,
			TotalCountPostCancel:   r.TotalCountPostCancel,
		}
	}
	return out, nil
}

// taskCancellationScrapeTimeout bounds the database read of one scrape.
const taskCancellationScrapeTimeout = 5 * time.Second

// TaskCancellationCollector exposes the cancellation stats as Prometheus
// metrics, read from the database at scrape time, so every worker reports
// the same cluster-wide numbers:
//
//   - sluice_task_cancellation_current_count_post_cancel{kind} (gauge)
//   - sluice_task_cancellation_count_post_cancel_total{kind} (counter)
//   - sluice_task_cancellation_stats_up (1 if the read succeeded, else 0; a
//     failed read does not fail the whole scrape)
type TaskCancellationCollector struct {
	q       *db.Queries
	logger  *slog.Logger
	current *prometheus.Desc
	total   *prometheus.Desc
	up      *prometheus.Desc
}

// NewTaskCancellationCollector returns a collector reading through dbtx (a
// pool); a nil logger discards the log lines of failed reads.
func NewTaskCancellationCollector(dbtx db.DBTX, logger *slog.Logger) *TaskCancellationCollector {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &TaskCancellationCollector{
		q:      db.New(dbtx),
		logger: logger,
		current: prometheus.NewDesc("sluice_task_cancellation_current_count_post_cancel",
			"Jobs running now at least task_cancellation.duration_millis after their cancellation, per kind.",
			[]string{"kind"}, nil),
		total: prometheus.NewDesc("sluice_task_cancellation_count_post_cancel_total",
			"Jobs counted by task_cancellation.monitor for running too long after their cancellation, per kind (cumulative, cluster-wide).",
			[]string{"kind"}, nil),
		up: prometheus.NewDesc("sluice_task_cancellation_stats_up",
			"1 if the task cancellation stats were read from the database at this scrape, else 0.",
			nil, nil),
	}
}

// Describe sends the metric descriptions.
func (c *TaskCancellationCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.current
	ch <- c.total
	ch <- c.up
}

// Collect reads the stats view and sends one gauge and one counter per kind.
func (c *TaskCancellationCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), taskCancellationScrapeTimeout)
	defer cancel()
	stats, err := ReadTaskCancellationStats(ctx, c.q)
	if err != nil {
		c.logger.Warn("task cancellation metrics not read", "error", err)
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	for kind, s := range stats {
		ch <- prometheus.MustNewConstMetric(c.current, prometheus.GaugeValue, float64(s.CurrentCountPostCancel), kind)
		ch <- prometheus.MustNewConstMetric(c.total, prometheus.CounterValue, float64(s.TotalCountPostCancel), kind)
	}
}
