package scheduler_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/scheduler"
)

// propertyZones are the zones the iterator is compared with the reference
// in, each over two years around the clock changes that make it
// interesting.
var propertyZones = []struct {
	name string
	from time.Time
}{
	{"UTC", date(2027, 6, 1)}, // 29 February 2028
	{"America/New_York", date(2025, 7, 1)},
	{"Europe/London", date(2025, 7, 1)},
	{"Australia/Lord_Howe", date(2025, 7, 1)}, // 30-minute shifts
	{"Asia/Kathmandu", date(1985, 7, 1)},      // +05:30 to +05:45 on 1986-01-01
	{"America/Santiago", date(2025, 7, 1)},    // changes at midnight
	{"Pacific/Apia", date(2011, 1, 1)},        // skipped 2011-12-30
}

func date(y int, m time.Month, d int) time.Time { return time.Date(y, m, d, 0, 0, 0, 0, time.UTC) }

// TestCronMatchesReference compares the iterator with the brute-force
// reference on generated expressions: every due time over two years in
// each zone (5-field expressions, minute by minute), every due time over
// the days around the zone's clock changes (6-field expressions, second by
// second), and Next from instants around the changes and at random.
func TestCronMatchesReference(t *testing.T) {
	t.Parallel()

	for zi, z := range propertyZones {
		t.Run(z.name, func(t *testing.T) {
			t.Parallel()
			loc, err := time.LoadLocation(z.name)
			require.NoError(t, err)
			r := rand.New(rand.NewPCG(18, uint64(zi)))
			from, to := z.from, z.from.AddDate(2, 0, 0)
			changes := clockChanges(loc, from, to)

			exprs := make([]string, 30)
			for i := range exprs {
				exprs[i] = genExpr(t, r, false)
			}
			compareWithReference(t, r, loc, exprs, from, to, changes)

			// 6 fields, second by second, around the first clock changes
			// (a day in UTC, which has none).
			exprs = make([]string, 8)
			for i := range exprs {
				exprs[i] = genExpr(t, r, true)
			}
			windows := changes
			if len(windows) > 2 {
				windows = windows[:2]
			}
			if len(windows) == 0 {
				windows = []time.Time{from.AddDate(0, 8, 0)}
			}
			for _, at := range windows {
				compareWithReference(t, r, loc, exprs, at.Add(-26*time.Hour), at.Add(26*time.Hour), []time.Time{at})
			}
		})
	}
}

// compareWithReference checks the due times of exprs in (from, to] against
// the reference's, and Next from instants near the changes and at random.
func compareWithReference(t *testing.T, r *rand.Rand, loc *time.Location, exprs []string, from, to time.Time, changes []time.Time) {
	t.Helper()
	refs := make([]*refCron, len(exprs))
	for i, e := range exprs {
		refs[i] = refParse(t, e)
	}
	want := refDueTimes(refs, loc, from, to)

	var probes []time.Time
	for _, c := range changes {
		for _, d := range []time.Duration{0, time.Second, time.Minute, 15 * time.Minute, 30 * time.Minute, 45 * time.Minute, time.Hour, 90 * time.Minute, 2 * time.Hour, 24 * time.Hour} {
			probes = append(probes, c.Add(d), c.Add(-d), c.Add(d-time.Nanosecond))
		}
	}
	for range 200 {
		probes = append(probes, from.Add(time.Duration(r.Int64N(int64(to.Sub(from))))))
	}

	for i, e := range exprs {
		c, err := scheduler.ParseCron(e, loc.String())
		require.NoError(t, err, e)
		var got []time.Time
		for at := c.Next(from); !at.After(to); at = c.Next(at) {
			got = append(got, at)
		}
		requireSameTimes(t, loc, e, want[i], got)

		for _, p := range probes {
			if p.Before(from) || !p.Before(to) {
				continue
			}
			next := c.Next(p)
			if w, ok := refNext(want[i], p); ok {
				require.True(t, w.Equal(next), "%q in %s: Next(%s) = %s, want %s", e, loc, fmtLocal(p, loc), fmtLocal(next, loc), fmtLocal(w, loc))
			} else {
				require.True(t, next.After(to), "%q in %s: Next(%s) = %s, want none before %s", e, loc, fmtLocal(p, loc), fmtLocal(next, loc), fmtLocal(to, loc))
			}
		}
	}
}

// requireSameTimes fails with the first difference between two lists.
func requireSameTimes(t *testing.T, loc *time.Location, expr string, want, got []time.Time) {
	t.Helper()
	for i := range min(len(want), len(got)) {
		if !want[i].Equal(got[i]) {
			require.Failf(t, "due times differ", "%q in %s: due time %d is %s, want %s (previous: %s)",
				expr, loc, i, fmtLocal(got[i], loc), fmtLocal(want[i], loc), prevOf(want, i, loc))
		}
	}
	if len(want) != len(got) {
		n := min(len(want), len(got))
		extra := "got more: " + fmtLocal(got[min(n, len(got)-1)], loc)
		if len(want) > n {
			extra = "missing: " + fmtLocal(want[n], loc)
		}
		require.Failf(t, "due times differ", "%q in %s: %d due times, want %d; %s", expr, loc, len(got), len(want), extra)
	}
}

func prevOf(ts []time.Time, i int, loc *time.Location) string {
	if i == 0 {
		return "none"
	}
	return fmtLocal(ts[i-1], loc)
}

func fmtLocal(t time.Time, loc *time.Location) string {
	if t.IsZero() {
		return "zero"
	}
	return t.UTC().Format(time.RFC3339Nano) + " (" + t.In(loc).Format("2006-01-02 15:04:05 -07:00 Mon") + ")"
}

// clockChanges lists the instants in [from, to) at which loc changes its
// offset.
func clockChanges(loc *time.Location, from, to time.Time) []time.Time {
	var out []time.Time
	for t := from.In(loc); t.Before(to); {
		_, end := t.ZoneBounds()
		if end.IsZero() || !end.Before(to) {
			break
		}
		if !end.After(t) { // golang/go#81583, see zoneSegmentAt
			t = t.Add(24 * time.Hour)
			continue
		}
		_, before := end.Add(-time.Second).Zone()
		if _, after := end.Zone(); before != after {
			out = append(out, end)
		}
		t = end
	}
	return out
}

// genExpr generates a random valid expression: random fields, ranges,
// steps, lists, names, L, N#k, ? and 7, with hours and minutes biased to
// the times clocks change at. Expressions that never fire (0 0 30 2 *) are
// drawn again; TestCronFarHorizons checks that verdict.
func genExpr(t testing.TB, r *rand.Rand, seconds bool) string {
	t.Helper()
	for {
		expr := genFields(r, seconds)
		_, err := scheduler.ParseCron(expr, "UTC")
		if err == nil {
			return expr
		}
		require.ErrorContains(t, err, "never fires", expr)
	}
}

// genFields generates the fields of an expression.
func genFields(r *rand.Rand, seconds bool) string {
	var fields []string
	if seconds {
		fields = append(fields, genList(r, 0, 59, []int{0, 1, 30, 59}, nil))
	}
	fields = append(fields,
		genList(r, 0, 59, []int{0, 15, 30, 45, 59}, nil),
		genHour(r),
		genDom(r),
		genMonth(r),
		genDow(r),
	)
	return strings.Join(fields, " ")
}

func genHour(r *rand.Rand) string {
	if r.IntN(3) == 0 {
		return []string{"*", "*/1", "0-23"}[r.IntN(3)] // every hour: real time
	}
	return genList(r, 0, 23, []int{0, 1, 2, 3, 4, 22, 23}, nil)
}

func genDom(r *rand.Rand) string {
	switch r.IntN(6) {
	case 0, 1:
		return "*"
	case 2:
		return "?"
	case 3:
		return "L"
	}
	s := genList(r, 1, 31, []int{1, 15, 28, 29, 30, 31}, nil)
	if r.IntN(4) == 0 {
		s += ",L"
	}
	return s
}

func genMonth(r *rand.Rand) string {
	if r.IntN(2) == 0 {
		return "*"
	}
	return genList(r, 1, 12, []int{2, 3, 4, 9, 10, 11, 12}, []string{"", "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"})
}

func genDow(r *rand.Rand) string {
	names := []string{"sun", "mon", "tue", "wed", "thu", "fri", "sat"}
	switch r.IntN(8) {
	case 0, 1, 2:
		return "*"
	case 3:
		return "?"
	case 4:
		return []string{"1-7", "5-7", "7", "0,7", "6-7/1", "1-7/2"}[r.IntN(6)]
	case 5:
		items := make([]string, 1+r.IntN(2))
		for i := range items {
			n := r.IntN(8)
			day := fmt.Sprint(n)
			if n < 7 && r.IntN(3) == 0 {
				day = names[n]
			}
			items[i] = fmt.Sprintf("%s#%d", day, 1+r.IntN(5))
		}
		return strings.Join(items, ",")
	}
	return genList(r, 0, 7, []int{0, 6, 7}, names)
}

// genList generates a list of 1 to 3 items of a field of values lo to hi,
// biased to the values in hot.
func genList(r *rand.Rand, lo, hi int, hot []int, names []string) string {
	value := func() int {
		if r.IntN(2) == 0 {
			return hot[r.IntN(len(hot))]
		}
		return lo + r.IntN(hi-lo+1)
	}
	text := func(v int) string {
		if names != nil && v < len(names) && names[v] != "" && r.IntN(3) == 0 {
			return names[v]
		}
		return fmt.Sprint(v)
	}
	count := hi - lo + 1
	if hi == 7 { // day of the week: 7 is Sunday again
		count = 7
	}
	items := make([]string, 1+r.IntN(3))
	for i := range items {
		switch r.IntN(8) {
		case 0:
			items[i] = fmt.Sprintf("*/%d", 2+r.IntN(count-1))
		case 1:
			a, b := value(), value()
			items[i] = text(min(a, b)) + "-" + text(max(a, b))
		case 2:
			a, b := value(), value()
			items[i] = fmt.Sprintf("%s-%s/%d", text(min(a, b)), text(max(a, b)), 1+r.IntN(count))
		case 3:
			items[i] = fmt.Sprintf("%s/%d", text(value()), 1+r.IntN(count))
		default:
			items[i] = text(value())
		}
	}
	return strings.Join(items, ",")
}
