package jobs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// Job outcomes, the values of the outcome label.
const (
	OutcomeCancelled = "cancelled"
	OutcomeCompleted = "completed"
	OutcomeFailed    = "failed"
	OutcomePanicked  = "panicked"
	OutcomeSnoozed   = "snoozed"
	OutcomeTimedOut  = "timed_out"
)

// Metrics are the Prometheus collectors of job execution.
type Metrics struct {
	// JobsWorked counts worked jobs per kind and outcome.
	JobsWorked *prometheus.CounterVec
	// JobDuration observes how long Work took per kind.
	JobDuration *prometheus.HistogramVec
	// MaintenanceRuns counts maintenance runs per kind and status.
	MaintenanceRuns *prometheus.CounterVec
	// MaintenanceAffected counts rows changed by maintenance runs per kind.
	MaintenanceAffected *prometheus.CounterVec
	// CIBuilds counts what the stuck-build sweeps did.
	CIBuilds *CIBuildsMetrics
}

// NewMetrics creates the job metrics and registers them with reg (nil: a
// private registry).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := &Metrics{
		JobsWorked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_jobs_worked_total",
			Help: "Jobs worked by this process, per kind and outcome.",
		}, []string{"kind", "outcome"}),
		JobDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_job_duration_seconds",
			Help:    "Time spent working a job, per kind.",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 1800},
		}, []string{"kind"}),
		MaintenanceRuns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_maintenance_runs_total",
			Help: "Maintenance runs, per kind and status (succeeded, skipped_locked, failed).",
		}, []string{"kind", "status"}),
		MaintenanceAffected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_maintenance_affected_total",
			Help: "Rows changed by maintenance runs, per kind.",
		}, []string{"kind"}),
	}
	for _, c := range []prometheus.Collector{m.JobsWorked, m.JobDuration, m.MaintenanceRuns, m.MaintenanceAffected} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register job metrics: %w", err)
		}
	}
	var err error
	if m.CIBuilds, err = newCIBuildsMetrics(reg); err != nil {
		return nil, err
	}
	return m, nil
}

type outcomeKey struct{}

// SetOutcome overrides the outcome the metrics middleware records for the job
// being worked in ctx (for example "parked" for a job that a middleware
// finished without running it). It does nothing outside a worked job.
func SetOutcome(ctx context.Context, outcome string) {
	if p, ok := ctx.Value(outcomeKey{}).(*string); ok {
		*p = outcome
	}
}

// metricsMiddleware counts every worked job by kind and outcome and times it.
type metricsMiddleware struct {
	river.MiddlewareDefaults
	metrics *Metrics
}

func (m *metricsMiddleware) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) (err error) {
	var override string
	ctx = context.WithValue(ctx, outcomeKey{}, &override)
	start := time.Now()
	panicked := true
	defer func() {
		outcome := OutcomePanicked
		if !panicked {
			outcome = classify(ctx, err)
		}
		if override != "" {
			outcome = override
		}
		m.metrics.JobDuration.WithLabelValues(job.Kind).Observe(time.Since(start).Seconds())
		m.metrics.JobsWorked.WithLabelValues(job.Kind, outcome).Inc()
	}()
	err = doInner(ctx)
	panicked = false
	return err
}

func classify(ctx context.Context, err error) string {
	var cancelErr *river.JobCancelError
	var snoozeErr *river.JobSnoozeError
	switch {
	case err == nil:
		return OutcomeCompleted
	case errors.As(err, &cancelErr):
		return OutcomeCancelled
	case errors.As(err, &snoozeErr):
		return OutcomeSnoozed
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return OutcomeTimedOut
	case ctx.Err() != nil:
		return OutcomeCancelled
	default:
		return OutcomeFailed
	}
}
