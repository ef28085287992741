package scheduler_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/scheduler"
)

// runDispatcher runs d until the test ends.
func runDispatcher(t *testing.T, d *scheduler.Dispatcher) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

// TestNotifyWakesDispatcher: with an hour-long poll interval, a schedule
// added (or made due by SQL) is dispatched promptly, because the
// schedules triggers NOTIFY the dispatchers; also after the listening
// connection was killed (it reconnects).
func TestNotifyWakesDispatcher(t *testing.T) {
	t.Parallel()

	url := newDB(t)
	pool := openPool(t, url)
	d := newDispatcher(t, url, scheduler.Config{PollInterval: time.Hour})
	d.TestSignals.Init(t)
	runDispatcher(t, d)
	d.TestSignals.Listening.WaitOrTimeout()
	// The first tick is done: the dispatcher sleeps for the poll interval.
	d.TestSignals.Ticked.WaitOrTimeout()

	store := scheduler.NewStore(pool, jobtest.Registry(t))
	_, err := store.Add(context.Background(), scheduler.Definition{
		Name: "soon", Cron: "@every 1s", Kind: "demo.sleep", Args: json.RawMessage(`{}`), Enabled: true,
	})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(jobsOf(t, pool, "soon")) > 0 }, 30*time.Second, 20*time.Millisecond,
		"the new schedule was dispatched without waiting for the poll")

	// A far-future schedule made due by plain SQL.
	insertRow(t, pool, row{name: "sql", cron: "0 0 1 1 *"})
	require.Eventually(t, func() bool { return getRow(t, pool, "sql").NextRunAt != nil }, 30*time.Second, 20*time.Millisecond)
	_, err = pool.Exec(context.Background(), `UPDATE schedules SET next_run_at = now() WHERE name = 'sql'`)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(jobsOf(t, pool, "sql")) == 1 }, 30*time.Second, 20*time.Millisecond)

	// Kill the listening connection: the listener reconnects.
	var killed int
	require.NoError(t, pool.QueryRow(context.Background(), `
		SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE '%LISTEN sluice_schedules%'`).Scan(&killed))
	require.Equal(t, 1, killed)
	d.TestSignals.Listening.WaitOrTimeout() // reconnected
	require.True(t, d.Listening())
	_, err = store.Add(context.Background(), scheduler.Definition{
		Name: "after-reconnect", Cron: "@every 1s", Kind: "demo.sleep", Enabled: true,
	})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(jobsOf(t, pool, "after-reconnect")) > 0 }, 30*time.Second, 20*time.Millisecond)
}

func TestStore(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := newDB(t)
	pool := openPool(t, url)
	store := scheduler.NewStore(pool, jobtest.Registry(t))

	r, err := store.Add(ctx, scheduler.Definition{Name: "report", Cron: "0 6 * * *", Timezone: "Asia/Tokyo", Kind: "demo.sleep", Args: json.RawMessage(`{"ms": 1}`), Enabled: true})
	require.NoError(t, err)
	require.Equal(t, 21, r.NextRunAt.UTC().Hour(), "06:00 JST is 21:00 UTC")
	require.Equal(t, "run_once", r.Misfire)
	require.EqualValues(t, 0, r.MaxRetries, "the Go API's zero value: no retries")

	_, err = store.Add(ctx, scheduler.Definition{Name: "report", Cron: "0 6 * * *", Kind: "demo.sleep"})
	var exists *scheduler.ExistsError
	require.ErrorAs(t, err, &exists)

	t.Run("update recomputes next_run_at on a new cron or zone only", func(t *testing.T) {
		misfire := "skip"
		r2, err := store.Update(ctx, "report", scheduler.Patch{Misfire: &misfire})
		require.NoError(t, err)
		require.Equal(t, "skip", r2.Misfire)
		require.Equal(t, r.NextRunAt.UTC(), r2.NextRunAt.UTC())
		tz := "UTC"
		r3, err := store.Update(ctx, "report", scheduler.Patch{Timezone: &tz})
		require.NoError(t, err)
		require.Equal(t, 6, r3.NextRunAt.UTC().Hour())
		// A new expression with the same next time keeps next_run_at.
		same := "0 6 * * 0-6"
		r4, err := store.Update(ctx, "report", scheduler.Patch{Cron: &same})
		require.NoError(t, err)
		require.Equal(t, r3.NextRunAt.UTC(), r4.NextRunAt.UTC())
		require.Equal(t, r3.NextRunAt.UTC(), getRow(t, pool, "report").NextRunAt.UTC())
		bad := "demo.nope"
		_, err = store.Update(ctx, "report", scheduler.Patch{Kind: &bad})
		var fieldErr *scheduler.FieldError
		require.ErrorAs(t, err, &fieldErr)
		require.Equal(t, "kind", fieldErr.Field)
		_, err = store.Update(ctx, "nope", scheduler.Patch{Timezone: &tz})
		var notFound *scheduler.NotFoundError
		require.ErrorAs(t, err, &notFound)
	})

	t.Run("trigger inserts one run now; the cadence is unchanged", func(t *testing.T) {
		before := getRow(t, pool, "report")
		id, err := store.Trigger(ctx, insertClient(t, pool), "report")
		require.NoError(t, err)
		jobs := jobsOf(t, pool, "report")
		require.Len(t, jobs, 1)
		require.Equal(t, id, jobs[0].ID)
		require.True(t, jobs[0].Meta.Trigger)
		require.JSONEq(t, `{"ms": 1, "ignore_cancel": false}`, string(jobs[0].Args))
		after := getRow(t, pool, "report")
		require.Equal(t, before.NextRunAt.UTC(), after.NextRunAt.UTC())
		require.Equal(t, id, *after.LastJobID)
		require.Equal(t, before.RunCount+1, after.RunCount)
		require.WithinDuration(t, time.Now(), *after.LastRunAt, time.Minute)
		require.Equal(t, after.LastRunAt.UTC(), jobs[0].Meta.DueAt)

		_, err = store.Trigger(ctx, insertClient(t, pool), "nope")
		var notFound *scheduler.NotFoundError
		require.ErrorAs(t, err, &notFound)
	})

	t.Run("disable and enable", func(t *testing.T) {
		_, changed, err := store.Disable(ctx, "report")
		require.NoError(t, err)
		require.True(t, changed)
		_, changed, err = store.Disable(ctx, "report")
		require.NoError(t, err)
		require.False(t, changed)
		r, changed, err := store.Enable(ctx, "report")
		require.NoError(t, err)
		require.True(t, changed)
		require.True(t, r.Enabled)
		_, changed, err = store.Enable(ctx, "report")
		require.NoError(t, err)
		require.False(t, changed)
	})

	t.Run("remove", func(t *testing.T) {
		require.NoError(t, store.Remove(ctx, "report"))
		err := store.Remove(ctx, "report")
		var notFound *scheduler.NotFoundError
		require.True(t, errors.As(err, &notFound))
		rows, err := store.List(ctx)
		require.NoError(t, err)
		require.Empty(t, rows)
	})
}
