// Package kinds is the registry of the job kinds a sluice program works: the
// kinds of the application's own River workers, of sluice's core and of the
// modules it turns on. Every command that takes a kind (enqueue, run,
// schedule, limits) looks it up here and decodes its args strictly into the
// kind's args type.
package kinds

import (
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"

	"github.com/riverqueue/river"
)

// Validator is implemented by job args that check their own values after
// decoding. Its error names the first invalid field.
type Validator interface {
	Validate() error
}

// RegistryValidator is implemented by job args whose values name other
// kinds (concurrency_limit.resume's "kind"): they are checked against the
// registry after Validate.
type RegistryValidator interface {
	ValidateIn(r *Registry) error
}

// Kind is one job kind the program knows how to work.
type Kind struct {
	// Name is the River job kind, such as "demo.sleep".
	Name string
	// ArgsType is the kind's args type (a struct, or a pointer to one).
	ArgsType reflect.Type
}

// Of returns the Kind of the args type T.
func Of[T river.JobArgs]() Kind {
	var zero T
	return Kind{Name: zero.Kind(), ArgsType: reflect.TypeFor[T]()}
}

// UnknownKindError reports a job kind the program does not know.
type UnknownKindError struct {
	Kind  string
	Known []string
}

// Error describes the error.
func (e *UnknownKindError) Error() string {
	return fmt.Sprintf("unknown job kind %q (known kinds: %s)", e.Kind, strings.Join(e.Known, ", "))
}

// ArgsError reports job args that are not valid for their kind.
type ArgsError struct {
	Kind string
	Err  error
}

// Error describes the error.
func (e *ArgsError) Error() string { return fmt.Sprintf("invalid args for %s: %v", e.Kind, e.Err) }

// Unwrap returns the underlying error.
func (e *ArgsError) Unwrap() error { return e.Err }

// DuplicateKindError reports a kind registered twice.
type DuplicateKindError struct {
	Kind string
}

// Error describes the error.
func (e *DuplicateKindError) Error() string {
	return fmt.Sprintf("job kind %q is registered twice", e.Kind)
}

// Registry is the set of job kinds a program knows.
type Registry struct {
	kinds map[string]Kind
}

// New returns a registry of kinds; a kind listed twice is a
// *DuplicateKindError.
func New(kinds ...Kind) (*Registry, error) {
	r := &Registry{kinds: make(map[string]Kind, len(kinds))}
	for _, k := range kinds {
		if err := r.add(k); err != nil {
			return nil, err
		}
	}
	return r, nil
}

func (r *Registry) add(k Kind) error {
	if k.Name == "" || k.ArgsType == nil {
		return errors.New("kinds: a kind needs a name and an args type")
	}
	if _, ok := r.kinds[k.Name]; ok {
		return &DuplicateKindError{Kind: k.Name}
	}
	r.kinds[k.Name] = k
	return nil
}

// Lookup returns the kind named name, or an *UnknownKindError.
func (r *Registry) Lookup(name string) (Kind, error) {
	k, ok := r.kinds[name]
	if !ok {
		return Kind{}, &UnknownKindError{Kind: name, Known: r.Names()}
	}
	return k, nil
}

// Has reports whether the registry knows the kind name.
func (r *Registry) Has(name string) bool {
	_, ok := r.kinds[name]
	return ok
}

// Decode looks up kind and decodes raw args for it: strictly (a JSON object,
// no unknown fields, no trailing data), then the args' Validate and
// ValidateIn when they have them. An empty raw value means {}.
func (r *Registry) Decode(kind string, raw []byte) (river.JobArgs, error) {
	k, err := r.Lookup(kind)
	if err != nil {
		return nil, err
	}
	ptr := reflect.New(k.ArgsType)
	if err := decodeStrict(raw, ptr.Interface()); err != nil {
		return nil, &ArgsError{Kind: kind, Err: err}
	}
	value := ptr.Elem().Interface()
	for _, v := range []any{value, ptr.Interface()} {
		if val, ok := v.(Validator); ok {
			if err := val.Validate(); err != nil {
				return nil, &ArgsError{Kind: kind, Err: err}
			}
			break
		}
	}
	for _, v := range []any{value, ptr.Interface()} {
		if val, ok := v.(RegistryValidator); ok {
			if err := val.ValidateIn(r); err != nil {
				return nil, &ArgsError{Kind: kind, Err: err}
			}
			break
		}
	}
	args, ok := value.(river.JobArgs)
	if !ok {
		return nil, fmt.Errorf("kinds: args type %s of %s is not river.JobArgs", k.ArgsType, kind)
	}
	return args, nil
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

// DefaultQueue is the queue a job of the kind goes to unless its insert
// says otherwise: its args' InsertOpts().Queue, else River's default queue.
func (k Kind) DefaultQueue() string {
	if withOpts, ok := reflect.Zero(k.ArgsType).Interface().(river.JobArgsWithInsertOpts); ok {
		if q := withOpts.InsertOpts().Queue; q != "" {
			return q
		}
	}
	return river.QueueDefault
}

// ArgsFields returns the top-level JSON field names of the kind's args, as
// encoding/json names them (embedded structs' fields promoted), sorted.
func (k Kind) ArgsFields() []string {
	t := k.ArgsType
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() != reflect.Struct {
		return nil
	}
	fields := jsonFields(t)
	out := make([]string, 0, len(fields))
	for name := range fields {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}
