package scheduler_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/scheduler"
)

// TestDispatcherAcrossClockChanges runs the dispatcher on a fake clock
// through spring-forward and fall-back nights and checks the due times of
// the jobs it inserted against the brute-force reference: the dispatcher
// follows the README's rules as the iterator does. New York's nights are
// walked minute by minute (each due time dispatched when it comes); Lord
// Howe's 30-minute changes in uneven 13-minute steps, so that run_all
// catches up due times across the change.
func TestDispatcherAcrossClockChanges(t *testing.T) {
	t.Parallel()

	exprs := []string{
		"*/15 2 * * *",   // the skipped hour: four runs after the jump
		"0,30 2 * * *",   // its 02:30 too
		"30 1 * * *",     // the repeated hour: once
		"45 1,2 * * *",   // both
		"15 3 * * *",     // after the skipped 02:xx runs
		"*/10 1-3 * * *", // named hours, across both
		"0 * * * *",      // every hour: real time
		"*/20 * * * *",
		"0 0 * * *",
	}
	for _, night := range []struct {
		name string
		tz   string
		from string // 22:00 local the evening before
		step time.Duration
	}{
		{"New York spring forward", "America/New_York", "2026-03-08T03:00:00Z", time.Minute},
		{"New York fall back", "America/New_York", "2026-11-01T02:00:00Z", time.Minute},
		{"Lord Howe spring forward", "Australia/Lord_Howe", "2025-10-04T11:30:00Z", 13 * time.Minute},
		{"Lord Howe fall back", "Australia/Lord_Howe", "2026-04-04T11:00:00Z", 13 * time.Minute},
	} {
		t.Run(night.name, func(t *testing.T) {
			t.Parallel()
			loc, err := time.LoadLocation(night.tz)
			require.NoError(t, err)
			url := newDB(t)
			pool := openPool(t, url)
			for i, e := range exprs {
				insertRow(t, pool, row{name: fmt.Sprintf("s%d", i), cron: e, tz: night.tz, misfire: "run_all"})
			}
			from := utc(night.from)
			to := from.Add(7 * time.Hour)
			clock := newClock(from)
			d := newDispatcher(t, url, scheduler.Config{Now: clock.Now})
			require.Equal(t, len(exprs), tick(t, d).Initialised)
			for clock.Now().Before(to) {
				now := clock.Add(night.step)
				if now.After(to) {
					clock.Set(to)
				}
				tick(t, d)
			}

			refs := make([]*refCron, len(exprs))
			for i, e := range exprs {
				refs[i] = refParse(t, e)
			}
			want := refDueTimes(refs, loc, from, to)
			for i, e := range exprs {
				jobs := jobsOf(t, pool, fmt.Sprintf("s%d", i))
				require.NotEmpty(t, jobs, e)
				requireSameTimes(t, loc, e, want[i], dueTimes(jobs))
				for _, j := range jobs {
					require.Zero(t, j.Meta.Missed, "%q: run_all runs every due time", e)
				}
			}
		})
	}
}
