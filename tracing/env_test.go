package tracing_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/testlog"
	"github.com/sluice-dev/sluice/tracing"
)

// clearEnv unsets every variable FromEnv reads for the test.
func clearEnv(t *testing.T) {
	for _, v := range []string{"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
		"OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"} {
		t.Setenv(v, "")
	}
}

// TestFromEnvOff: without the variables, or with exporter none, tracing is
// off.
func TestFromEnvOff(t *testing.T) {
	for name, env := range map[string]map[string]string{
		"unset":    {},
		"none":     {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:4318"},
		"disabled": {"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"},
	} {
		t.Run(name, func(t *testing.T) {
			clearEnv(t)
			for k, v := range env {
				t.Setenv(k, v)
			}
			tp, shutdown, err := tracing.FromEnv(context.Background(), "sluice", slog.New(slog.DiscardHandler))
			require.NoError(t, err)
			require.Nil(t, tp)
			require.Nil(t, shutdown)
		})
	}
}

// TestFromEnvInvalid: a value that makes no sense is an *EnvError naming
// the variable (a password in an endpoint is not shown).
func TestFromEnvInvalid(t *testing.T) {
	for name, tc := range map[string]struct {
		env       map[string]string
		variable  string
		notInText string
	}{
		"exporter":        {map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER", ""},
		"endpoint":        {map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "localhost:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT", ""},
		"traces endpoint": {map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "ftp://u:hunter2@collector/"}, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "hunter2"},
		"protocol":        {map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL", ""},
	} {
		t.Run(name, func(t *testing.T) {
			clearEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			tp, _, err := tracing.FromEnv(context.Background(), "sluice", slog.New(slog.DiscardHandler))
			require.Nil(t, tp)
			var envErr *tracing.EnvError
			require.True(t, errors.As(err, &envErr), "%v", err)
			require.Equal(t, tc.variable, envErr.Var)
			require.Contains(t, err.Error(), "$"+tc.variable)
			if tc.notInText != "" {
				require.NotContains(t, err.Error(), tc.notInText)
			}
		})
	}
}

// TestFromEnvUnreachable: an endpoint that does not answer is no error:
// spans are made, dropped, and a warning is logged.
func TestFromEnvUnreachable(t *testing.T) {
	for _, proto := range []string{"http/protobuf", "grpc"} {
		t.Run(strings.ReplaceAll(proto, "/", "_"), func(t *testing.T) {
			clearEnv(t)
			t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", proto)
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
			t.Setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "200")
			t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "10")
			var logs testlog.Buffer
			logger := slog.New(slog.NewTextHandler(&logs, nil))
			tp, shutdown, err := tracing.FromEnv(context.Background(), "sluice", logger)
			require.NoError(t, err)
			require.NotNil(t, tp)
			require.Contains(t, logs.String(), "tracing on")
			start := time.Now()
			_, span := tp.Tracer("test").Start(context.Background(), "lost")
			span.End()
			require.Less(t, time.Since(start), 100*time.Millisecond, "a span never waits for the exporter")
			require.Eventually(t, func() bool { return strings.Contains(logs.String(), "spans not exported") },
				10*time.Second, 20*time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = shutdown(ctx)
		})
	}
}
