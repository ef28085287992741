package scheduler_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// This file is the brute-force reference the cron iterator is tested
// against. It shares nothing with the production code: it parses an
// expression into plain sets with code of its own, and finds the due times
// by walking every minute (every second, for 6-field expressions) of real
// time, reading each instant's local time and applying the README's rules:
//
//   - an expression that matches every hour runs at each instant whose
//     local time matches;
//   - the others run each matching local time once: at its first
//     occurrence, or, for a local time the clocks skipped, as far after the
//     jump as it was after the start of the gap.

// refCron is an expression as the reference reads it.
type refCron struct {
	expr             string
	seconds          bool // 6 fields: walk every second
	sec, min         [60]bool
	hour             [24]bool
	dom              [32]bool
	last             bool // L
	month            [13]bool
	dow              [7]bool
	nth              [7][6]bool // N#k: nth[N][k]
	domStar, dowStar bool
}

// refParse parses a valid expression (descriptors other than @every too).
func refParse(t testing.TB, expr string) *refCron {
	t.Helper()
	switch strings.TrimSpace(expr) {
	case "@yearly", "@annually":
		expr = "0 0 1 1 *"
	case "@monthly":
		expr = "0 0 1 * *"
	case "@weekly":
		expr = "0 0 * * 0"
	case "@daily", "@midnight":
		expr = "0 0 * * *"
	case "@hourly":
		expr = "0 * * * *"
	}
	r := &refCron{expr: expr}
	fields := strings.Fields(expr)
	if len(fields) == 5 {
		fields = append([]string{"0"}, fields...)
	} else {
		r.seconds = true
	}
	require.Len(t, fields, 6, expr)
	mark := func(set []bool) func(int) { return func(v int) { set[v] = true } }
	refField(t, fields[0], 0, 59, nil, mark(r.sec[:]))
	refField(t, fields[1], 0, 59, nil, mark(r.min[:]))
	refField(t, fields[2], 0, 23, nil, mark(r.hour[:]))
	r.domStar = refField(t, fields[3], 1, 31, nil, func(v int) {
		if v == -1 {
			r.last = true
			return
		}
		r.dom[v] = true
	})
	refField(t, fields[4], 1, 12, []string{"", "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"}, mark(r.month[:]))
	r.dowStar = refField(t, fields[5], 0, 6, []string{"sun", "mon", "tue", "wed", "thu", "fri", "sat"}, func(v int) {
		if v >= 100 { // N#k, encoded as 100*k + N
			r.nth[v%100%7][v/100] = true
			return
		}
		r.dow[v%7] = true
	})
	return r
}

// refField parses one field, calling set for each value (-1 for L, 100*k+N
// for N#k), and reports whether it holds a bare * or ?.
func refField(t testing.TB, field string, lo, hi int, names []string, set func(int)) (star bool) {
	t.Helper()
	num := func(s string) int {
		for i, n := range names {
			if n != "" && strings.EqualFold(s, n) {
				return i
			}
		}
		v, err := strconv.Atoi(s)
		require.NoError(t, err, field)
		return v
	}
	for _, item := range strings.Split(field, ",") {
		if item == "L" {
			set(-1)
			continue
		}
		if n, k, ok := strings.Cut(item, "#"); ok {
			set(100*num(k) + num(n))
			continue
		}
		base, stepText, hasStep := strings.Cut(item, "/")
		step := 1
		if hasStep {
			step = num(stepText)
		}
		from, to := 0, 0
		switch a, b, isRange := strings.Cut(base, "-"); {
		case base == "*" || base == "?":
			from, to = lo, hi
			star = star || step == 1
		case isRange:
			from, to = num(a), num(b)
		case hasStep:
			from, to = num(a), max(hi, num(a))
		default:
			from, to = num(a), num(a)
		}
		for v := from; v <= to; v += step {
			set(v)
		}
	}
	return star
}

// everyHour reports whether the hour field matches every hour.
func (r *refCron) everyHour() bool {
	for _, ok := range r.hour {
		if !ok {
			return false
		}
	}
	return true
}

// matchesDay reports whether the local date of w matches the day fields.
func (r *refCron) matchesDay(w time.Time) bool {
	return r.matchesDate(w.Month(), w.Day(), w.Weekday(), w.AddDate(0, 0, 1).Month() != w.Month())
}

// matchesDate reports whether day d of month m, a weekday wd, matches the
// day fields; last is whether it is the month's last day.
func (r *refCron) matchesDate(m time.Month, d int, wd time.Weekday, last bool) bool {
	if !r.month[m] {
		return false
	}
	dom := r.dom[d] || (r.last && last)
	dow := r.dow[wd] || r.nth[wd][(d-1)/7+1]
	if r.domStar || r.dowStar {
		return dom && dow
	}
	return dom || dow
}

// matchesClock reports whether the local time of day of w matches.
func (r *refCron) matchesClock(w time.Time) bool {
	h, m, s := w.Clock()
	return r.hour[h] && r.min[m] && r.sec[s]
}

// refDueTimes returns the due times of each expression in loc in (from,
// to], in one walk: every minute of real time from two days before from
// (every second if one of them has 6 fields).
func refDueTimes(rs []*refCron, loc *time.Location, from, to time.Time) [][]time.Time {
	step := time.Minute
	for _, r := range rs {
		if r.seconds {
			step = time.Second
		}
	}
	wall := func(x time.Time) time.Time {
		l := x.In(loc)
		y, mo, d := l.Date()
		h, mi, s := l.Clock()
		return time.Date(y, mo, d, h, mi, s, 0, time.UTC)
	}
	out := make([][]time.Time, len(rs))
	everyHour := make([]bool, len(rs))
	for i, r := range rs {
		everyHour[i] = r.everyHour()
	}
	dayOK := make([]bool, len(rs))
	var day time.Time // the local date dayOK is for

	start := from.Add(-48 * time.Hour).Truncate(step)
	seen := wall(start.Add(-step)) // the latest local time seen so far
	for x := start; !x.After(to); x = x.Add(step) {
		w := wall(x)
		if date := w.Truncate(24 * time.Hour); !date.Equal(day) {
			day = date
			for i, r := range rs {
				dayOK[i] = r.matchesDay(w)
			}
		}
		newTime := w.After(seen)
		// The local times after seen and before w never happened: the
		// clocks jumped over them. They run as far after x as they were
		// after the start of the gap.
		if gapStart := seen.Add(step); newTime && w.After(gapStart) {
			for g := gapStart; g.Before(w); g = g.Add(step) {
				for i, r := range rs {
					if !everyHour[i] && r.matchesDay(g) && r.matchesClock(g) {
						out[i] = append(out[i], x.Add(g.Sub(gapStart)))
					}
				}
			}
		}
		for i, r := range rs {
			if !dayOK[i] || !r.matchesClock(w) {
				continue
			}
			// Every-hour expressions follow real time; the others run a
			// repeated local time only at its first occurrence.
			if everyHour[i] || newTime {
				out[i] = append(out[i], x)
			}
		}
		if newTime {
			seen = w
		}
	}
	for i := range out {
		slices.SortFunc(out[i], func(a, b time.Time) int { return a.Compare(b) })
		out[i] = slices.CompactFunc(out[i], func(a, b time.Time) bool { return a.Equal(b) })
		out[i] = slices.DeleteFunc(out[i], func(t time.Time) bool { return !t.After(from) || t.After(to) })
	}
	return out
}

// refNext returns the first of times (sorted) after t, or false if none.
func refNext(times []time.Time, t time.Time) (time.Time, bool) {
	i, _ := slices.BinarySearchFunc(times, t, func(e, target time.Time) int {
		if e.After(target) {
			return 1
		}
		return -1
	})
	if i == len(times) {
		return time.Time{}, false
	}
	return times[i], true
}
