package module

import "fmt"

// UsageError is bad usage or bad input: the CLI exits 2, and nothing was
// written.
type UsageError struct {
	Err error
}

// Error describes the error.
func (e *UsageError) Error() string { return e.Err.Error() }

// Unwrap returns the underlying error.
func (e *UsageError) Unwrap() error { return e.Err }

// Usagef returns a *UsageError.
func Usagef(format string, args ...any) error {
	return &UsageError{Err: fmt.Errorf(format, args...)}
}
