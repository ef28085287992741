package policy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/kinds"
)

// OnConflict is what an insert does when its key already has MaxWaiting
// jobs waiting.
type OnConflict string

// The conflict answers (enqueue_policies.on_conflict).
const (
	// Discard does not insert the new job; River's client answers with the
	// waiting job (UniqueSkippedAsDuplicate).
	Discard OnConflict = "discard"
	// Replace gives the newest waiting job the new args and scheduled_at
	// (its own scheduled_at with Policy.KeepScheduledAt); it keeps its id,
	// attempts and place in any line.
	Replace OnConflict = "replace"
	// Debounce replaces, and moves scheduled_at to now + Debounce, never
	// past the job's first waiting time + MaxDelay.
	Debounce OnConflict = "debounce"
	// Reject fails the insert with SQLSTATE SLR01.
	Reject OnConflict = "reject"
)

// Limits of a policy's fields.
const (
	// MaxByArgs is the most args fields a key may be made of.
	MaxByArgs = 8
	// MaxMaxWaiting is the largest cap.
	MaxMaxWaiting = 1_000_000
	// MinDebounce is the shortest debounce (durations are whole
	// milliseconds).
	MinDebounce = time.Millisecond
)

// ErrInvalid marks a policy that may not be written: bad input.
var ErrInvalid = errors.New("invalid enqueue policy")

// Policy is the enqueue policy of one job kind.
type Policy struct {
	// Kind is the job kind.
	Kind string
	// ByArgs keys the kind's waiting jobs by top-level args fields (JSON
	// names), as limits' --by-args do (nil: one key for the whole kind).
	ByArgs []string
	// MaxWaiting caps the waiting jobs of a key (available, scheduled,
	// retryable, pending; running never counts): at least 1.
	MaxWaiting int32
	// OnConflict is what an insert does when the cap is reached.
	OnConflict OnConflict
	// Debounce (with OnConflict Debounce only) is the quiet period: a
	// debounced job is due Debounce after its last enqueue.
	Debounce time.Duration
	// MaxDelay (with Debounce) bounds the wait: a job is never due later
	// than its first waiting time + MaxDelay, however many enqueues follow.
	MaxDelay time.Duration
	// KeepScheduledAt (with OnConflict Replace only): the waiting job keeps
	// its own scheduled_at and takes only the new args.
	KeepScheduledAt bool
}

// String describes the policy as `policy set` takes it.
func (p Policy) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "max %d waiting", p.MaxWaiting)
	if len(p.ByArgs) > 0 {
		fmt.Fprintf(&b, " per %s", strings.Join(p.ByArgs, ","))
	}
	fmt.Fprintf(&b, ", on conflict %s", p.OnConflict)
	if p.OnConflict == Debounce {
		fmt.Fprintf(&b, " %s (max delay %s)", p.Debounce, p.MaxDelay)
	}
	if p.KeepScheduledAt {
		b.WriteString(", keeping the waiting job's scheduled_at")
	}
	return b.String()
}

// Validate checks the policy against the program's kinds (registry nil:
// the kind is not looked up). Its errors wrap ErrInvalid.
func (p Policy) Validate(registry *kinds.Registry) error {
	if p.Kind == "" {
		return invalidf("a policy needs a kind")
	}
	if registry != nil {
		k, err := registry.Lookup(p.Kind)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		if err := validateByArgs(k, p.ByArgs, true); err != nil {
			return err
		}
	} else if err := validateByArgs(kinds.Kind{Name: p.Kind}, p.ByArgs, false); err != nil {
		return err
	}
	if p.MaxWaiting < 1 || p.MaxWaiting > MaxMaxWaiting {
		return invalidf("policy of %s: max waiting %d: want 1 to %d", p.Kind, p.MaxWaiting, MaxMaxWaiting)
	}
	if p.KeepScheduledAt && p.OnConflict != Replace {
		return invalidf("policy of %s: --keep-scheduled-at goes with --on-conflict replace only", p.Kind)
	}
	switch p.OnConflict {
	case Discard, Replace, Reject:
		if p.Debounce != 0 || p.MaxDelay != 0 {
			return invalidf("policy of %s: --debounce and --max-delay go with --on-conflict debounce only", p.Kind)
		}
	case Debounce:
		if p.Debounce < MinDebounce || p.Debounce%time.Millisecond != 0 {
			return invalidf("policy of %s: debounce %s: want a positive whole number of milliseconds", p.Kind, p.Debounce)
		}
		if p.MaxDelay < p.Debounce || p.MaxDelay%time.Millisecond != 0 {
			return invalidf("policy of %s: max delay %s: want whole milliseconds, at least the debounce (%s)", p.Kind, p.MaxDelay, p.Debounce)
		}
	default:
		return invalidf("policy of %s: on conflict %q: want discard, replace, debounce or reject", p.Kind, string(p.OnConflict))
	}
	return nil
}

// validateByArgs checks the key's fields (strict: against k's args
// fields).
func validateByArgs(k kinds.Kind, fields []string, strict bool) error {
	if len(fields) > MaxByArgs {
		return invalidf("--by-args of %s: want at most %d args fields, got %d", k.Name, MaxByArgs, len(fields))
	}
	have := k.ArgsFields()
	for i, f := range fields {
		if f == "" {
			return invalidf("--by-args of %s: an empty field name", k.Name)
		}
		if slices.Contains(fields[:i], f) {
			return invalidf("--by-args of %s: field %q given twice", k.Name, f)
		}
		if strict && !slices.Contains(have, f) {
			return invalidf("--by-args of %s: its args have no field %q (they have: %s)", k.Name, f, strings.Join(have, ", "))
		}
	}
	return nil
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}
