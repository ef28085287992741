package jobs

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/riverqueue/river"
)

// ValidArgs is job args that can check their own values after decoding.
type ValidArgs interface {
	river.JobArgs
	// Validate reports the first invalid field, naming it.
	Validate() error
}

// Kind describes a job kind this binary knows how to work.
type Kind struct {
	// Name is the River job kind, e.g. "demo.sleep".
	Name string
	// Description is a one-line summary for help texts.
	Description string
	// Maintenance kinds run under the maintenance-run framework.
	Maintenance bool

	decode    func(raw []byte) (river.JobArgs, error)
	addWorker func(workers *river.Workers, deps *Deps) error
}

// Decode parses raw JSON args strictly (a JSON object, no unknown fields, no
// trailing data, values in range) into the kind's args type. An empty raw
// value means {}.
func (k Kind) Decode(raw []byte) (river.JobArgs, error) {
	return k.decode(raw)
}

// UnknownKindError reports a job kind this binary does not know.
type UnknownKindError struct {
	Kind  string
	Known []string
}

func (e *UnknownKindError) Error() string {
	return fmt.Sprintf("unknown job kind %q (known kinds: %s)", e.Kind, strings.Join(e.Known, ", "))
}

// ArgsError reports job args that are not valid for their kind.
type ArgsError struct {
	Kind string
	Err  error
}

func (e *ArgsError) Error() string { return fmt.Sprintf("invalid args for %s: %v", e.Kind, e.Err) }

func (e *ArgsError) Unwrap() error { return e.Err }

// Registry is the set of job kinds this binary knows.
type Registry struct {
	kinds map[string]Kind
}

// NewRegistry returns the registry of every built-in job kind: the one list
// that decides which kinds the CLI accepts and which workers a client runs.
func NewRegistry() *Registry {
	r := &Registry{kinds: map[string]Kind{}}
	addKind(r, false, "sleep ms milliseconds; a canary for smoke tests and benchmarks",
		func(d *Deps) river.Worker[DemoSleepArgs] { return &DemoSleepWorker{deps: d} })
	addKind(r, false, "resume jobs parked by concurrency limits (all kinds, or {\"kind\": K})",
		func(d *Deps) river.Worker[ConcurrencyLimitResumeArgs] { return &ConcurrencyLimitResumeWorker{deps: d} })
	addKind(r, false, "count jobs still running long after their cancellation, per kind (periodic monitor, no maintenance lock)",
		newTaskCancellationMonitorWorker)
	addKind(r, false, "export a project's ci_builds to a gzip'd NDJSON archive (sluice export)",
		func(d *Deps) river.Worker[ExportProjectArgs] { return &ExportProjectWorker{deps: d} })
	addKind(r, true, "mark failed the project exports whose River job finished or is gone",
		func(d *Deps) river.Worker[ExportStuckJobsArgs] { return &ExportStuckJobsWorker{deps: d} })
	addKind(r, true, "fail builds stuck in canceling for ci.drop_canceling_builds.timeout (stuck_or_timeout_failure)",
		func(d *Deps) river.Worker[CIDropCancelingBuildsArgs] { return &CIDropCancelingBuildsWorker{deps: d} })
	addKind(r, true, "fail builds stuck in running for ci.drop_running_builds.timeout (stuck_or_timeout_failure)",
		func(d *Deps) river.Worker[CIDropRunningBuildsArgs] { return &CIDropRunningBuildsWorker{deps: d} })
	addKind(r, true, "fail scheduled builds overdue by ci.drop_scheduled_builds.timeout (stale_schedule)",
		func(d *Deps) river.Worker[CIDropScheduledBuildsArgs] { return &CIDropScheduledBuildsWorker{deps: d} })
	addKind(r, true, "fail builds stuck in pending for ci.drop_pending_builds.timeout (stuck_or_timeout_failure)",
		func(d *Deps) river.Worker[CIDropPendingBuildsArgs] { return &CIDropPendingBuildsWorker{deps: d} })
	return r
}

// addKind registers the args type T under its Kind(), worked by the worker
// newWorker builds.
func addKind[T ValidArgs](r *Registry, maintenance bool, description string, newWorker func(*Deps) river.Worker[T]) {
	var zero T
	name := zero.Kind()
	r.kinds[name] = Kind{
		Name:        name,
		Description: description,
		Maintenance: maintenance,
		decode: func(raw []byte) (river.JobArgs, error) {
			var args T
			if err := decodeStrict(raw, &args); err != nil {
				return nil, &ArgsError{Kind: name, Err: err}
			}
			if err := args.Validate(); err != nil {
				return nil, &ArgsError{Kind: name, Err: err}
			}
			return args, nil
		},
		addWorker: func(workers *river.Workers, deps *Deps) error {
			return river.AddWorkerSafely(workers, newWorker(deps))
		},
	}
}

// Lookup returns the kind named name, or an *UnknownKindError.
func (r *Registry) Lookup(name string) (Kind, error) {
	k, ok := r.kinds[name]
	if !ok {
		return Kind{}, &UnknownKindError{Kind: name, Known: r.Names()}
	}
	return k, nil
}

// Decode looks up kind and decodes raw args for it.
func (r *Registry) Decode(kind string, raw []byte) (river.JobArgs, error) {
	k, err := r.Lookup(kind)
	if err != nil {
		return nil, err
	}
	return k.Decode(raw)
}

// Names lists the known kinds, sorted.
func (r *Registry) Names() []string {
	names := make([]string, 0, len(r.kinds))
	for name := range r.kinds {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// Kinds lists the known kinds, sorted by name.
func (r *Registry) Kinds() []Kind {
	out := make([]Kind, 0, len(r.kinds))
	for _, name := range r.Names() {
		out = append(out, r.kinds[name])
	}
	return out
}

// decodeStrict decodes a JSON object into dst, rejecting anything else.
func decodeStrict(raw []byte, dst any) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		raw = []byte("{}")
	}
	if raw[0] != '{' {
		return errors.New("args must be a JSON object, such as {}")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return describeJSONError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("malformed JSON: unexpected data after the args object")
	}
	return nil
}

func describeJSONError(err error) error {
	var syntaxErr *json.SyntaxError
	var typeErr *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syntaxErr):
		return fmt.Errorf("malformed JSON at byte %d: %v", syntaxErr.Offset, syntaxErr)
	case errors.As(err, &typeErr):
		if typeErr.Field != "" {
			return fmt.Errorf("field %q: want %s, got JSON %s", typeErr.Field, typeErr.Type, typeErr.Value)
		}
		return fmt.Errorf("want %s, got JSON %s", typeErr.Type, typeErr.Value)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errors.New("malformed JSON: unexpected end of input")
	case strings.HasPrefix(err.Error(), "json: unknown field"):
		return fmt.Errorf("unknown field %s", strings.TrimPrefix(err.Error(), "json: unknown field "))
	default:
		return fmt.Errorf("malformed JSON: %v", err)
	}
}
