// Package tracing is sluice's OpenTelemetry instrumentation: a span around
// every insert through sluice's clients, whose W3C trace context travels in
// the job's metadata (rivercontrib/otelriver's insert middleware); one work
// span per job that runs, a child of the inserter's span (or linked to it
// when the insert is old), with the limiter's waits, parkings and resumes
// as events; spans of dispatcher ticks and maintenance runs; and the
// tracer provider of the stock binary, from the standard OTEL_* variables
// (FromEnv).
package tracing

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of sluice's spans.
const ScopeName = "github.com/sluice-dev/sluice"

// Tracing makes sluice's spans with one tracer provider.
type Tracing struct {
	provider trace.TracerProvider
	tracer   trace.Tracer
}

// New returns sluice's tracing on tp; nil: OpenTelemetry's global provider
// (a no-op unless the program sets one), looked up now.
func New(tp trace.TracerProvider) *Tracing {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return &Tracing{provider: tp, tracer: tp.Tracer(ScopeName)}
}

// Tracer is the tracer of sluice's own spans (dispatcher ticks,
// maintenance runs, work).
func (t *Tracing) Tracer() trace.Tracer { return t.tracer }

// Provider is the tracer provider.
func (t *Tracing) Provider() trace.TracerProvider { return t.provider }
