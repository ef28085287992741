package taskcancel

import (
	"context"
	"fmt"

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

// ReadTaskCancellationStats reads the view sluice.task_cancellation_stats.
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

// The module's cluster-wide gauges (public names).
var (
	stillRunningDesc = prometheus.NewDesc("sluice_cancelled_still_running",
		"Jobs of the kind running now at least task_cancellation.duration_millis after their cancellation, whole cluster.",
		[]string{"kind"}, nil)
	countedDesc = prometheus.NewDesc("sluice_task_cancellation_count_post_cancel_total",
		"Jobs of the kind counted by task_cancellation.monitor for running too long after their cancellation (cumulative, whole cluster).",
		[]string{"kind"}, nil)
)

// clusterSource reads the cancellation stats for the cluster-wide gauges
// (metrics.Cluster: one worker exports them).
func clusterSource(ctx context.Context, q *db.Queries) ([]prometheus.Metric, error) {
	stats, err := ReadTaskCancellationStats(ctx, q)
	if err != nil {
		return nil, err
	}
	out := make([]prometheus.Metric, 0, 2*len(stats))
	for kind, s := range stats {
		out = append(out,
			prometheus.MustNewConstMetric(stillRunningDesc, prometheus.GaugeValue, float64(s.CurrentCountPostCancel), kind),
			prometheus.MustNewConstMetric(countedDesc, prometheus.CounterValue, float64(s.TotalCountPostCancel), kind))
	}
	return out, nil
}
