package scheduler_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/scheduler"
)

// failInserts makes every insert of a demo.sleep job with ms = 4242 fail,
// as a full disk or a broken constraint would.
func failInserts(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
		CREATE FUNCTION test_fail_insert() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.kind = 'demo.sleep' AND NEW.args->>'ms' = '4242' THEN
				RAISE EXCEPTION 'test: inserts of this job are refused';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER test_fail_insert BEFORE INSERT ON river_job
			FOR EACH ROW EXECUTE FUNCTION test_fail_insert();`)
	require.NoError(t, err)
}

func allowInserts(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `DROP TRIGGER test_fail_insert ON river_job`)
	require.NoError(t, err)
}

// TestFailedInsertBackoffAndFailedState: a failing insert fails only its own
// row (the batch's other rows are dispatched), is retried with exponential
// backoff, and after max_retries failed retries the row is failed; enable
// makes it active again.
func TestFailedInsertBackoffAndFailedState(t *testing.T) {
	t.Parallel()

	url := newDB(t)
	pool := openPool(t, url)
	failInserts(t, pool)
	setSetting(t, pool, scheduler.SettingRetryBackoffBase, "10s")
	setSetting(t, pool, scheduler.SettingRetryBackoffCap, "25s")
	due := t0
	insertRow(t, pool, row{name: "failing", cron: "0 * * * *", args: `{"ms": 4242}`, next: &due, maxRetries: 3})
	insertRow(t, pool, row{name: "healthy", cron: "0 * * * *", next: &due})

	clock := newClock(t0.Add(time.Second))
	d := newDispatcher(t, url, scheduler.Config{Now: clock.Now})
	res := tick(t, d)
	require.Equal(t, 1, res.Failed)
	require.Equal(t, 1, res.Jobs)
	require.Len(t, jobsOf(t, pool, "healthy"), 1, "the batch's other rows are dispatched")
	require.Empty(t, jobsOf(t, pool, "failing"))

	r := getRow(t, pool, "failing")
	require.EqualValues(t, 1, r.FailureCount)
	require.Contains(t, *r.LastError, "test: inserts of this job are refused")
	require.Equal(t, "active", r.Status)
	require.Equal(t, due, r.RetryDueAt.UTC(), "the due time being retried")
	require.Equal(t, clock.Now().Add(10*time.Second), r.NextRunAt.UTC(), "first retry after the base delay")

	// Not due before the backoff has passed.
	clock.Add(9 * time.Second)
	require.Zero(t, tick(t, d).Failed)

	// Retries 1 and 2 fail with doubling delays, capped at 25s.
	for i, wantDelay := range []time.Duration{20 * time.Second, 25 * time.Second} {
		clock.Set(getRow(t, pool, "failing").NextRunAt.UTC())
		require.Equal(t, 1, tick(t, d).Failed)
		r = getRow(t, pool, "failing")
		require.EqualValues(t, i+2, r.FailureCount)
		require.Equal(t, "active", r.Status)
		require.Equal(t, clock.Now().Add(wantDelay), r.NextRunAt.UTC())
	}
	// Retry 3 (= max_retries) fails too: the schedule is failed.
	clock.Set(getRow(t, pool, "failing").NextRunAt.UTC())
	require.Equal(t, 1, tick(t, d).Failed)
	r = getRow(t, pool, "failing")
	require.EqualValues(t, 4, r.FailureCount)
	require.Equal(t, "failed", r.Status)

	// Failed rows are no longer dispatched.
	clock.Add(time.Hour)
	require.Zero(t, tick(t, d).Failed)
	require.EqualValues(t, 4, getRow(t, pool, "failing").FailureCount)

	// Fixed and enabled again: active, counters reset, cadence from now.
	allowInserts(t, pool)
	store := scheduler.NewStore(pool, jobtest.Registry(t))
	r, changed, err := store.Enable(context.Background(), "failing")
	require.NoError(t, err)
	require.True(t, changed)
	require.Equal(t, "active", r.Status)
	require.Zero(t, r.FailureCount)
	require.Nil(t, r.LastError)
	require.Nil(t, r.RetryDueAt)
	require.True(t, r.NextRunAt.After(time.Now().Add(-time.Minute)), "recomputed from the database's now")
}

// TestRetrySucceeds: a retry that succeeds inserts the job for the due time
// that failed, and ends the retry.
func TestRetrySucceeds(t *testing.T) {
	t.Parallel()

	url := newDB(t)
	pool := openPool(t, url)
	failInserts(t, pool)
	setSetting(t, pool, scheduler.SettingRetryBackoffBase, "1s")
	due := t0
	insertRow(t, pool, row{name: "flaky", cron: "0 * * * *", args: `{"ms": 4242}`, next: &due})
	clock := newClock(t0)
	d := newDispatcher(t, url, scheduler.Config{Now: clock.Now})
	require.Equal(t, 1, tick(t, d).Failed)
	allowInserts(t, pool)
	clock.Add(time.Second)
	require.Equal(t, 1, tick(t, d).Jobs)
	jobs := jobsOf(t, pool, "flaky")
	require.Len(t, jobs, 1)
	require.Equal(t, due, jobs[0].Meta.DueAt, "the job stands for the due time that failed")
	r := getRow(t, pool, "flaky")
	require.Zero(t, r.FailureCount)
	require.Nil(t, r.LastError)
	require.Nil(t, r.RetryDueAt)
	require.Equal(t, t0.Add(time.Hour), r.NextRunAt.UTC())
}

// TestInvalidRowsFromSQL: rows written with plain SQL may hold an invalid
// cron, zone, kind, args or queue. Each is a failure recorded in last_error,
// retried with backoff and eventually failed: never a crash, never a hot
// loop, and the valid rows go on.
func TestInvalidRowsFromSQL(t *testing.T) {
	t.Parallel()

	url := newDB(t)
	pool := openPool(t, url)
	setSetting(t, pool, scheduler.SettingRetryBackoffBase, "1s")
	due := t0
	bad := []struct {
		r    row
		want string
	}{
		{row{name: "bad-cron", cron: "99 * * * *", next: &due}, `invalid cron "99 * * * *": minute field "99"`},
		{row{name: "bad-cron-null", cron: "not cron"}, `invalid cron "not cron"`},
		{row{name: "bad-zone", cron: "* * * * *", tz: "Moon/Base", next: &due}, `invalid timezone "Moon/Base"`},
		{row{name: "bad-kind", cron: "* * * * *", kind: "no.such.kind", next: &due}, `invalid kind "no.such.kind": not a job kind this binary knows`},
		{row{name: "bad-args", cron: "* * * * *", args: `{"ms": "x"}`, next: &due}, `invalid args: for demo.sleep: field "ms"`},
	}
	for _, b := range bad {
		b.r.maxRetries = 1
		insertRow(t, pool, b.r)
	}
	insertRow(t, pool, row{name: "bad-queue", cron: "* * * * *", next: &due})
	_, err := pool.Exec(context.Background(), `UPDATE schedules SET queue = 'No Such Queue', max_retries = 1 WHERE name = 'bad-queue'`)
	require.NoError(t, err)
	insertRow(t, pool, row{name: "good", cron: "* * * * *", next: &due})

	clock := newClock(t0.Add(time.Second))
	d := newDispatcher(t, url, scheduler.Config{Now: clock.Now})
	res := tick(t, d)
	require.Equal(t, 6, res.Failed)
	require.Equal(t, 1, res.Jobs)
	for _, b := range bad {
		r := getRow(t, pool, b.r.name)
		require.EqualValues(t, 1, r.FailureCount, b.r.name)
		require.Contains(t, *r.LastError, b.want, b.r.name)
		require.NotNil(t, r.NextRunAt, "%s: pushed out, not left due", b.r.name)
		require.True(t, r.NextRunAt.After(clock.Now()), b.r.name)
	}
	require.Contains(t, *getRow(t, pool, "bad-queue").LastError, `invalid queue "No Such Queue"`)

	// Second failure (max_retries 1): failed.
	clock.Add(2 * time.Second)
	require.Equal(t, 6, tick(t, d).Failed)
	var failed int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM schedules WHERE status = 'failed'`).Scan(&failed))
	require.Equal(t, 6, failed)
	var health string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT health FROM sluice_schedule_status WHERE name = 'bad-kind'`).Scan(&health))
	require.Equal(t, "failed", health)

	// From now on the failed rows cost nothing.
	clock.Add(time.Hour)
	res = tick(t, d)
	require.Zero(t, res.Failed)
	require.Equal(t, 1, res.Jobs, "good goes on (run_once after the hour)")

	// Enabling a row that is still invalid is refused, naming the field.
	_, _, err = scheduler.NewStore(pool, jobtest.Registry(t)).Enable(context.Background(), "bad-kind")
	require.ErrorContains(t, err, `invalid kind "no.such.kind"`)
	require.Equal(t, "failed", getRow(t, pool, "bad-kind").Status)
}

// TestCrashMidDispatch kills a dispatcher's connection while it inserts:
// nothing of its batch is committed, and another dispatcher then inserts
// exactly one job per due time.
func TestCrashMidDispatch(t *testing.T) {
	t.Parallel()

	url := newDB(t)
	pool := openPool(t, url)
	_, err := pool.Exec(context.Background(), `
		CREATE FUNCTION test_slow_insert() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF EXISTS (SELECT 1 FROM settings WHERE key = 'test.slow') THEN
				PERFORM pg_sleep(30);
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER test_slow_insert BEFORE INSERT ON river_job
			FOR EACH ROW EXECUTE FUNCTION test_slow_insert();`)
	require.NoError(t, err)
	setSetting(t, pool, "test.slow", true)
	due := t0
	insertRow(t, pool, row{name: "a", cron: "* * * * *", next: &due})
	insertRow(t, pool, row{name: "b", cron: "* * * * *", next: &due})
	clock := newClock(t0.Add(time.Second))

	victimPool := openPool(t, url)
	victim := newDispatcher(t, url, scheduler.Config{Now: clock.Now, Pool: victimPool})
	errc := make(chan error, 1)
	go func() {
		_, err := victim.Tick(context.Background())
		errc <- err
	}()
	// Wait until it sleeps in the insert, then kill its backend.
	var pid int
	require.Eventually(t, func() bool {
		err := pool.QueryRow(context.Background(), `
			SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event = 'PgSleep'`).Scan(&pid)
		return err == nil
	}, 30*time.Second, 10*time.Millisecond)
	_, err = pool.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, pid)
	require.NoError(t, err)
	select {
	case err := <-errc:
		require.Error(t, err, "the tick reports the lost connection")
	case <-time.After(30 * time.Second):
		t.Fatal("tick did not return")
	}
	var jobs int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM river_job`).Scan(&jobs))
	require.Zero(t, jobs)
	for _, name := range []string{"a", "b"} {
		r := getRow(t, pool, name)
		require.Equal(t, due, r.NextRunAt.UTC(), "not advanced")
		require.Zero(t, r.FailureCount, "a crash is not a dispatch failure")
	}

	_, err = pool.Exec(context.Background(), `DELETE FROM settings WHERE key = 'test.slow'`)
	require.NoError(t, err)
	other := newDispatcher(t, url, scheduler.Config{Now: clock.Now})
	require.Equal(t, 2, tick(t, other).Jobs)
	require.Zero(t, tick(t, other).Jobs)
	for _, name := range []string{"a", "b"} {
		require.Len(t, jobsOf(t, pool, name), 1)
	}
}

func TestSettingsDefaultsMatchMigration(t *testing.T) {
	t.Parallel()

	pool := newPoolDB(t)
	rows, err := pool.Query(context.Background(), `SELECT key, value::text, description FROM settings WHERE key LIKE 'scheduler.%'`)
	require.NoError(t, err)
	got := map[string]string{}
	for rows.Next() {
		var key, value, description string
		require.NoError(t, rows.Scan(&key, &value, &description))
		require.NotEmpty(t, strings.TrimSpace(description), key)
		got[key] = value
	}
	require.NoError(t, rows.Err())
	require.Equal(t, scheduler.SettingDefaults, got)

	// And the Go defaults are those values.
	for key, want := range map[string]time.Duration{
		scheduler.SettingRetryBackoffBase: scheduler.DefaultRetryBackoffBase,
		scheduler.SettingRetryBackoffCap:  scheduler.DefaultRetryBackoffCap,
		scheduler.SettingMisfireGrace:     scheduler.DefaultMisfireGrace,
	} {
		d, err := time.ParseDuration(strings.Trim(got[key], `"`))
		require.NoError(t, err)
		require.Equal(t, want, d, key)
	}
	require.Equal(t, "100", got[scheduler.SettingRunAllCap])
	require.Equal(t, 100, scheduler.DefaultRunAllCap)
}
