package sluice_test

import (
	"context"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/limiter"
	"github.com/sluice-dev/sluice/tracing"
)

// TracedArgs is a job of the tracing tests: it takes MS.
type TracedArgs struct {
	MS int `json:"ms"`
}

func (TracedArgs) Kind() string { return "test.traced" }

// TracedWorker works test.traced jobs.
type TracedWorker struct {
	river.WorkerDefaults[TracedArgs]
}

func (*TracedWorker) Work(ctx context.Context, job *river.Job[TracedArgs]) error {
	select {
	case <-time.After(time.Duration(job.Args.MS) * time.Millisecond):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// tracedConfig is a Config on a fresh database working test.traced, its
// spans recorded in memory.
func tracedConfig(t *testing.T) (sluice.Config, *tracetest.InMemoryExporter, *sdktrace.TracerProvider) {
	t.Helper()
	workers := river.NewWorkers()
	river.AddWorker(workers, &TracedWorker{})
	cfg := testConfig(t, workers)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	cfg.TracerProvider = tp
	return cfg, exp, tp
}

// workSpans are the work spans of exp by job id.
func workSpans(t *testing.T, exp *tracetest.InMemoryExporter) map[int64][]tracetest.SpanStub {
	t.Helper()
	out := map[int64][]tracetest.SpanStub{}
	for _, s := range exp.GetSpans() {
		if s.Name != "sluice.work/test.traced" {
			continue
		}
		out[attr(s, "id").AsInt64()] = append(out[attr(s, "id").AsInt64()], s)
	}
	return out
}

func attr(s tracetest.SpanStub, key string) attribute.Value {
	for _, a := range s.Attributes {
		if string(a.Key) == key {
			return a.Value
		}
	}
	return attribute.Value{}
}

func eventNames(s tracetest.SpanStub) []string {
	var names []string
	for _, e := range s.Events {
		names = append(names, e.Name)
	}
	return names
}

// TestTracingInsertToWork: an insert in a request's span makes an insert
// span in its trace; each job's work span is a child of it, one per job,
// with its attributes; a job held by a limit of 1 that parked and was
// resumed is still one work span, carrying the parking and the resume as
// events.
func TestTracingInsertToWork(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, exp, tp := tracedConfig(t)
	cfg.HTTPAddr = ""
	cfg.ParkAfter = 20 * time.Millisecond
	cfg.Limits = []sluice.Limit{{Kind: "test.traced", Max: 1}}
	w, err := sluice.New(ctx, cfg)
	require.NoError(t, err)
	require.NoError(t, w.Start(ctx))
	t.Cleanup(func() { _ = stop(t, w) })

	reqCtx, request := tp.Tracer("test").Start(ctx, "POST /exports")
	var ids []int64
	for range 3 {
		res, err := w.Client().Insert(reqCtx, TracedArgs{MS: 300}, nil)
		require.NoError(t, err)
		ids = append(ids, res.Job.ID)
	}
	request.End()

	require.Eventually(t, func() bool {
		for _, id := range ids {
			job, err := w.Client().JobGet(ctx, id)
			if err != nil || job.State != rivertype.JobStateCompleted {
				return false
			}
		}
		return true
	}, 30*time.Second, 50*time.Millisecond)
	hadParking := map[int64]bool{}
	for _, id := range ids {
		var parking bool
		require.NoError(t, w.Pool().QueryRow(ctx, `SELECT metadata ? 'sluice_parking' FROM river_job WHERE id = $1`, id).Scan(&parking))
		hadParking[id] = parking
	}
	require.NoError(t, stop(t, w))

	// The request's three inserts, children of its span. (The limiter's
	// safety net may insert concurrency_limit.resume jobs meanwhile, each
	// in a trace of its own: not the request's.)
	inserts := map[trace.SpanID]tracetest.SpanStub{}
	for _, s := range exp.GetSpans() {
		if s.Name == "river.insert_many" && s.SpanContext.TraceID() == request.SpanContext().TraceID() {
			require.Equal(t, request.SpanContext().SpanID(), s.Parent.SpanID())
			inserts[s.SpanContext.SpanID()] = s
		}
	}
	require.Len(t, inserts, 3, "the inserts are in the request's trace")

	spans := workSpans(t, exp)
	parked := 0
	for _, id := range ids {
		require.Len(t, spans[id], 1, "one work span for job %d", id)
		s := spans[id][0]
		require.Equal(t, request.SpanContext().TraceID(), s.SpanContext.TraceID(), "job %d works in the request's trace", id)
		_, ok := inserts[s.Parent.SpanID()]
		require.True(t, ok, "job %d's work span is a child of its insert span", id)
		require.Equal(t, trace.SpanKindConsumer, s.SpanKind)
		require.Equal(t, "test.traced", attr(s, "kind").AsString())
		require.Equal(t, "default", attr(s, "queue").AsString())
		require.Equal(t, int64(1), attr(s, "attempt").AsInt64())
		require.Equal(t, tracing.OutcomeCompleted, attr(s, "outcome").AsString())
		// Under a limit of 1, the slot it held: its worker's lease, or, once
		// the kind's line holds parked jobs, a slot of the line (every
		// resumed job's).
		slot := attr(s, tracing.AttrLimiterSlot).AsString()
		require.Contains(t, []string{limiter.SlotLeased, limiter.SlotLine}, slot, "job %d's slot", id)

		if hadParking[id] {
			parked++
			names := eventNames(s)
			require.Contains(t, names, tracing.EventParked, "job %d parked", id)
			require.Contains(t, names, tracing.EventResumed, "job %d was resumed", id)
			require.Equal(t, limiter.SlotLine, slot, "job %d, resumed, ran on a slot of the line", id)
			for _, e := range s.Events {
				require.False(t, e.Time.Before(s.StartTime), "event %s of job %d within its span", e.Name, id)
				if e.Name == tracing.EventParked {
					// the limit held it, or older jobs of the kind went first
					require.Contains(t, []string{"limit", "fifo"}, attributeOf(e.Attributes, "reason").AsString())
				}
			}
		}
	}
	require.Positive(t, parked, "a limit of 1 over three 300ms jobs parks some (park-after 20ms)")
}

func attributeOf(attrs []attribute.KeyValue, key string) attribute.Value {
	for _, a := range attrs {
		if string(a.Key) == key {
			return a.Value
		}
	}
	return attribute.Value{}
}

// TestTracingOldInsertLinked: a job that starts long after its insert
// starts a trace of its own, linked to the insert's span.
func TestTracingOldInsertLinked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, exp, tp := tracedConfig(t)
	cfg.HTTPAddr = ""
	w, err := sluice.New(ctx, cfg)
	require.NoError(t, err)
	reqCtx, request := tp.Tracer("test").Start(ctx, "nightly import")
	res, err := w.Client().Insert(reqCtx, TracedArgs{}, nil)
	require.NoError(t, err)
	request.End()
	_, err = w.Pool().Exec(ctx, `UPDATE river_job SET created_at = now() - interval '2 hours' WHERE id = $1`, res.Job.ID)
	require.NoError(t, err)
	require.NoError(t, w.Start(ctx))
	require.Eventually(t, func() bool { return len(workSpans(t, exp)[res.Job.ID]) == 1 }, 30*time.Second, 50*time.Millisecond)
	require.NoError(t, stop(t, w))

	s := workSpans(t, exp)[res.Job.ID][0]
	require.NotEqual(t, request.SpanContext().TraceID(), s.SpanContext.TraceID())
	require.False(t, s.Parent.IsValid(), "a root span")
	require.Len(t, s.Links, 1)
	require.Equal(t, request.SpanContext().TraceID(), s.Links[0].SpanContext.TraceID())
}

// TestTracingDispatchedSchedule: a job a schedule dispatches works in the
// trace of the dispatcher's tick.
func TestTracingDispatchedSchedule(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, exp, _ := tracedConfig(t)
	cfg.HTTPAddr = ""
	cfg.SchedulePollInterval = 100 * time.Millisecond
	cfg.Schedules = []sluice.Schedule{{Name: "traced", Cron: "@every 1s", Args: TracedArgs{}}}
	w, err := sluice.New(ctx, cfg)
	require.NoError(t, err)
	require.NoError(t, w.Start(ctx))
	t.Cleanup(func() { _ = stop(t, w) })
	var work tracetest.SpanStub
	require.Eventually(t, func() bool {
		for _, spans := range workSpans(t, exp) {
			work = spans[0]
			return true
		}
		return false
	}, 30*time.Second, 50*time.Millisecond)
	require.NoError(t, stop(t, w))

	byID := map[trace.SpanID]tracetest.SpanStub{}
	for _, s := range exp.GetSpans() {
		byID[s.SpanContext.SpanID()] = s
	}
	insert, ok := byID[work.Parent.SpanID()]
	require.True(t, ok, "the work span's parent was recorded")
	require.Equal(t, "river.insert_many", insert.Name)
	tick, ok := byID[insert.Parent.SpanID()]
	require.True(t, ok, "the insert span's parent was recorded")
	require.Equal(t, "sluice.schedule.dispatch", tick.Name)
	require.Equal(t, tick.SpanContext.TraceID(), work.SpanContext.TraceID())
	require.Positive(t, attr(tick, "jobs").AsInt64())
}
