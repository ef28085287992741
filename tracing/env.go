package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// EnvError reports an OTEL_* variable whose value makes no sense, naming
// it.
type EnvError struct {
	Var, Value, Reason string
}

// Error describes the error.
func (e *EnvError) Error() string {
	return fmt.Sprintf("invalid $%s %q: %s", e.Var, e.Value, e.Reason)
}

// exportWarnEvery bounds how often a failing export is logged.
const exportWarnEvery = 30 * time.Second

// FromEnv returns the tracer provider the standard OpenTelemetry variables
// ask for, as the stock binary reads them, and its shutdown (which flushes
// the spans still queued). Tracing is off (nil provider, nil error) unless
// OTEL_TRACES_EXPORTER is otlp, or unset while an OTLP endpoint
// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is
// set; OTEL_SDK_DISABLED=true turns it off. The exporter is OTLP over
// http/protobuf (the default) or grpc (OTEL_EXPORTER_OTLP_PROTOCOL or
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL); the service name is
// OTEL_SERVICE_NAME, else serviceName; the exporter, the batch processor
// and the sampler read the rest of their standard variables themselves.
// A value that makes no sense is an *EnvError. An endpoint that does not
// answer is no error: spans are dropped, never block a job, and logger
// gets a warning at most every 30 seconds.
func FromEnv(ctx context.Context, serviceName string, logger *slog.Logger) (trace.TracerProvider, func(context.Context) error, error) {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return nil, nil, nil
	}
	tracesEndpoint, endpoint := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	switch exporter := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")); exporter {
	case "none":
		return nil, nil, nil
	case "":
		if tracesEndpoint == "" && endpoint == "" {
			return nil, nil, nil
		}
	case "otlp":
	default:
		return nil, nil, &EnvError{Var: "OTEL_TRACES_EXPORTER", Value: exporter, Reason: "want otlp or none (sluice exports traces over OTLP only)"}
	}
	shown := ""
	for _, v := range []struct{ name, value string }{
		{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", tracesEndpoint}, {"OTEL_EXPORTER_OTLP_ENDPOINT", endpoint},
	} {
		if v.value == "" {
			continue
		}
		u, err := url.Parse(v.value)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, nil, &EnvError{Var: v.name, Value: redactURL(v.value), Reason: "want an http:// or https:// URL with a host, such as http://localhost:4318"}
		}
		if shown == "" {
			u.User = nil
			shown = u.String()
		}
	}
	protoVar, proto := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		protoVar, proto = "OTEL_EXPORTER_OTLP_PROTOCOL", os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var exp *otlptrace.Exporter
	var err error
	switch proto {
	case "", "http/protobuf":
		proto = "http/protobuf"
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, nil, &EnvError{Var: protoVar, Value: proto, Reason: "want http/protobuf or grpc"}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", serviceName)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
		resource.WithTelemetrySDK(),
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, nil, &EnvError{Var: "OTEL_RESOURCE_ATTRIBUTES", Value: os.Getenv("OTEL_RESOURCE_ATTRIBUTES"), Reason: err.Error()}
	}
	otel.SetErrorHandler(&warnHandler{logger: logger})
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	logger.Info("tracing on: spans go over OTLP", "protocol", proto, "endpoint", shown)
	return tp, tp.Shutdown, nil
}

// warnHandler logs OpenTelemetry's errors (a failed export) as warnings,
// at most one every exportWarnEvery.
type warnHandler struct {
	logger *slog.Logger
	mu     sync.Mutex
	last   time.Time
	missed int
}

// Handle logs err unless a warning went out recently.
func (h *warnHandler) Handle(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.last.IsZero() && time.Since(h.last) < exportWarnEvery {
		h.missed++
		return
	}
	h.logger.Warn("tracing: spans not exported (dropped; jobs go on)", "error", err, "errors_since_last_warning", h.missed)
	h.last, h.missed = time.Now(), 0
}

// redactURL hides the password of a URL.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	return u.Redacted()
}
