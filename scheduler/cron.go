package scheduler

import (
	"errors"
	"fmt"
	"strings"
	"time"
	_ "time/tzdata" // IANA zones even on hosts without /usr/share/zoneinfo

	"github.com/robfig/cron/v3"
)

// cronParser accepts 5 fields (minute hour day-of-month month day-of-week),
// 6 fields with a leading seconds field, and descriptors (@yearly,
// @annually, @monthly, @weekly, @daily, @midnight, @hourly, @every D).
var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// allHours is the bit set of a cron hour field that matches every hour.
const allHours = 1<<24 - 1

// Cron is a parsed cron expression in a time zone. Its times are computed as
// follows, which matters on the days a zone changes between standard and
// daylight-saving time:
//
//   - @every D: every D of elapsed time from the previous due time, whatever
//     the clocks do.
//   - Expressions that match every hour (`* * * * *`, `0 * * * *`,
//     `*/15 * * * *`, `@hourly`, 6-field expressions with every hour): real
//     time. An hour the clocks skip has no runs; an hour the clocks repeat
//     runs twice (an hourly job runs 23 times on the spring-forward day and
//     25 times on the fall-back day, one hour of real time apart).
//   - Expressions that name their hours (`30 2 * * *`, `0 0 * * *`,
//     `@daily`, `0 9-17 * * 1-5`): wall-clock time, each matching local time
//     once. A local time the clocks skip runs at the same offset after the
//     gap (02:30 on a day that jumps from 02:00 to 03:00 runs at 03:30); a
//     local time the clocks repeat runs once, at its first occurrence.
type Cron struct {
	expr  string
	loc   *time.Location
	spec  *cron.SpecSchedule // nil for @every
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

// cronFieldNames names the fields of a 5- and a 6-field expression.
var cronFieldNames = map[int][]string{
	5: {"minute", "hour", "day-of-month", "month", "day-of-week"},
	6: {"second", "minute", "hour", "day-of-month", "month", "day-of-week"},
}

// ParseCron parses expr in the IANA time zone tz. Errors are *CronError
// values naming the field (cron or timezone) and the reason; for a cron
// expression the reason names the cron field at fault.
func ParseCron(expr, tz string) (c *Cron, err error) {
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
	}
	// robfig/cron panics on a few malformed inputs; report them as errors.
	defer func() {
		if p := recover(); p != nil {
			c, err = nil, bad("malformed expression")
		}
	}()

	if strings.HasPrefix(trimmed, "@every") {
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
	}

	sched, perr := cronParser.Parse(trimmed)
	if perr != nil {
		return nil, describeCronError(trimmed, perr, bad)
	}
	spec, ok := sched.(*cron.SpecSchedule)
	if !ok {
		return nil, bad("unsupported expression")
	}
	c = &Cron{expr: trimmed, loc: loc, spec: spec, wall: spec.Hour&allHours != allHours}
	// An expression that matches no date (such as 0 0 30 2 *) never fires.
	if c.Next(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)).IsZero() {
		return nil, bad("never fires: no date matches its day-of-month, month and day-of-week fields")
	}
	return c, nil
}

// describeCronError turns a robfig/cron parse error into one naming the cron
// field at fault.
func describeCronError(expr string, perr error, bad func(string, ...any) error) error {
	if strings.HasPrefix(expr, "@") {
		return bad("unknown descriptor: want @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly or @every DURATION")
	}
	fields := strings.Fields(expr)
	names, ok := cronFieldNames[len(fields)]
	if !ok {
		return bad("want 5 fields (minute hour day-of-month month day-of-week) or 6 with a leading seconds field, got %d", len(fields))
	}
	// Parse each field alone, the others wildcards, to find the culprit.
	for i, f := range fields {
		probe := make([]string, len(fields))
		for j := range probe {
			probe[j] = "*"
		}
		probe[i] = f
		if _, err := cronParser.Parse(strings.Join(probe, " ")); err != nil {
			return bad("%s field %q: %s", names[i], f, err)
		}
	}
	return bad("%s", perr)
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

// Next returns the first due time strictly after t, or the zero time if
// there is none within five years.
func (c *Cron) Next(t time.Time) time.Time {
	switch {
	case c.spec == nil:
		// Whole seconds from the previous due time.
		return t.Truncate(time.Second).Add(c.every)
	case !c.wall:
		next := c.spec.Next(t.In(c.loc))
		if next.IsZero() {
			return next
		}
		return next.In(c.loc)
	default:
		return c.nextWall(t)
	}
}

// nextWall computes Next with wall-clock semantics: it walks the local
// times of the schedule on a clock without time changes and maps each to an
// instant in the zone, returning the first after t.
func (c *Cron) nextWall(t time.Time) time.Time {
	local := t.In(c.loc)
	wall := time.Date(local.Year(), local.Month(), local.Day(), local.Hour(), local.Minute(), local.Second(), local.Nanosecond(), time.UTC)
	// A repeated local hour can map the next wall time before t; a few
	// steps always get past it.
	for range 100 {
		wall = c.spec.Next(wall)
		if wall.IsZero() {
			return wall
		}
		if at := wallToInstant(wall, c.loc); at.After(t) {
			return at
		}
	}
	return time.Time{}
}

// wallToInstant maps the local time whose fields are w's (w is in UTC) to an
// instant in loc. A repeated local time maps to its first occurrence; a
// local time in a gap maps to the same offset after the gap (it is read with
// the offset in force before the gap).
func wallToInstant(w time.Time, loc *time.Location) time.Time {
	t := time.Date(w.Year(), w.Month(), w.Day(), w.Hour(), w.Minute(), w.Second(), 0, loc)
	if sameWall(t, w) {
		// time.Date picks the first occurrence of a repeated time when
		// it can; make sure of it.
		if earlier := t.Add(-time.Hour); sameWall(earlier, w) {
			return earlier
		}
		for _, d := range []time.Duration{-30 * time.Minute, -2 * time.Hour} {
			if earlier := t.Add(d); sameWall(earlier, w) {
				return earlier
			}
		}
		return t
	}
	// w does not exist in loc: find the offset in force before the gap.
	var before int
	if wallOf(t).Before(w) {
		// t is before the gap, read with the old offset.
		_, before = t.Zone()
	} else {
		start, _ := t.ZoneBounds()
		_, before = start.Add(-time.Nanosecond).Zone()
	}
	return w.Add(-time.Duration(before) * time.Second).In(loc)
}

// wallOf returns t's local time fields as a UTC time.
func wallOf(t time.Time) time.Time {
	return time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), time.UTC)
}

func sameWall(t, w time.Time) bool { return wallOf(t).Equal(w) }

// scanLimit bounds how many due times one dispatch walks through one by one
// (a per-second schedule after a long downtime).
const scanLimit = 10_000

// errNoFutureTime reports an expression with no due time left.
var errNoFutureTime = errors.New("no due time within five years")

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
