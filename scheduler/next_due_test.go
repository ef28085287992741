package scheduler_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/scheduler"
)

// TestNextDue: the next due time `sluice schedule list` shows is the one a
// dispatch at now would set.
func TestNextDue(t *testing.T) {
	t.Parallel()

	now := utc("2026-03-08T06:50:00Z") // 01:50 EST, before the jump
	ptr := func(s string) *time.Time { u := utc(s); return &u }
	for _, tc := range []struct {
		name string
		row  db.Schedule
		want string
	}{
		{"cron: its first time after now, in its zone", db.Schedule{Cron: "*/15 2 * * *", Timezone: "America/New_York", NextRunAt: ptr("2026-03-08T07:00:00Z")}, "2026-03-08T03:00:00-04:00"},
		{"cron, next_run_at not yet set", db.Schedule{Cron: "0 0 L * ?", Timezone: "UTC"}, "2026-03-31T00:00:00Z"},
		{"cron overdue: the next future time", db.Schedule{Cron: "*/20 * * * *", Timezone: "UTC", NextRunAt: ptr("2026-03-08T05:00:00Z")}, "2026-03-08T07:00:00Z"},
		{"@every continues its cadence", db.Schedule{Cron: "@every 7m", Timezone: "UTC", NextRunAt: ptr("2026-03-08T06:00:00Z")}, "2026-03-08T06:56:00Z"},
		{"@every from the due time being retried", db.Schedule{Cron: "@every 7m", Timezone: "UTC", NextRunAt: ptr("2026-03-08T06:51:00Z"), RetryDueAt: ptr("2026-03-08T06:01:00Z")}, "2026-03-08T06:57:00Z"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := scheduler.NextDue(&tc.row, now)
			require.NoError(t, err)
			want, err := time.Parse(time.RFC3339, tc.want)
			require.NoError(t, err)
			require.True(t, want.Equal(got), "got %s", got)
			_, wantOff := want.Zone()
			_, gotOff := got.Zone()
			require.Equal(t, wantOff, gotOff, "in the row's zone")
		})
	}

	_, err := scheduler.NextDue(&db.Schedule{Cron: "0 0 * * L", Timezone: "UTC"}, now)
	var fieldErr *scheduler.FieldError
	require.ErrorAs(t, err, &fieldErr)
	require.Equal(t, "cron", fieldErr.Field)
	_, err = scheduler.NextDue(&db.Schedule{Cron: "0 0 * * *", Timezone: "Nowhere/City"}, now)
	require.ErrorAs(t, err, &fieldErr)
	require.Equal(t, "timezone", fieldErr.Field)
}
