package scheduler

import (
	"errors"
	"time"

	"github.com/sluice-dev/sluice/db"
)

// NextDue returns the next due time after now of the stored schedule row:
// the first time of its cron expression after now, or for @every the
// row's cadence continued past now, as a dispatch at now would set
// next_run_at; the time is in the row's zone. An invalid cron or zone is
// a *FieldError.
func NextDue(row *db.Schedule, now time.Time) (time.Time, error) {
	c, err := ParseCron(row.Cron, row.Timezone)
	if err != nil {
		var cronErr *CronError
		if errors.As(err, &cronErr) {
			return time.Time{}, &FieldError{Field: cronErr.Field, Value: cronErr.Value, Reason: cronErr.Reason, Err: err}
		}
		return time.Time{}, err
	}
	first := now
	if row.NextRunAt != nil {
		first = firstDue(*row.NextRunAt, row.RetryDueAt)
	}
	next, err := c.After(first, now)
	if err != nil {
		return time.Time{}, &FieldError{Field: "cron", Value: row.Cron, Reason: err.Error(), Err: err}
	}
	return next.In(c.Location()), nil
}

// firstDue is the earliest due time a row waits for: next_run_at, or the
// due time being retried when it is older.
func firstDue(nextRunAt time.Time, retryDueAt *time.Time) time.Time {
	if retryDueAt != nil && retryDueAt.Before(nextRunAt) {
		return *retryDueAt
	}
	return nextRunAt
}
