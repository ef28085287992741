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
		{"60 * * * *", "UTC", "cron", `minute field "60": end of range (60) above maximum (59)`},
		{"0 25 * * *", "UTC", "cron", `hour field "25"`},
		{"0 0 0 * *", "UTC", "cron", `day-of-month field "0"`},
		{"0 0 * 13 *", "UTC", "cron", `month field "13"`},
		{"0 0 * * mon-xyz", "UTC", "cron", `day-of-week field "mon-xyz"`},
		{"61 0 0 * * *", "UTC", "cron", `second field "61"`},
		{"*/0 * * * *", "UTC", "cron", `minute field "*/0": step of range should be a positive number`},
		{"a b c d e", "UTC", "cron", `minute field "a"`},
		{"0 0 30 2 *", "UTC", "cron", "never fires"},
		{"@fortnightly", "UTC", "cron", "unknown descriptor"},
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
