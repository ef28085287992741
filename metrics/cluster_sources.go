package metrics

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/db"
)

// The cluster-wide gauges of sluice's core (public names).
var (
	queueJobsDesc = prometheus.NewDesc("sluice_queue_jobs",
		"Jobs still to finish per queue and state (available, pending, running, retryable, scheduled), whole cluster.",
		[]string{"queue", "state"}, nil)
	queueOldestDesc = prometheus.NewDesc("sluice_queue_oldest_available_age_seconds",
		"How long the oldest available job of the queue has waited (0: none waits), whole cluster.",
		[]string{"queue"}, nil)
	limitDesc = prometheus.NewDesc("sluice_concurrency_limit",
		"The concurrency limit of the kind (0: none, < 0: circuit breaker).", []string{"kind"}, nil)
	slotsDesc = prometheus.NewDesc("sluice_concurrency_slots_in_use",
		"Concurrency slots of the kind taken now (admitted and reserved jobs, and slots leased by workers), whole cluster.",
		[]string{"kind"}, nil)
	parkedDesc = prometheus.NewDesc("sluice_parked_jobs",
		"Jobs of the kind parked now, waiting for a slot, whole cluster.", []string{"kind"}, nil)
	parkedOldestDesc = prometheus.NewDesc("sluice_parked_oldest_age_seconds",
		"How long the oldest parked job of the kind has waited (0: none parked).", []string{"kind"}, nil)
	parkedKeysDesc = prometheus.NewDesc("sluice_parked_keys",
		"Partition keys of the kind (its per-key or rate limit's --by-args) with jobs waiting, whole cluster.", []string{"kind"}, nil)
	rateStartsDesc = prometheus.NewDesc("sluice_rate_window_starts",
		"Starts of the kind in its rate limit's current window (reserved ones included), whole cluster; only for rate-limited kinds.",
		[]string{"kind"}, nil)
	workersDesc = prometheus.NewDesc("sluice_workers",
		"sluice workers per status: live, late (missed heartbeats), dead (not reaped yet).", []string{"status"}, nil)
	schedulesDesc = prometheus.NewDesc("sluice_schedules",
		"Schedules per status: ok, retrying, overdue, pending, disabled, failed.", []string{"status"}, nil)
	overdueDesc = prometheus.NewDesc("sluice_schedules_overdue",
		"Enabled, active schedules due longer ago than sluice_schedule_overdue_after().", nil, nil)
)

// CoreSources are the cluster-wide gauges of sluice's core: queues,
// concurrency limits, workers, schedules and enqueue outcomes.
func CoreSources() []ClusterSource {
	return []ClusterSource{queueSource, concurrencySource, workersSource, schedulesSource, enqueueOutcomesSource}
}

func queueSource(ctx context.Context, q *db.Queries) ([]prometheus.Metric, error) {
	jobs, err := q.MetricsQueueJobs(ctx)
	if err != nil {
		return nil, fmt.Errorf("queue jobs: %w", err)
	}
	oldest, err := q.MetricsQueueOldestAvailable(ctx)
	if err != nil {
		return nil, fmt.Errorf("queue oldest available: %w", err)
	}
	out := make([]prometheus.Metric, 0, len(jobs)+len(oldest))
	for _, r := range jobs {
		out = append(out, prometheus.MustNewConstMetric(queueJobsDesc, prometheus.GaugeValue, float64(r.Jobs), r.Queue, r.State))
	}
	for _, r := range oldest {
		out = append(out, prometheus.MustNewConstMetric(queueOldestDesc, prometheus.GaugeValue, r.AgeSeconds, r.Queue))
	}
	return out, nil
}

func concurrencySource(ctx context.Context, q *db.Queries) ([]prometheus.Metric, error) {
	rows, err := q.MetricsConcurrency(ctx)
	if err != nil {
		return nil, fmt.Errorf("concurrency: %w", err)
	}
	out := make([]prometheus.Metric, 0, 6*len(rows))
	for _, r := range rows {
		out = append(out,
			prometheus.MustNewConstMetric(limitDesc, prometheus.GaugeValue, float64(r.MaxConcurrency), r.Kind),
			prometheus.MustNewConstMetric(slotsDesc, prometheus.GaugeValue, float64(r.SlotsInUse), r.Kind),
			prometheus.MustNewConstMetric(parkedDesc, prometheus.GaugeValue, float64(r.Parked), r.Kind),
			prometheus.MustNewConstMetric(parkedOldestDesc, prometheus.GaugeValue, r.OldestParkedAgeSeconds, r.Kind),
			prometheus.MustNewConstMetric(parkedKeysDesc, prometheus.GaugeValue, float64(r.ParkedKeys), r.Kind))
		if r.RateLimited {
			out = append(out, prometheus.MustNewConstMetric(rateStartsDesc, prometheus.GaugeValue, float64(r.StartsInWindow), r.Kind))
		}
	}
	return out, nil
}

func workersSource(ctx context.Context, q *db.Queries) ([]prometheus.Metric, error) {
	rows, err := q.MetricsWorkers(ctx)
	if err != nil {
		return nil, fmt.Errorf("workers: %w", err)
	}
	out := make([]prometheus.Metric, 0, len(rows))
	for _, r := range rows {
		out = append(out, prometheus.MustNewConstMetric(workersDesc, prometheus.GaugeValue, float64(r.Workers), r.Status))
	}
	return out, nil
}

func schedulesSource(ctx context.Context, q *db.Queries) ([]prometheus.Metric, error) {
	rows, err := q.MetricsSchedules(ctx)
	if err != nil {
		return nil, fmt.Errorf("schedules: %w", err)
	}
	out := make([]prometheus.Metric, 0, len(rows)+1)
	for _, r := range rows {
		out = append(out, prometheus.MustNewConstMetric(schedulesDesc, prometheus.GaugeValue, float64(r.Schedules), r.Status))
		if r.Status == "overdue" {
			out = append(out, prometheus.MustNewConstMetric(overdueDesc, prometheus.GaugeValue, float64(r.Schedules)))
		}
	}
	return out, nil
}
