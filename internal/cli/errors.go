package cli

import (
	"errors"
	"fmt"
	"strings"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/kinds"
	"github.com/sluice-dev/sluice/limiter"
	"github.com/sluice-dev/sluice/module"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
	// exitReaped: a worker found itself declared dead by another worker
	// (app.ErrReaped); a supervisor should start a new one.
	exitReaped = app.ExitReaped
)

// usageError is bad usage or bad input: exit 2, and nothing was written.
type usageError = module.UsageError

// usagef returns a usage error.
func usagef(format string, args ...any) error {
	return &usageError{Err: fmt.Errorf(format, args...)}
}

// asUsage marks err as a usage error (nil stays nil).
func asUsage(err error) error {
	if err == nil {
		return nil
	}
	return &usageError{Err: err}
}

// exitCode maps an error to the process exit code.
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var usageErr *usageError
	var unknownKind *kinds.UnknownKindError
	var argsErr *kinds.ArgsError
	var silent *silentExit
	switch {
	case errors.As(err, &silent):
		return silent.code
	case errors.Is(err, app.ErrReaped):
		return exitReaped
	case isCobraUsage(err):
		return exitUsage
	case errors.As(err, &usageErr), errors.As(err, &unknownKind), errors.As(err, &argsErr),
		pgkit.IsURLError(err), errors.Is(err, limiter.ErrInvalidLimit):
		return exitUsage
	default:
		return exitFailure
	}
}

// isCobraUsage recognises the usage errors cobra itself returns (unknown
// command, before any of sluice's code runs).
func isCobraUsage(err error) bool {
	msg := err.Error()
	return strings.HasPrefix(msg, "unknown command ") || strings.HasPrefix(msg, "unknown flag") ||
		strings.HasPrefix(msg, "unknown shorthand flag")
}
