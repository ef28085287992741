// Package metrics holds sluice's Prometheus metrics that are not a single
// subsystem's: the per-process job metrics (a worker middleware that counts
// and times every job a worker runs, per kind, queue and outcome), the
// build info, and the cluster-wide gauges read from the database, exported
// by one worker at a time (Cluster).
//
// The job middleware runs inside the concurrency limiter's middleware, so
// it sees real executions only: a job that parks never reaches it.
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

// Job outcomes, the values of the outcome label of sluice_jobs_total: what
// River does with the job once the execution ends.
const (
	// OutcomeCompleted: the job completed.
	OutcomeCompleted = "completed"
	// OutcomeRetryable: the job failed (error, panic, timeout) with attempts
	// left, and will be retried; also a job interrupted by its worker's
	// stop, which River makes available again.
	OutcomeRetryable = "retryable"
	// OutcomeDiscarded: the job failed on its last attempt.
	OutcomeDiscarded = "discarded"
	// OutcomeCancelled: the job was cancelled (river.JobCancel, or River's
	// JobCancel from a client while it ran).
	OutcomeCancelled = "cancelled"
	// OutcomeSnoozed: the job snoozed (river.JobSnooze).
	OutcomeSnoozed = "snoozed"
)

// Outcomes lists every outcome.
func Outcomes() []string {
	return []string{OutcomeCompleted, OutcomeRetryable, OutcomeDiscarded, OutcomeCancelled, OutcomeSnoozed}
}

// Metrics are the Prometheus collectors of job execution, per process.
type Metrics struct {
	// Jobs counts executions per kind, queue and outcome.
	Jobs *prometheus.CounterVec
	// Duration observes how long an execution took, per kind and queue.
	Duration *prometheus.HistogramVec
}

// NewMetrics creates the job metrics and registers them with reg (nil: a
// private registry).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := &Metrics{
		Jobs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_jobs_total",
			Help: "Job executions by this process, per kind, queue and outcome (completed, retryable, discarded, cancelled, snoozed). A parked job is not an execution.",
		}, []string{"kind", "queue", "outcome"}),
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_job_duration_seconds",
			Help:    "Time a job's execution took in this process, per kind and queue (real executions only).",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 1800},
		}, []string{"kind", "queue"}),
	}
	for _, c := range []prometheus.Collector{m.Jobs, m.Duration} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register job metrics: %w", err)
		}
	}
	return m, nil
}

// Init creates the series of kind in queue at 0 (every outcome, and the
// duration), so that rate() and increase() see the first event.
func (m *Metrics) Init(kind, queue string) {
	for _, outcome := range Outcomes() {
		m.Jobs.WithLabelValues(kind, queue, outcome)
	}
	m.Duration.WithLabelValues(kind, queue)
}

// Middleware counts every executed job by kind, queue and outcome and times
// it.
type Middleware struct {
	river.MiddlewareDefaults
	metrics *Metrics
	// series caches each kind and queue's duration observer and completed
	// counter (*series): those of almost every job, found without hashing
	// label values.
	series sync.Map
}

type seriesKey struct{ kind, queue string }

// series are the series of a kind and queue that almost every job records.
type series struct {
	duration  prometheus.Observer
	completed prometheus.Counter
}

// NewMiddleware returns the middleware recording into m.
func NewMiddleware(m *Metrics) *Middleware { return &Middleware{metrics: m} }

func (m *Middleware) seriesOf(job *rivertype.JobRow) *series {
	key := seriesKey{job.Kind, job.Queue}
	if s, ok := m.series.Load(key); ok {
		return s.(*series)
	}
	s, _ := m.series.LoadOrStore(key, &series{
		duration:  m.metrics.Duration.WithLabelValues(job.Kind, job.Queue),
		completed: m.metrics.Jobs.WithLabelValues(job.Kind, job.Queue, OutcomeCompleted),
	})
	return s.(*series)
}

// Work runs the job and records its outcome and duration.
func (m *Middleware) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) (err error) {
	start := time.Now()
	panicked := true
	defer func() {
		outcome := failed(job)
		if !panicked {
			outcome = classify(ctx, job, err)
		}
		s := m.seriesOf(job)
		s.duration.Observe(time.Since(start).Seconds())
		if outcome == OutcomeCompleted {
			s.completed.Inc()
		} else {
			m.metrics.Jobs.WithLabelValues(job.Kind, job.Queue, outcome).Inc()
		}
	}()
	err = doInner(ctx)
	panicked = false
	return err
}

// classify is what River will do with the job after its execution returned
// err (River's job executor decides so).
func classify(ctx context.Context, job *rivertype.JobRow, err error) string {
	var cancelErr *river.JobCancelError
	var snoozeErr *river.JobSnoozeError
	switch {
	case err == nil:
		return OutcomeCompleted
	case errors.As(err, &cancelErr), errors.Is(context.Cause(ctx), river.ErrJobCancelledRemotely):
		return OutcomeCancelled
	case errors.As(err, &snoozeErr):
		return OutcomeSnoozed
	default:
		return failed(job)
	}
}

// failed is the outcome of a failed execution: discarded on the last
// attempt, else retryable.
func failed(job *rivertype.JobRow) string {
	if job.Attempt >= job.MaxAttempts {
		return OutcomeDiscarded
	}
	return OutcomeRetryable
}
