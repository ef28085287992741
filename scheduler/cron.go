package scheduler

import (
	"errors"
	"fmt"
	"strings"
	"time"
	_ "time/tzdata" // IANA zones even on hosts without /usr/share/zoneinfo
)

// Cron is a parsed cron expression in a time zone. Its due times are
// computed as follows, which matters on the days a zone changes its UTC
// offset (daylight-saving time, or a change of standard time):
//
//   - @every D: every D of elapsed time from the previous due time, whatever
//     the clocks do.
//   - Expressions that match every hour (`* * * * *`, `0 * * * *`,
//     `*/15 * * * *`, `@hourly`, 6-field expressions with every hour): real
//     time. They run at each instant whose local time matches, so a local
//     time the clocks skip has no run and one they repeat runs twice (an
//     hourly job runs 23 times on the spring-forward day and 25 times on
//     the fall-back day, one hour of real time apart).
//   - Expressions that name their hours (`30 2 * * *`, `*/15 2 * * *`,
//     `@daily`, `0 9-17 * * 1-5`): wall-clock time, each matching local
//     time once. A local time the clocks skip runs the same distance after
//     the jump (on a day that jumps from 02:00 to 03:00, 02:30 runs at 03:30
//     and `*/15 2 * * *` at 03:00, 03:15, 03:30 and 03:45); a local time the
//     clocks repeat runs once, at its first occurrence. Two local times
//     that land on the same instant run once.
//
// Next searches as far ahead as it takes (29 February 2096 is followed by
// 29 February 2104): an expression that parses always has a next time.
type Cron struct {
	expr  string
	loc   *time.Location
	spec  *cronSpec // nil for @every
	every time.Duration
	// wall selects wall-clock semantics (the hour field names hours).
	wall bool
}

// CronError reports an invalid cron expression or time zone. Field is
// "cron" or "timezone".
type CronError struct {
	Field  string
	Value  string
	Reason string
}

// Error describes the error.
func (e *CronError) Error() string {
	return fmt.Sprintf("invalid %s %q: %s", e.Field, e.Value, e.Reason)
}

// calendarCycle is the period of the Gregorian calendar: every pattern of
// dates, leap days and weekdays repeats after 400 years. An expression
// that matches no date in one cycle never fires; one that does matches at
// least once in every cycle.
const calendarCycle = 400

// ParseCron parses expr in the IANA time zone tz. It accepts 5 fields
// (minute hour day-of-month month day-of-week), 6 with a leading seconds
// field, and the descriptors @yearly (@annually), @monthly, @weekly, @daily
// (@midnight), @hourly and @every DURATION. Fields hold lists of *, V, A-B,
// each with an optional /STEP, and N/STEP (N to the end of the field); month
// and weekday names (jan, mon); 7 for Sunday as well as 0; and in the day
// fields ? (any day, as *), L (the last day of the month, day-of-month
// only) and N#k (the k-th weekday N of the month, day-of-week only).
//
// Errors are *CronError values naming the field (cron or timezone) and the
// reason; for a cron expression the reason names the cron field at fault.
func ParseCron(expr, tz string) (*Cron, error) {
	loc, err := LoadZone(tz)
	if err != nil {
		return nil, err
	}
	bad := func(format string, args ...any) error {
		return &CronError{Field: "cron", Value: expr, Reason: fmt.Sprintf(format, args...)}
	}
	trimmed := strings.TrimSpace(expr)
	switch {
	case trimmed == "":
		return nil, bad("empty expression: want 5 fields (minute hour day-of-month month day-of-week), 6 with a leading seconds field, or a descriptor such as @hourly or @every 5m")
	case strings.HasPrefix(trimmed, "TZ=") || strings.HasPrefix(trimmed, "CRON_TZ="):
		return nil, bad("time zone prefixes are not supported: set the timezone field (--tz) instead")
	case trimmed == "@every" || strings.HasPrefix(trimmed, "@every ") || strings.HasPrefix(trimmed, "@every\t"):
		rest := strings.TrimSpace(strings.TrimPrefix(trimmed, "@every"))
		d, perr := time.ParseDuration(rest)
		switch {
		case rest == "":
			return nil, bad("@every needs a duration, such as @every 5s or @every 1h30m")
		case perr != nil:
			return nil, bad("@every: %q is not a duration (want e.g. 5s, 10m, 1h30m)", rest)
		case d < time.Second:
			return nil, bad("@every: the interval must be at least 1s, got %s", d)
		case d%time.Second != 0:
			return nil, bad("@every: the interval must be a whole number of seconds, got %s", d)
		}
		return &Cron{expr: trimmed, loc: loc, every: d}, nil
	case strings.HasPrefix(trimmed, "@"):
		fields, ok := descriptorFields(trimmed)
		if !ok {
			return nil, bad("unknown descriptor: want @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly or @every DURATION")
		}
		spec, err := parseSpec(strings.Fields(fields))
		if err != nil {
			return nil, fmt.Errorf("scheduler: descriptor %s: %w", trimmed, err)
		}
		return &Cron{expr: trimmed, loc: loc, spec: spec, wall: !spec.everyHour()}, nil
	}

	fields := strings.Fields(trimmed)
	if len(fields) != 5 && len(fields) != 6 {
		return nil, bad("want 5 fields (minute hour day-of-month month day-of-week) or 6 with a leading seconds field, got %d", len(fields))
	}
	spec, err := parseSpec(fields)
	if err != nil {
		return nil, bad("%v", err)
	}
	// An expression that matches no date (such as 0 0 30 2 *) never fires.
	epoch := time.Date(2000, time.January, 1, 0, 0, 0, 0, time.UTC)
	if _, ok := spec.next(epoch, epoch.AddDate(calendarCycle, 0, 1)); !ok {
		return nil, bad("never fires: no date matches its day-of-month, month and day-of-week fields")
	}
	return &Cron{expr: trimmed, loc: loc, spec: spec, wall: !spec.everyHour()}, nil
}

// descriptorFields returns the 6 fields a descriptor other than @every
// stands for.
func descriptorFields(name string) (string, bool) {
	switch name {
	case "@yearly", "@annually":
		return "0 0 0 1 1 *", true
	case "@monthly":
		return "0 0 0 1 * *", true
	case "@weekly":
		return "0 0 0 * * 0", true
	case "@daily", "@midnight":
		return "0 0 0 * * *", true
	case "@hourly":
		return "0 0 * * * *", true
	}
	return "", false
}

// LoadZone loads an IANA time zone such as UTC or Europe/Berlin. The empty
// name and "Local" (the host's zone) are rejected: a schedule must mean the
// same on every host.
func LoadZone(tz string) (*time.Location, error) {
	bad := func(reason string) error { return &CronError{Field: "timezone", Value: tz, Reason: reason} }
	switch tz {
	case "":
		return nil, bad("empty: want an IANA time zone such as UTC or America/New_York")
	case "Local", "local":
		return nil, bad("the host's local zone differs between hosts: want an IANA time zone such as UTC or America/New_York")
	}
	loc, err := time.LoadLocation(tz)
	if err != nil {
		return nil, bad("unknown time zone: want an IANA name such as UTC or America/New_York")
	}
	return loc, nil
}

// String is the expression as parsed.
func (c *Cron) String() string { return c.expr }

// Location is the schedule's time zone.
func (c *Cron) Location() *time.Location { return c.loc }

// Next returns the first due time strictly after t, in the schedule's zone.
// It is the zero time only past the end of time.Time's range.
func (c *Cron) Next(t time.Time) time.Time {
	if c.spec == nil {
		// Whole seconds from the previous due time.
		return t.Truncate(time.Second).Add(c.every)
	}
	// Walk the zone's stretches of constant offset from the one holding
	// t. A validated expression matches within every calendar cycle.
	horizon := t.AddDate(calendarCycle+1, 0, 0)
	for seg := zoneSegmentAt(t.In(c.loc)); ; {
		if at, ok := c.nextIn(seg, t, horizon); ok {
			return at.In(c.loc)
		}
		if seg.end.IsZero() || !seg.end.Before(horizon) {
			return time.Time{}
		}
		seg = zoneSegmentAt(seg.end)
	}
}

// scanLimit bounds how many due times one dispatch walks through one by one
// (a per-second schedule after a long downtime).
const scanLimit = 10_000

// errNoFutureTime reports an expression with no due time left.
var errNoFutureTime = errors.New("no due time left before the end of time")

// DueTimes returns the due times of c in [first, now]: first itself (the
// row's due time, which need not be a cron time) and every cron time after
// it up to now. It returns the newest at most k of them, oldest first, and
// their total count; exact is false when there were more than scanLimit and
// total is only a lower bound.
func (c *Cron) DueTimes(first, now time.Time, k int) (newest []time.Time, total int, exact bool) {
	if first.After(now) || k < 1 {
		return nil, 0, true
	}
	ring := newRing(k)
	t := first
	for !t.IsZero() && !t.After(now) {
		if total == scanLimit {
			return c.newestBefore(first, now, k), total, false
		}
		ring.push(t)
		total++
		t = c.Next(t)
	}
	return ring.items(), total, true
}

// newestBefore finds the newest k due times in [first, now] when there are
// too many to walk: it walks only a window before now, widened until it
// holds k due times (or reaches back to first).
func (c *Cron) newestBefore(first, now time.Time, k int) []time.Time {
	if c.spec == nil {
		// @every: arithmetic from first.
		n := now.Sub(first) / c.every
		last := first.Add(n * c.every)
		out := make([]time.Time, 0, k)
		for i := k - 1; i >= 0; i-- {
			if t := last.Add(-time.Duration(i) * c.every); !t.Before(first) {
				out = append(out, t)
			}
		}
		return out
	}
	window := time.Duration(k) * time.Minute
	for range 60 {
		from := now.Add(-window)
		ring := newRing(k)
		t := c.Next(from.Add(-time.Nanosecond))
		if !from.After(first) {
			from, t = first, first
		}
		n, reachedNow := 0, true
		for ; !t.IsZero() && !t.After(now); t = c.Next(t) {
			if n == 4*scanLimit {
				reachedNow = false
				break
			}
			ring.push(t)
			n++
		}
		switch {
		case !reachedNow:
			window /= 4
		case n >= k || from.Equal(first):
			return ring.items()
		default:
			window *= 4
		}
	}
	return nil
}

// After returns the first due time of c after now, continuing the cadence
// from first (for @every, first + n*D; for cron expressions, Next(now)).
func (c *Cron) After(first, now time.Time) (time.Time, error) {
	var next time.Time
	if c.spec == nil {
		if first.After(now) {
			return first, nil
		}
		n := now.Sub(first)/c.every + 1
		next = first.Add(n * c.every)
	} else {
		next = c.Next(now)
	}
	if next.IsZero() {
		return next, errNoFutureTime
	}
	return next, nil
}

// ring keeps the last k pushed times.
type ring struct {
	buf  []time.Time
	next int
	full bool
}

func newRing(k int) *ring { return &ring{buf: make([]time.Time, k)} }

func (r *ring) push(t time.Time) {
	r.buf[r.next] = t
	r.next = (r.next + 1) % len(r.buf)
	if r.next == 0 {
		r.full = true
	}
}

func (r *ring) items() []time.Time {
	if !r.full {
		return append([]time.Time(nil), r.buf[:r.next]...)
	}
	return append(append([]time.Time(nil), r.buf[r.next:]...), r.buf[:r.next]...)
}
