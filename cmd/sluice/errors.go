package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/riverqueue/river/rivertype"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/jobs"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// usageError is bad usage or bad input: exit 2, and nothing was written.
type usageError struct {
	err error
}

func (e *usageError) Error() string { return e.err.Error() }

func (e *usageError) Unwrap() error { return e.err }

// usagef returns a usage error.
func usagef(format string, args ...any) error {
	return &usageError{err: fmt.Errorf(format, args...)}
}

// asUsage marks err as a usage error (nil stays nil).
func asUsage(err error) error {
	if err == nil {
		return nil
	}
	return &usageError{err: err}
}

// exitCode maps an error to the process exit code.
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var usageErr *usageError
	var unknownKind *jobs.UnknownKindError
	var argsErr *jobs.ArgsError
	var silent *silentExit
	switch {
	case errors.As(err, &silent):
		return silent.code
	case isCobraUsage(err):
		return exitUsage
	case errors.As(err, &usageErr), errors.As(err, &unknownKind), errors.As(err, &argsErr),
		db.IsURLError(err), errors.Is(err, rivertype.ErrNotFound):
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
