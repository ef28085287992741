package tracing

import (
	"context"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/riverqueue/rivercontrib/otelriver"
)

// InsertMiddleware is the insert middleware of every River client sluice
// builds: otelriver's, with trace propagation on. It makes a span
// (river.insert_many, a child of the caller's span) around each insert and
// stores its W3C trace context (traceparent, tracestate) in each job's
// metadata, where the work span finds it. Only otelriver's insert half is
// used: the work span is sluice's (WorkMiddleware).
func (t *Tracing) InsertMiddleware() rivertype.JobInsertMiddleware {
	return &insertOnly{m: otelriver.NewMiddleware(&otelriver.MiddlewareConfig{
		TracerProvider:         t.provider,
		EnableTracePropagation: true,
	})}
}

// insertOnly is otelriver's middleware for inserts only.
type insertOnly struct {
	river.MiddlewareDefaults
	m *otelriver.Middleware
}

// InsertMany traces the insert of manyParams and propagates its context.
func (i *insertOnly) InsertMany(ctx context.Context, manyParams []*rivertype.JobInsertParams,
	doInner func(context.Context) ([]*rivertype.JobInsertResult, error)) ([]*rivertype.JobInsertResult, error) {
	return i.m.InsertMany(ctx, manyParams, doInner)
}
