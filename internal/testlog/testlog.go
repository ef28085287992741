// Package testlog gives tests a logger: quiet unless SLUICE_TEST_LOG is set.
package testlog

import (
	"log/slog"
	"os"
	"testing"
)

// Logger is a test logger: quiet unless SLUICE_TEST_LOG is set, then debug
// lines on stderr tagged with the test's name.
func Logger(tb testing.TB) *slog.Logger {
	tb.Helper()
	if os.Getenv("SLUICE_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", tb.Name())
}
