// Package metrics is the worker middleware that counts and times every job
// a worker runs, per kind and outcome. It runs inside the concurrency
// limiter's middleware, so it sees real executions only: a job that parks
// never reaches it.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"sync"
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
	}
	for _, c := range []prometheus.Collector{m.JobsWorked, m.JobDuration} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register job metrics: %w", err)
		}
	}
	return m, nil
}

// Middleware counts every worked job by kind and outcome and times it.
type Middleware struct {
	river.MiddlewareDefaults
	metrics *Metrics
	// byKind caches each kind's duration observer and completed counter
	// (*kindSeries): the series of almost every job, found without hashing
	// label values.
	byKind sync.Map
}

// kindSeries are the series of one kind that almost every job records.
type kindSeries struct {
	duration  prometheus.Observer
	completed prometheus.Counter
}

func (m *Middleware) series(kind string) *kindSeries {
	if s, ok := m.byKind.Load(kind); ok {
		return s.(*kindSeries)
	}
	s, _ := m.byKind.LoadOrStore(kind, &kindSeries{
		duration:  m.metrics.JobDuration.WithLabelValues(kind),
		completed: m.metrics.JobsWorked.WithLabelValues(kind, OutcomeCompleted),
	})
	return s.(*kindSeries)
}

// NewMiddleware returns the middleware recording into m.
func NewMiddleware(m *Metrics) *Middleware { return &Middleware{metrics: m} }

// Work runs the job and records its outcome and duration.
func (m *Middleware) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) (err error) {
	start := time.Now()
	panicked := true
	defer func() {
		outcome := OutcomePanicked
		if !panicked {
			outcome = classify(ctx, err)
		}
		series := m.series(job.Kind)
		series.duration.Observe(time.Since(start).Seconds())
		if outcome == OutcomeCompleted {
			series.completed.Inc()
		} else {
			m.metrics.JobsWorked.WithLabelValues(job.Kind, outcome).Inc()
		}
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
