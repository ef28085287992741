package tracing

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dev/sluice/limiter"
)

// ChildWithin is how soon after its insert a job must start for its work
// span to be a child of the insert's span, in the inserter's trace; a job
// that starts later (scheduled far ahead, or parked long) starts a trace
// of its own, linked to the insert's span, as otelriver links them.
const ChildWithin = time.Hour

// Work span events (WorkMiddleware).
const (
	// EventWaited: the job waited in its worker for its kind's limits
	// before it started (attributes reason and waited_ms).
	EventWaited = "sluice.waited"
	// EventParked: the job parked, its attempt undone (attributes reason
	// and parks, how many times this attempt parked).
	EventParked = "sluice.parked"
	// EventResumed: the parked job was resumed to be fetched again.
	EventResumed = "sluice.resumed"
)

// AttrLimiterSlot is the work span's attribute of the concurrency slot a
// job of a limited kind holds (limiter.AdmissionFrom): leased, line, or
// none (a rate alone).
const AttrLimiterSlot = "limiter_slot"

// Work span outcomes (attribute outcome).
const (
	OutcomeCompleted = "completed"
	OutcomeError     = "error"
	OutcomeCancelled = "cancelled"
	OutcomeSnoozed   = "snoozed"
	OutcomePanic     = "panic"
)

// WorkMiddleware is the worker middleware that makes one span per job that
// runs (sluice.work/KIND): a child of the span that inserted the job when
// the job starts within ChildWithin of its insert, else linked to it. It
// sits right inside the limiter, so a job that parks makes no span when it
// parks: its run's span starts when the attempt first waited (its first
// fetch) and carries the parking and the resume as events (from the job's
// metadata.sluice_parking), and the wait in the worker for a slot or a rate
// (limiter.HeldFrom). Attributes: kind, queue, priority, attempt, id,
// outcome (completed, error, cancelled, snoozed, panic), and for a job its
// kind's limits let start, limiter_slot (AttrLimiterSlot).
func (t *Tracing) WorkMiddleware() rivertype.WorkerMiddleware {
	return &workMiddleware{tracer: t.tracer}
}

type workMiddleware struct {
	river.MiddlewareDefaults
	tracer trace.Tracer
}

// Work runs the job inside its work span.
func (m *workMiddleware) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) (err error) {
	md := readMetadata(job.Metadata)
	start := time.Now()
	if job.AttemptedAt != nil && job.AttemptedAt.Before(start) {
		start = *job.AttemptedAt
	}
	parking := md.Parking
	if parking != nil && parking.Attempt != job.Attempt-1 {
		parking = nil // the record of an earlier attempt's parking
	}
	if parking != nil && parking.FirstAt != nil && parking.FirstAt.Before(start) {
		start = *parking.FirstAt
	}
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithTimestamp(start),
		trace.WithAttributes(
			attribute.String("kind", job.Kind),
			attribute.String("queue", job.Queue),
			attribute.Int("priority", job.Priority),
			attribute.Int("attempt", job.Attempt),
			attribute.Int64("id", job.ID),
		),
	}
	parent := ctx
	if sc := md.spanContext(); sc.IsValid() {
		if time.Since(job.CreatedAt) <= ChildWithin {
			parent = trace.ContextWithRemoteSpanContext(ctx, sc)
		} else {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
		}
	}
	ctx, span := m.tracer.Start(parent, "sluice.work/"+job.Kind, opts...)
	if span.IsRecording() {
		addLimiterEvents(ctx, span, parking)
	}
	panicked := true
	defer func() {
		outcome := OutcomeCompleted
		var cancelErr *river.JobCancelError
		var snoozeErr *river.JobSnoozeError
		switch {
		case panicked:
			outcome = OutcomePanic
			span.SetStatus(codes.Error, "panic")
		case errors.As(err, &cancelErr):
			outcome = OutcomeCancelled
		case errors.As(err, &snoozeErr):
			outcome = OutcomeSnoozed
		case err != nil:
			outcome = OutcomeError
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.SetAttributes(attribute.String("outcome", outcome))
		span.End()
	}()
	err = doInner(ctx)
	panicked = false
	return err
}

// addLimiterEvents puts how the limiter held the job on its span: its
// parking and resume (parking, nil: none) and its wait in the worker.
func addLimiterEvents(ctx context.Context, span trace.Span, parking *parkingRecord) {
	if parking != nil {
		if parking.ParkedAt != nil {
			span.AddEvent(EventParked, trace.WithTimestamp(*parking.ParkedAt), trace.WithAttributes(
				attribute.String("reason", parking.Reason), attribute.Int("parks", parking.Parks)))
		}
		if parking.ResumedAt != nil {
			span.AddEvent(EventResumed, trace.WithTimestamp(*parking.ResumedAt))
		}
	}
	if a, ok := limiter.AdmissionFrom(ctx); ok {
		span.SetAttributes(attribute.String(AttrLimiterSlot, cmp.Or(a.Slot, "none")))
	}
	if held, ok := limiter.HeldFrom(ctx); ok {
		span.AddEvent(EventWaited, trace.WithTimestamp(held.Since), trace.WithAttributes(
			attribute.String("reason", held.Reason),
			attribute.Int64("waited_ms", time.Since(held.Since).Milliseconds())))
	}
}

// jobMetadata is what the work span reads of a job's metadata: the W3C
// trace context of its insert, and its parking record (migration
// 00014_parking_metadata).
type jobMetadata struct {
	Traceparent string         `json:"traceparent"`
	Tracestate  string         `json:"tracestate"`
	Parking     *parkingRecord `json:"sluice_parking"`
}

// parkingRecord is metadata.sluice_parking.
type parkingRecord struct {
	Attempt   int        `json:"attempt"`
	FirstAt   *time.Time `json:"first_at"`
	ParkedAt  *time.Time `json:"parked_at"`
	ResumedAt *time.Time `json:"resumed_at"`
	Parks     int        `json:"parks"`
	Reason    string     `json:"reason"`
}

var (
	traceparentKey = []byte(`"traceparent"`)
	parkingKey     = []byte(`"sluice_parking"`)
)

// readMetadata decodes what the work span needs of raw, only when it holds
// any of it: the metadata of a job inserted without tracing, which never
// parked, is not decoded.
func readMetadata(raw []byte) jobMetadata {
	var md jobMetadata
	if !bytes.Contains(raw, traceparentKey) && !bytes.Contains(raw, parkingKey) {
		return md
	}
	_ = json.Unmarshal(raw, &md) // metadata River accepted is JSON; what does not decode is left out
	return md
}

// spanContext is the remote span context of the insert (invalid: none).
func (md jobMetadata) spanContext() trace.SpanContext {
	if md.Traceparent == "" {
		return trace.SpanContext{}
	}
	carrier := propagation.MapCarrier{"traceparent": md.Traceparent}
	if md.Tracestate != "" {
		carrier["tracestate"] = md.Tracestate
	}
	return trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), carrier))
}
