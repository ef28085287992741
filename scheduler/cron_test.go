package scheduler_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/scheduler"
)

func mustCron(t *testing.T, expr, tz string) *scheduler.Cron {
	t.Helper()
	c, err := scheduler.ParseCron(expr, tz)
	require.NoError(t, err)
	return c
}

// between lists the due times of c in (from, to].
func between(c *scheduler.Cron, from, to time.Time) []time.Time {
	var out []time.Time
	for t := c.Next(from); !t.IsZero() && !t.After(to); t = c.Next(t) {
		out = append(out, t)
	}
	return out
}

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t.UTC()
}

func utcs(ss ...string) []time.Time {
	out := make([]time.Time, len(ss))
	for i, s := range ss {
		out[i] = utc(s)
	}
	return out
}

func requireTimes(t *testing.T, want, got []time.Time) {
	t.Helper()
	require.Len(t, got, len(want), "got %v", got)
	for i := range want {
		require.True(t, want[i].Equal(got[i]), "time %d: want %s, got %s (all: %v)", i, want[i], got[i].UTC(), got)
	}
}

func TestCronMidnightUTCAndNewYork(t *testing.T) {
	t.Parallel()

	from := utc("2026-01-15T12:00:00Z")
	requireTimes(t, utcs("2026-01-16T00:00:00Z", "2026-01-17T00:00:00Z"),
		between(mustCron(t, "0 0 * * *", "UTC"), from, utc("2026-01-17T00:00:00Z")))
	// New York midnight is 05:00Z in winter (EST) and 04:00Z in summer (EDT).
	ny := mustCron(t, "0 0 * * *", "America/New_York")
	requireTimes(t, utcs("2026-01-16T05:00:00Z", "2026-01-17T05:00:00Z"),
		between(ny, from, utc("2026-01-17T05:00:00Z")))
	requireTimes(t, utcs("2026-07-02T04:00:00Z"), between(ny, utc("2026-07-01T12:00:00Z"), utc("2026-07-02T12:00:00Z")))
	// Next is strictly after its argument.
	require.Equal(t, utc("2026-01-17T05:00:00Z"), ny.Next(utc("2026-01-16T05:00:00Z")).UTC())
}

func TestCronDST(t *testing.T) {
	t.Parallel()

	ny, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	day := func(y int, m time.Month, d int) (time.Time, time.Time) {
		return time.Date(y, m, d, 0, 0, 0, 0, ny).Add(-time.Nanosecond), time.Date(y, m, d+1, 0, 0, 0, 0, ny).Add(-time.Nanosecond)
	}

	t.Run("spring forward, 02:30 daily runs once, at 03:30 EDT", func(t *testing.T) {
		t.Parallel()
		// 2026-03-08: 02:00 EST jumps to 03:00 EDT; 02:30 does not exist.
		c := mustCron(t, "30 2 * * *", "America/New_York")
		from, _ := day(2026, time.March, 7)
		_, to := day(2026, time.March, 9)
		requireTimes(t, utcs(
			"2026-03-07T07:30:00Z", // 02:30 EST
			"2026-03-08T07:30:00Z", // 03:30 EDT: 02:30 shifted past the gap
			"2026-03-09T06:30:00Z", // 02:30 EDT
		), between(c, from, to))
	})

	t.Run("spring forward, every local time of the skipped hour runs after the jump", func(t *testing.T) {
		t.Parallel()
		from, _ := day(2026, time.March, 8)
		_, to := day(2026, time.March, 8)
		// 02:00, 02:15, 02:30, 02:45 EST do not exist: they run as far
		// after 03:00 EDT as they were after 02:00.
		requireTimes(t, utcs("2026-03-08T07:00:00Z", "2026-03-08T07:15:00Z", "2026-03-08T07:30:00Z", "2026-03-08T07:45:00Z"),
			between(mustCron(t, "*/15 2 * * *", "America/New_York"), from, to))
		requireTimes(t, utcs("2026-03-08T07:00:00Z", "2026-03-08T07:30:00Z"),
			between(mustCron(t, "0,30 2 * * *", "America/New_York"), from, to))
		// 02:00 and 03:00 land on the same instant, as do 02:30 and
		// 03:30: each runs once.
		requireTimes(t, utcs("2026-03-08T07:00:00Z", "2026-03-08T07:30:00Z"),
			between(mustCron(t, "0,30 2,3 * * *", "America/New_York"), from, to))
	})

	t.Run("fall back, 02:30 daily runs once", func(t *testing.T) {
		t.Parallel()
		// 2026-11-01: 02:00 EDT falls back to 01:00 EST; 02:30 exists once.
		c := mustCron(t, "30 2 * * *", "America/New_York")
		from, _ := day(2026, time.October, 31)
		_, to := day(2026, time.November, 2)
		requireTimes(t, utcs(
			"2026-10-31T06:30:00Z", // 02:30 EDT
			"2026-11-01T07:30:00Z", // 02:30 EST
			"2026-11-02T07:30:00Z",
		), between(c, from, to))
	})

	t.Run("fall back, 01:30 daily runs once, at its first occurrence", func(t *testing.T) {
		t.Parallel()
		c := mustCron(t, "30 1 * * *", "America/New_York")
		from, to := day(2026, time.November, 1)
		requireTimes(t, utcs("2026-11-01T05:30:00Z"), between(c, from, to)) // 01:30 EDT, not 01:30 EST (06:30Z)
		// Even asked from within the repeated hour (01:10 EST), it does
		// not run 01:30 again that day.
		require.Equal(t, utc("2026-11-02T06:30:00Z"), c.Next(utc("2026-11-01T06:10:00Z")).UTC())
	})

	t.Run("spring forward, hourly runs 23 times, an hour apart", func(t *testing.T) {
		t.Parallel()
		c := mustCron(t, "0 * * * *", "America/New_York")
		from, to := day(2026, time.March, 8)
		got := between(c, from, to)
		require.Len(t, got, 23)
		for i := 1; i < len(got); i++ {
			require.Equal(t, time.Hour, got[i].Sub(got[i-1]), "between %s and %s", got[i-1], got[i])
		}
		require.Equal(t, utc("2026-03-08T05:00:00Z"), got[0].UTC())
	})

	t.Run("fall back, hourly runs 25 times, an hour apart", func(t *testing.T) {
		t.Parallel()
		c := mustCron(t, "0 * * * *", "America/New_York")
		from, to := day(2026, time.November, 1)
		got := between(c, from, to)
		require.Len(t, got, 25)
		for i := 1; i < len(got); i++ {
			require.Equal(t, time.Hour, got[i].Sub(got[i-1]), "between %s and %s", got[i-1], got[i])
		}
		// 01:00 EDT and 01:00 EST both run.
		require.Contains(t, got, utc("2026-11-01T05:00:00Z").In(ny))
		require.Contains(t, got, utc("2026-11-01T06:00:00Z").In(ny))
	})

	t.Run("@every ignores the clocks", func(t *testing.T) {
		t.Parallel()
		c := mustCron(t, "@every 90m", "America/New_York")
		start := time.Date(2026, time.March, 8, 0, 0, 0, 0, ny)
		got := between(c, start, start.Add(6*time.Hour))
		require.Len(t, got, 4)
		for i, g := range got {
			require.Equal(t, start.Add(time.Duration(i+1)*90*time.Minute), g)
		}
	})
}

// TestCronOtherZones: the README's rules in zones whose clocks change by
// other amounts, or at midnight, or skip a whole day.
func TestCronOtherZones(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name, expr, tz, from, to string
		want                     []string
	}{
		{
			// 2025-10-05: 02:00 +10:30 jumps to 02:30 +11:00.
			name: "Lord Howe: a skipped local time runs 30 minutes after", expr: "15 2 * * *", tz: "Australia/Lord_Howe",
			from: "2025-10-04T00:00:00Z", to: "2025-10-05T12:00:00Z",
			want: []string{"2025-10-04T15:45:00Z"}, // 02:45 +11:00
		},
		{
			// 2026-04-05: 02:00 +11:00 falls back to 01:30 +10:30.
			name: "Lord Howe: a repeated half hour runs once for named hours", expr: "45 1 * * *", tz: "Australia/Lord_Howe",
			from: "2026-04-04T12:00:00Z", to: "2026-04-05T12:00:00Z",
			want: []string{"2026-04-04T14:45:00Z"}, // 01:45 +11:00 only
		},
		{
			name: "Lord Howe: and twice for every hour", expr: "45 * * * *", tz: "Australia/Lord_Howe",
			from: "2026-04-04T14:00:00Z", to: "2026-04-04T16:30:00Z",
			want: []string{"2026-04-04T14:45:00Z", "2026-04-04T15:15:00Z", "2026-04-04T16:15:00Z"}, // 01:45 +11, 01:45 +10:30, 02:45 +10:30
		},
		{
			// 2025-09-07: 00:00 -04:00 jumps to 01:00 -03:00.
			name: "Santiago: a skipped midnight runs at 01:00", expr: "0 0 * * *", tz: "America/Santiago",
			from: "2025-09-06T00:00:00Z", to: "2025-09-08T12:00:00Z",
			want: []string{"2025-09-06T04:00:00Z", "2025-09-07T04:00:00Z", "2025-09-08T03:00:00Z"},
		},
		{
			// 2026-04-04: 24:00 -03:00 falls back to 23:00 -04:00.
			name: "Santiago: a repeated 23:30 runs at its first occurrence", expr: "30 23 * * *", tz: "America/Santiago",
			from: "2026-04-04T12:00:00Z", to: "2026-04-06T12:00:00Z",
			want: []string{"2026-04-05T02:30:00Z", "2026-04-06T03:30:00Z"},
		},
		{
			// 2011-12-29 24:00 -10:00 became 2011-12-31 00:00 +14:00.
			name: "Apia: 09:00 of the skipped day lands on 09:00 of the next and runs once", expr: "0 9 * * *", tz: "Pacific/Apia",
			from: "2011-12-29T00:00:00Z", to: "2011-12-31T12:00:00Z",
			want: []string{"2011-12-29T19:00:00Z", "2011-12-30T19:00:00Z"},
		},
		{
			name: "Apia: a date that never was runs after the jump", expr: "0 9 30 12 *", tz: "Pacific/Apia",
			from: "2011-06-01T00:00:00Z", to: "2013-01-01T00:00:00Z",
			want: []string{"2011-12-30T19:00:00Z", "2012-12-29T19:00:00Z"},
		},
		{
			// 1986-01-01: 00:00 +05:30 jumps to 00:15 +05:45.
			name: "Kathmandu: a 15-minute gap", expr: "5 0 * * *", tz: "Asia/Kathmandu",
			from: "1985-12-31T00:00:00Z", to: "1986-01-01T12:00:00Z",
			want: []string{"1985-12-31T18:35:00Z"}, // 00:20 +05:45
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			requireTimes(t, utcs(tc.want...), between(mustCron(t, tc.expr, tc.tz), utc(tc.from), utc(tc.to)))
		})
	}
}

// TestCronSyntax: weekday 7, L, N#k and ? (and the forms robfig/cron
// already had).
func TestCronSyntax(t *testing.T) {
	t.Parallel()

	from := utc("2026-05-04T10:20:30Z") // a Monday
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{"0 0 * * 7", []string{"2026-05-10T00:00:00Z", "2026-05-17T00:00:00Z"}},
		{"0 0 * * sun", []string{"2026-05-10T00:00:00Z", "2026-05-17T00:00:00Z"}},
		{"0 0 * * 5-7", []string{"2026-05-08T00:00:00Z", "2026-05-09T00:00:00Z", "2026-05-10T00:00:00Z", "2026-05-15T00:00:00Z"}},
		{"0 0 * * 1-7", []string{"2026-05-05T00:00:00Z", "2026-05-06T00:00:00Z"}},
		{"0 0 * * 0,7", []string{"2026-05-10T00:00:00Z", "2026-05-17T00:00:00Z"}},
		{"0 0 L * *", []string{"2026-05-31T00:00:00Z", "2026-06-30T00:00:00Z", "2026-07-31T00:00:00Z"}},
		{"0 0 L 2 *", []string{"2027-02-28T00:00:00Z", "2028-02-29T00:00:00Z"}},
		{"0 0 1,15,L * *", []string{"2026-05-15T00:00:00Z", "2026-05-31T00:00:00Z", "2026-06-01T00:00:00Z"}},
		{"0 9 ? * 5#3", []string{"2026-05-15T09:00:00Z", "2026-06-19T09:00:00Z"}},
		{"0 9 * * fri#3", []string{"2026-05-15T09:00:00Z", "2026-06-19T09:00:00Z"}},
		{"0 9 * * 7#1,1#5", []string{"2026-06-07T09:00:00Z", "2026-06-29T09:00:00Z", "2026-07-05T09:00:00Z"}},
		{"0 0 ? * ?", []string{"2026-05-05T00:00:00Z"}},
		// Both day fields restricted: either matches (Vixie cron).
		{"0 0 L * 1", []string{"2026-05-11T00:00:00Z", "2026-05-18T00:00:00Z", "2026-05-25T00:00:00Z", "2026-05-31T00:00:00Z", "2026-06-01T00:00:00Z"}},
		// One of them * or ?: the other decides.
		{"0 0 L * ?", []string{"2026-05-31T00:00:00Z"}},
		{"0 0 ? * 1#1", []string{"2026-06-01T00:00:00Z"}},
		// N/STEP runs from N to the end of the field.
		{"0 20/20 * * *", []string{"2026-05-04T20:00:00Z", "2026-05-05T20:00:00Z"}},
		{"0 0 * * 1/2", []string{"2026-05-06T00:00:00Z", "2026-05-08T00:00:00Z", "2026-05-11T00:00:00Z"}},
	} {
		t.Run(tc.expr, func(t *testing.T) {
			c := mustCron(t, tc.expr, "UTC")
			got := []time.Time{}
			for at := c.Next(from); len(got) < len(tc.want); at = c.Next(at) {
				got = append(got, at)
			}
			requireTimes(t, utcs(tc.want...), got)
		})
	}
	// Quartz's habit: seconds first, ? in one day field.
	require.Equal(t, utc("2026-05-04T12:00:00Z"), mustCron(t, "0 0 12 ? * MON", "UTC").Next(from).UTC())
}

// TestCronLastDayOfLeapYearsPastZoneTable: past a zone's table of
// transitions (2037 and on), Go's ZoneBounds reports the end of a leap
// year's last stretch a day early (golang/go#81583); Next must still
// cross 31 December.
func TestCronLastDayOfLeapYearsPastZoneTable(t *testing.T) {
	t.Parallel()

	from, to := utc("2092-12-30T00:00:00Z"), utc("2093-01-01T20:00:00Z")
	requireTimes(t, utcs("2092-12-30T17:00:00Z", "2092-12-31T17:00:00Z", "2093-01-01T17:00:00Z"),
		between(mustCron(t, "0 12 * * *", "America/New_York"), from, to))
	require.Len(t, between(mustCron(t, "0 * * * *", "America/New_York"), from, to), 24+24+20)
	requireTimes(t, utcs("2093-01-01T05:00:00Z"), between(mustCron(t, "0 0 1 1 *", "America/New_York"), from, to))
}

// TestCronFarHorizons: a leap-day schedule finds its next time however far
// it is, and the iterator agrees with a day-by-day walk over more than a
// whole 400-year calendar cycle for sparse day patterns, including those
// it refuses as never firing.
func TestCronFarHorizons(t *testing.T) {
	t.Parallel()

	leap := mustCron(t, "0 0 29 2 *", "UTC")
	require.Equal(t, utc("2104-02-29T00:00:00Z"), leap.Next(utc("2096-03-01T00:00:00Z")).UTC(), "2100 is not a leap year")
	require.Equal(t, utc("2096-02-29T00:00:00Z"), leap.Next(utc("2092-03-01T00:00:00Z")).UTC())
	// The fifth Monday of February: a 29 February that is a Monday.
	fifth := mustCron(t, "0 0 ? 2 1#5", "America/New_York")
	require.Equal(t, utc("2016-02-29T05:00:00Z"), fifth.Next(utc("2000-01-01T00:00:00Z")).UTC())
	require.Equal(t, utc("2044-02-29T05:00:00Z"), fifth.Next(utc("2016-03-01T00:00:00Z")).UTC())

	// Sparse day patterns (a few days a year at most), both ways of
	// combining the day fields, and some that never fire.
	doms := []string{"29", "30", "31", "L", "?"}
	months := []string{"2", "2,8", "*/6", "11"}
	dows := []string{"?", "1#5", "0#5", "6#4,2#5"}
	loc, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	from := time.Date(2090, time.January, 1, 0, 0, 0, 0, loc)
	to := from.AddDate(410, 0, 0)
	var exprs []string
	var refs []*refCron
	for _, dom := range doms {
		for _, month := range months {
			for _, dow := range dows {
				if dom == "?" && dow == "?" {
					continue
				}
				e := "0 12 " + dom + " " + month + " " + dow
				exprs = append(exprs, e)
				refs = append(refs, refParse(t, e))
			}
		}
	}
	// The reference: noon of every matching day.
	want := make([][]time.Time, len(exprs))
	for d := date(2090, 1, 1); d.Before(date(2500, 1, 1)); d = d.AddDate(0, 0, 1) {
		y, m, dd := d.Date()
		last := d.AddDate(0, 0, 1).Month() != m
		for i, r := range refs {
			if r.matchesDate(m, dd, d.Weekday(), last) {
				want[i] = append(want[i], time.Date(y, m, dd, 12, 0, 0, 0, loc))
			}
		}
	}
	for i, e := range exprs {
		c, err := scheduler.ParseCron(e, loc.String())
		if err != nil {
			require.ErrorContains(t, err, "never fires", e)
			require.Empty(t, want[i], "%q was refused as never firing", e)
			continue
		}
		require.NotEmpty(t, want[i], e)
		requireSameTimes(t, loc, e, want[i], between(c, from, to))
	}
}

func TestCronForms(t *testing.T) {
	t.Parallel()

	from := utc("2026-05-04T10:20:30Z") // a Monday
	for _, tc := range []struct {
		expr string
		want string
	}{
		{"*/15 * * * *", "2026-05-04T10:30:00Z"},
		{"0 9 * * 1-5", "2026-05-05T09:00:00Z"},
		{"45 * * * * *", "2026-05-04T10:20:45Z"},
		{"0 0 12 1 jan *", "2027-01-01T12:00:00Z"},
		{"@hourly", "2026-05-04T11:00:00Z"},
		{"@daily", "2026-05-05T00:00:00Z"},
		{"@midnight", "2026-05-05T00:00:00Z"},
		{"@weekly", "2026-05-10T00:00:00Z"},
		{"@monthly", "2026-06-01T00:00:00Z"},
		{"@yearly", "2027-01-01T00:00:00Z"},
		{"@annually", "2027-01-01T00:00:00Z"},
		{"@every 5s", "2026-05-04T10:20:35Z"},
		{"@every 1h30m", "2026-05-04T11:50:30Z"},
		{"  5 4 * * *  ", "2026-05-05T04:05:00Z"},
	} {
		t.Run(tc.expr, func(t *testing.T) {
			c := mustCron(t, tc.expr, "UTC")
			require.Equal(t, utc(tc.want), c.Next(from).UTC())
		})
	}
}

func TestParseCronErrors(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		expr, tz, field, want string
	}{
		{"", "UTC", "cron", "empty expression"},
		{"* * *", "UTC", "cron", "want 5 fields"},
		{"* * * * * * *", "UTC", "cron", "got 7"},
		{"60 * * * *", "UTC", "cron", `minute field "60": 60 out of range: want 0 to 59`},
		{"* 24 * * *", "UTC", "cron", `hour field "24": 24 out of range: want 0 to 23`},
		{"0 0 * * 8", "UTC", "cron", `day-of-week field "8": 8 out of range: want 0 to 7 (0 and 7 are Sunday)`},
		{"*/61 * * * *", "UTC", "cron", `minute field "*/61": step 61 out of range: want 1 to 60`},
		{"0 */25 * * *", "UTC", "cron", `hour field "*/25": step 25 out of range: want 1 to 24`},
		{"0 0 * * */8", "UTC", "cron", `day-of-week field "*/8": step 8 out of range: want 1 to 7`},
		{"0 0 1-5/x * *", "UTC", "cron", `day-of-month field "1-5/x": step "x" is not a number`},
		{"1,,2 * * * *", "UTC", "cron", `minute field "1,,2": empty list item`},
		{"0 0 1, * *", "UTC", "cron", `day-of-month field "1,": empty list item`},
		{"0 0 * * ,1", "UTC", "cron", `day-of-week field ",1": empty list item`},
		{"5-1 * * * *", "UTC", "cron", `minute field "5-1": range 5-1 runs backwards`},
		{"5- * * * *", "UTC", "cron", `minute field "5-": missing value`},
		{"+5 * * * *", "UTC", "cron", `minute field "+5": "+5" is not a number`},
		{"L * * * *", "UTC", "cron", `minute field "L": L (the last day of the month) is allowed only in the day-of-month field`},
		{"0 0 * * L", "UTC", "cron", `day-of-week field "L": L (the last day of the month) is allowed only in the day-of-month field`},
		{"0 0 * L *", "UTC", "cron", `month field "L": L (the last day`},
		{"0 0 L-2 * *", "UTC", "cron", `day-of-month field "L-2": L takes no offset, range or step`},
		{"0 0 LW * *", "UTC", "cron", `day-of-month field "LW": L takes no offset`},
		{"0 0 15W * *", "UTC", "cron", `day-of-month field "15W": W (the nearest weekday) is not supported`},
		{"0 0 * * 5L", "UTC", "cron", `day-of-week field "5L": NL (the last weekday N of the month) is not supported`},
		{"0 0 1#2 * *", "UTC", "cron", `day-of-month field "1#2": N#k (the k-th weekday N of the month) is allowed only in the day-of-week field`},
		{"0 0 * * 5#6", "UTC", "cron", `day-of-week field "5#6": in "5#6": k must be 1 to 5`},
		{"0 0 * * 5#0", "UTC", "cron", `k must be 1 to 5`},
		{"0 0 * * 8#1", "UTC", "cron", `day-of-week field "8#1": in "8#1": 8 out of range`},
		{"0 0 * * 1-2#1", "UTC", "cron", `day-of-week field "1-2#1": in "1-2#1"`},
		{"? * * * *", "UTC", "cron", `minute field "?": ? (any day) is allowed only in the day-of-month and day-of-week fields`},
		{"0 0 ?/2 * *", "UTC", "cron", `day-of-month field "?/2": ? takes no range or step`},
		{"0 0 * * fun", "UTC", "cron", `day-of-week field "fun": "fun" is not a number or a day name (sun to sat)`},
		{"0 0 * jam *", "UTC", "cron", `month field "jam": "jam" is not a number or a month name (jan to dec)`},
		{"0 0 * * 1/2/3", "UTC", "cron", `step "2/3" is not a number`},
		{"@every 1500ms", "UTC", "cron", "whole number of seconds"},
		{"0 25 * * *", "UTC", "cron", `hour field "25"`},
		{"0 0 0 * *", "UTC", "cron", `day-of-month field "0"`},
		{"0 0 * 13 *", "UTC", "cron", `month field "13"`},
		{"0 0 * * mon-xyz", "UTC", "cron", `day-of-week field "mon-xyz"`},
		{"61 0 0 * * *", "UTC", "cron", `second field "61"`},
		{"*/0 * * * *", "UTC", "cron", `minute field "*/0": step 0 out of range: want 1 to 60`},
		{"a b c d e", "UTC", "cron", `minute field "a"`},
		{"0 0 30 2 *", "UTC", "cron", "never fires"},
		{"0 0 31 4,6 ?", "UTC", "cron", "never fires"},
		{"0 0 30 2 1#5", "UTC", "cron", ""}, // either day field: fifth Mondays of February
		{"@fortnightly", "UTC", "cron", "unknown descriptor"},
		{"@everyday", "UTC", "cron", "unknown descriptor"},
		{"0 0 1-L * *", "UTC", "cron", `day-of-month field "1-L": L takes no offset, range or step`},
		{"@every", "UTC", "cron", "@every needs a duration"},
		{"@every soon", "UTC", "cron", `"soon" is not a duration`},
		{"@every 500ms", "UTC", "cron", "at least 1s"},
		{"@every -5s", "UTC", "cron", "at least 1s"},
		{"@every 1.5s", "UTC", "cron", "whole number of seconds"},
		{"TZ=UTC * * * * *", "UTC", "cron", "time zone prefixes are not supported"},
		{"CRON_TZ=UTC", "UTC", "cron", "time zone prefixes are not supported"},
		{"* * * * *", "", "timezone", "empty"},
		{"* * * * *", "Local", "timezone", "local zone"},
		{"* * * * *", "Mars/Olympus_Mons", "timezone", "unknown time zone"},
		{"* * * * *", "../../etc/passwd", "timezone", "unknown time zone"},
	} {
		t.Run(tc.expr+"|"+tc.tz, func(t *testing.T) {
			_, err := scheduler.ParseCron(tc.expr, tc.tz)
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			var cronErr *scheduler.CronError
			require.True(t, errors.As(err, &cronErr), "%T", err)
			require.Equal(t, tc.field, cronErr.Field)
			require.Contains(t, err.Error(), tc.want)
			require.Contains(t, err.Error(), "invalid "+tc.field+" ")
		})
	}
}

func TestDueTimes(t *testing.T) {
	t.Parallel()

	c := mustCron(t, "* * * * *", "UTC")
	first := utc("2026-01-01T00:00:00Z")

	newest, total, exact := c.DueTimes(first, utc("2026-01-01T00:04:30Z"), 2)
	requireTimes(t, utcs("2026-01-01T00:03:00Z", "2026-01-01T00:04:00Z"), newest)
	require.Equal(t, 5, total)
	require.True(t, exact)

	newest, total, exact = c.DueTimes(first, utc("2026-01-01T00:04:30Z"), 10)
	require.Len(t, newest, 5)
	require.Equal(t, 5, total)
	require.True(t, exact)

	// A first that is not a cron time (a retry, or set by SQL) is due too.
	newest, total, _ = c.DueTimes(utc("2026-01-01T00:00:10Z"), utc("2026-01-01T00:01:30Z"), 5)
	requireTimes(t, utcs("2026-01-01T00:00:10Z", "2026-01-01T00:01:00Z"), newest)
	require.Equal(t, 2, total)

	// A month of a per-second schedule: only a window is walked, and the
	// newest due times come back.
	sec := mustCron(t, "* * * * * *", "UTC")
	now := utc("2026-02-01T00:00:00Z")
	newest, total, exact = sec.DueTimes(first, now, 3)
	require.False(t, exact)
	require.GreaterOrEqual(t, total, 10_000)
	requireTimes(t, utcs("2026-01-31T23:59:58Z", "2026-01-31T23:59:59Z", "2026-02-01T00:00:00Z"), newest)

	every := mustCron(t, "@every 7s", "UTC")
	newest, _, exact = every.DueTimes(first, now, 2)
	require.False(t, exact)
	last := first.Add(now.Sub(first) / (7 * time.Second) * 7 * time.Second)
	requireTimes(t, []time.Time{last.Add(-7 * time.Second), last}, newest)

	// After continues the cadence.
	next, err := every.After(first, now)
	require.NoError(t, err)
	require.Equal(t, last.Add(7*time.Second), next)
	next, err = c.After(first, utc("2026-01-01T00:04:30Z"))
	require.NoError(t, err)
	require.Equal(t, utc("2026-01-01T00:05:00Z"), next.UTC())
}

// FuzzParseCron: no input makes the parser panic, and every expression it
// accepts has a next due time, strictly after the time asked from.
// `go test` runs the seeds; `go test -fuzz FuzzParseCron` explores.
func FuzzParseCron(f *testing.F) {
	for _, seed := range []string{"* * * * *", "*/61 * * * *", "0 0 L * ?", "0 9 ? * 5#3", "1,,2 * * * *", "0 0 * * 1-7/2",
		"@every 1h", "@hourly", "0 0 29 2 *", "0 0 30 2 1#5", "5-", "-", "/", "#", "*/", "1-2-3 * * * *", "0 0 * * 7#5", "L L L L L"} {
		f.Add(seed, "America/New_York")
	}
	f.Add("*/15 2 * * *", "Australia/Lord_Howe")
	from := utc("2026-03-08T06:59:59Z")
	f.Fuzz(func(t *testing.T, expr, tz string) {
		c, err := scheduler.ParseCron(expr, tz)
		if err != nil {
			var cronErr *scheduler.CronError
			require.ErrorAs(t, err, &cronErr)
			return
		}
		next := c.Next(from)
		require.True(t, next.After(from), "%q in %s: Next(%s) = %s", expr, tz, from, next)
	})
}
