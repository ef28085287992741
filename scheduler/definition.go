package scheduler

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/riverqueue/river"

	"github.com/sluice-dev/sluice/kinds"
)

// Misfire policies: what a dispatch does when more than one due time has
// passed (the workers were down, or the schedule was retrying).
const (
	// MisfireRunOnce (the default) collapses the missed due times into one
	// run, for the latest of them.
	MisfireRunOnce = "run_once"
	// MisfireSkip runs the latest due time only if it is not older than the
	// scheduler.misfire_grace setting, and otherwise nothing: the schedule
	// goes on at its next future time.
	MisfireSkip = "skip"
	// MisfireRunAll runs every missed due time, at most the
	// scheduler.run_all_cap setting of them (the most recent ones).
	MisfireRunAll = "run_all"
)

// Schedule statuses (schedules.status).
const (
	StatusActive = "active"
	StatusFailed = "failed"
)

// Defaults of a Definition.
const (
	DefaultTimezone   = "UTC"
	DefaultMisfire    = MisfireRunOnce
	DefaultMaxRetries = 5
	// MaxMaxRetries bounds max_retries.
	MaxMaxRetries = 1000
)

// Definition is a schedule as an operator writes it.
type Definition struct {
	// Name identifies the schedule: letters, digits, _ . : -, at most 128.
	Name string
	// Cron is the expression: 5 fields, 6 with seconds, or a descriptor.
	Cron string
	// Timezone is the IANA zone the expression is read in (default UTC).
	Timezone string
	// Kind is the River job kind to insert.
	Kind string
	// Args are the job args, a JSON object valid for Kind (default {}).
	Args json.RawMessage
	// Queue overrides the kind's queue; empty keeps the kind's.
	Queue string
	// Misfire is run_once (default), skip or run_all.
	Misfire string
	// MaxRetries is how many times a failed dispatch is retried before the
	// schedule is marked failed (0: the first failure marks it failed; the
	// CLI's and the table's default is DefaultMaxRetries).
	MaxRetries int
	// Enabled schedules are dispatched.
	Enabled bool
}

// Compiled is a validated Definition with its parsed cron and decoded args.
type Compiled struct {
	Definition
	Cron    *Cron
	JobArgs river.JobArgs
}

// FieldError reports an invalid field of a schedule, naming the field and
// the reason. It wraps the underlying error (such as *kinds.UnknownKindError).
type FieldError struct {
	// Field is the schedule field: name, cron, timezone, kind, args, queue,
	// misfire or max_retries.
	Field string
	// Value is the rejected value, quoted in the message; empty for args.
	Value  string
	Reason string
	Err    error
}

// Error describes the error.
func (e *FieldError) Error() string {
	if e.Field == "args" {
		return fmt.Sprintf("invalid args: %s", e.Reason)
	}
	return fmt.Sprintf("invalid %s %q: %s", e.Field, e.Value, e.Reason)
}

// Unwrap returns the underlying error.
func (e *FieldError) Unwrap() error { return e.Err }

var (
	nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$`)
	// queueRE is River's rule for queue names (river.validateQueueName).
	queueRE = regexp.MustCompile(`^(?:[a-z0-9])+(?:[_|\-]?[a-z0-9]+)*$`)
)

// Validate checks every field of d (name first, then cron and timezone,
// kind, args, queue, misfire, max_retries) and returns the first problem
// as a *FieldError. Empty Timezone, Args and Misfire take their defaults.
func Validate(registry *kinds.Registry, d Definition) (*Compiled, error) {
	if !nameRE.MatchString(d.Name) {
		return nil, &FieldError{Field: "name", Value: d.Name,
			Reason: "want 1 to 128 letters, digits, _ . : or -, starting with a letter or digit"}
	}
	return compile(registry, d)
}

// compile validates everything but the name (the dispatcher's check of a
// stored row, whose name the table's CHECK constraint guards).
func compile(registry *kinds.Registry, d Definition) (*Compiled, error) {
	if d.Timezone == "" {
		d.Timezone = DefaultTimezone
	}
	if d.Misfire == "" {
		d.Misfire = DefaultMisfire
	}
	if len(d.Args) == 0 {
		d.Args = json.RawMessage("{}")
	}
	c, err := ParseCron(d.Cron, d.Timezone)
	if err != nil {
		var cronErr *CronError
		if errors.As(err, &cronErr) {
			return nil, &FieldError{Field: cronErr.Field, Value: cronErr.Value, Reason: cronErr.Reason, Err: err}
		}
		return nil, err
	}
	d.Cron = c.String()
	jobArgs, err := decodeArgs(registry, d.Kind, d.Args)
	if err != nil {
		return nil, err
	}
	if d.Queue != "" {
		if err := checkQueue(d.Queue); err != nil {
			return nil, err
		}
	}
	switch d.Misfire {
	case MisfireRunOnce, MisfireSkip, MisfireRunAll:
	default:
		return nil, &FieldError{Field: "misfire", Value: d.Misfire, Reason: "want run_once, skip or run_all"}
	}
	if d.MaxRetries < 0 || d.MaxRetries > MaxMaxRetries {
		return nil, &FieldError{Field: "max_retries", Value: fmt.Sprint(d.MaxRetries),
			Reason: fmt.Sprintf("want 0 to %d", MaxMaxRetries)}
	}
	return &Compiled{Definition: d, Cron: c, JobArgs: jobArgs}, nil
}

// decodeArgs decodes args strictly for kind with the registry.
func decodeArgs(registry *kinds.Registry, kind string, args json.RawMessage) (river.JobArgs, error) {
	jobArgs, err := registry.Decode(kind, args)
	var unknown *kinds.UnknownKindError
	var argsErr *kinds.ArgsError
	switch {
	case err == nil:
		return jobArgs, nil
	case errors.As(err, &unknown):
		return nil, &FieldError{Field: "kind", Value: kind,
			Reason: "not a job kind this binary knows (known kinds: " + strings.Join(unknown.Known, ", ") + ")", Err: err}
	case errors.As(err, &argsErr):
		return nil, &FieldError{Field: "args", Reason: fmt.Sprintf("for %s: %v", kind, argsErr.Err), Err: err}
	default:
		return nil, &FieldError{Field: "args", Reason: err.Error(), Err: err}
	}
}

// checkQueue applies River's rule for queue names.
func checkQueue(queue string) error {
	if len(queue) > 64 || !queueRE.MatchString(queue) {
		return &FieldError{Field: "queue", Value: queue,
			Reason: "want lowercase letters and digits separated by _ or -, at most 64 characters"}
	}
	return nil
}
