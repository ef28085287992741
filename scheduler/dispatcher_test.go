package scheduler_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/scheduler"
)

// t0 is a round time the fake clocks start from.
var t0 = time.Date(2026, time.June, 1, 12, 0, 0, 0, time.UTC)

func TestDispatcherInitialisesNextRunAt(t *testing.T) {
	t.Parallel()

	url := newDB(t)
	pool := openPool(t, url)
	// As a kind's migration inserts its default schedule: next_run_at NULL.
	_, err := pool.Exec(context.Background(), `INSERT INTO schedules (name, cron, kind) VALUES ('hourly', '0 * * * *', 'demo.sleep')`)
	require.NoError(t, err)
	insertRow(t, pool, row{name: "ny-midnight", cron: "0 0 * * *", tz: "America/New_York"})
	insertRow(t, pool, row{name: "off", cron: "@every 5s"})
	_, err = pool.Exec(context.Background(), `UPDATE schedules SET enabled = false WHERE name = 'off'`)
	require.NoError(t, err)

	clock := newClock(t0.Add(10 * time.Minute))
	d := newDispatcher(t, url, scheduler.Config{Now: clock.Now})
	res := tick(t, d)
	require.Equal(t, 3, res.Initialised, "disabled rows are initialised too")
	require.Zero(t, res.Jobs, "initialising dispatches nothing")

	require.Equal(t, t0.Add(time.Hour), getRow(t, pool, "hourly").NextRunAt.UTC())
	require.Equal(t, time.Date(2026, time.June, 2, 4, 0, 0, 0, time.UTC), getRow(t, pool, "ny-midnight").NextRunAt.UTC(), "midnight EDT")
	require.Equal(t, t0.Add(10*time.Minute+5*time.Second), getRow(t, pool, "off").NextRunAt.UTC())

	// Nothing left to do: the next tick only peeks.
	res = tick(t, d)
	require.Equal(t, scheduler.TickResult{Sleep: d.PollInterval()}, res)

	// A changed cron (plain SQL) is recomputed: the trigger resets
	// next_run_at to NULL and the dispatcher computes it.
	_, err = pool.Exec(context.Background(), `UPDATE schedules SET cron = '30 * * * *' WHERE name = 'hourly'`)
	require.NoError(t, err)
	require.Nil(t, getRow(t, pool, "hourly").NextRunAt)
	tick(t, d)
	require.Equal(t, t0.Add(30*time.Minute), getRow(t, pool, "hourly").NextRunAt.UTC())
}

func TestDispatcherDispatches(t *testing.T) {
	t.Parallel()

	url := newDB(t)
	pool := openPool(t, url)
	due := t0
	insertRow(t, pool, row{name: "every-minute", cron: "* * * * *", args: `{"ms": 7}`, next: &due})
	_, err := pool.Exec(context.Background(), `UPDATE schedules SET queue = 'special' WHERE name = 'every-minute'`)
	require.NoError(t, err)
	later := t0.Add(time.Hour)
	insertRow(t, pool, row{name: "not-yet", cron: "0 * * * *", next: &later})

	clock := newClock(t0.Add(20 * time.Second))
	d := newDispatcher(t, url, scheduler.Config{Now: clock.Now})
	res := tick(t, d)
	require.Equal(t, 1, res.Dispatched)
	require.Equal(t, 1, res.Jobs)

	jobs := jobsOf(t, pool, "every-minute")
	require.Len(t, jobs, 1)
	j := jobs[0]
	require.Equal(t, "demo.sleep", j.Kind)
	require.Equal(t, "special", j.Queue)
	require.JSONEq(t, `{"ms": 7, "ignore_cancel": false}`, string(j.Args))
	require.Equal(t, due, j.Meta.DueAt)
	require.False(t, j.Meta.Trigger)
	require.Zero(t, j.Meta.Missed)

	r := getRow(t, pool, "every-minute")
	require.Equal(t, t0.Add(time.Minute), r.NextRunAt.UTC())
	require.Equal(t, due, r.LastRunAt.UTC())
	require.Equal(t, j.ID, *r.LastJobID)
	require.EqualValues(t, 1, r.RunCount)
	require.NotNil(t, r.LastDispatchedAt)
	require.Empty(t, jobsOf(t, pool, "not-yet"))

	// Same clock: nothing more is due.
	res = tick(t, d)
	require.Zero(t, res.Jobs)
	clock.Set(t0.Add(time.Minute))
	res = tick(t, d)
	require.Equal(t, 1, res.Jobs)
	require.Equal(t, []time.Time{t0, t0.Add(time.Minute)}, dueTimes(jobsOf(t, pool, "every-minute")))
}

// TestExactlyOnceRacingDispatchers races three dispatchers (each with its
// own pool) over a controllable clock advancing second by second: every due
// time of every schedule yields exactly one job.
func TestExactlyOnceRacingDispatchers(t *testing.T) {
	t.Parallel()

	url := newDB(t)
	pool := openPool(t, url)
	setSetting(t, pool, scheduler.SettingRunAllCap, 1000)
	type sched struct{ name, cron string }
	var scheds []sched
	for i := range 8 {
		scheds = append(scheds, sched{fmt.Sprintf("sec-%d", i), "* * * * * *"})
	}
	scheds = append(scheds, sched{"every-2s", "*/2 * * * * *"}, sched{"every-3s", "@every 3s"}, sched{"minute", "* * * * *"})
	start := t0
	for _, s := range scheds {
		next := start
		// run_all: a dispatcher that falls behind the clock still inserts
		// every due time, so every due time must show up exactly once.
		insertRow(t, pool, row{name: s.name, cron: s.cron, misfire: "run_all", next: &next})
	}

	clock := newClock(start)
	var dispatchers []*scheduler.Dispatcher
	for range 3 {
		dispatchers = append(dispatchers, newDispatcher(t, url, scheduler.Config{Now: clock.Now, BatchSize: 3}))
	}
	const steps = 120
	end := start.Add(steps * time.Second)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan error, 3)
	for _, d := range dispatchers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := d.Tick(context.Background()); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for range steps {
		time.Sleep(2 * time.Millisecond)
		clock.Add(time.Second)
	}
	// Let them catch up with the final time, then stop.
	require.Eventually(t, func() bool {
		var behind int
		require.NoError(t, pool.QueryRow(context.Background(),
			`SELECT count(*) FROM schedules WHERE next_run_at <= $1`, end).Scan(&behind))
		return behind == 0
	}, 60*time.Second, 20*time.Millisecond)
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	total := 0
	for _, s := range scheds {
		c, err := scheduler.ParseCron(s.cron, "UTC")
		require.NoError(t, err)
		want := []time.Time{start}
		for tt := c.Next(start); !tt.After(end); tt = c.Next(tt) {
			want = append(want, tt)
		}
		got := dueTimes(jobsOf(t, pool, s.name))
		require.Equal(t, len(want), len(got), "%s: one job per due time", s.name)
		for i := range want {
			require.True(t, want[i].Equal(got[i]), "%s: due time %d: want %s, got %s", s.name, i, want[i], got[i])
		}
		r := getRow(t, pool, s.name)
		require.EqualValues(t, len(want), r.RunCount, s.name)
		total += len(want)
	}
	var jobs int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM river_job`).Scan(&jobs))
	require.Equal(t, total, jobs, "no job without a schedule due time")
	var dup int
	require.NoError(t, pool.QueryRow(context.Background(), `
		SELECT count(*) FROM (
			SELECT metadata->>'schedule', metadata->>'due_at' FROM river_job
			GROUP BY 1, 2 HAVING count(*) > 1) d`).Scan(&dup))
	require.Zero(t, dup)
	var mismatched int
	require.NoError(t, pool.QueryRow(context.Background(), `
		SELECT count(*) FROM schedules s LEFT JOIN river_job j ON j.id = s.last_job_id
		WHERE j.id IS NULL OR j.metadata->>'schedule' <> s.name
		   OR (j.metadata->>'due_at')::timestamptz <> s.last_run_at`).Scan(&mismatched))
	require.Zero(t, mismatched, "last_job_id and last_run_at name the schedule's latest job")
}

// TestExactlyOnceRunningDispatchers runs three dispatchers for real (Run,
// database clock, NOTIFY) on per-second schedules for a few seconds.
func TestExactlyOnceRunningDispatchers(t *testing.T) {
	t.Parallel()

	url := newDB(t)
	pool := openPool(t, url)
	for i := range 5 {
		insertRow(t, pool, row{name: fmt.Sprintf("s%d", i), cron: "@every 1s", misfire: "run_all"})
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 3 {
		d := newDispatcher(t, url, scheduler.Config{PollInterval: 50 * time.Millisecond})
		wg.Go(func() { require.NoError(t, d.Run(ctx)) })
	}
	require.Eventually(t, func() bool {
		var min int
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT min(run_count) FROM schedules`).Scan(&min))
		return min >= 4
	}, 60*time.Second, 50*time.Millisecond)
	cancel()
	wg.Wait()

	for i := range 5 {
		name := fmt.Sprintf("s%d", i)
		got := dueTimes(jobsOf(t, pool, name))
		r := getRow(t, pool, name)
		require.EqualValues(t, len(got), r.RunCount)
		for k := 1; k < len(got); k++ {
			require.Equal(t, time.Second, got[k].Sub(got[k-1]), "%s: consecutive due times, none twice, none lost: %v", name, got)
		}
		require.Equal(t, got[len(got)-1].Add(time.Second), r.NextRunAt.UTC())
	}
}

func TestMisfirePolicies(t *testing.T) {
	t.Parallel()

	url := newDB(t)
	pool := openPool(t, url)
	// Workers were down from t0 to t0+35m; the schedules run every 10
	// minutes, so t0, +10m, +20m and +30m were missed, +30m by 5 minutes.
	down := t0
	for _, p := range []string{"run_once", "skip", "run_all"} {
		insertRow(t, pool, row{name: p, cron: "*/10 * * * *", misfire: p, next: &down})
	}
	clock := newClock(t0.Add(35 * time.Minute))
	d := newDispatcher(t, url, scheduler.Config{Now: clock.Now})
	res := tick(t, d)
	require.Equal(t, 3, res.Dispatched)

	once := jobsOf(t, pool, "run_once")
	require.Len(t, once, 1, "run_once: the missed due times collapse into one run")
	require.Equal(t, t0.Add(30*time.Minute), once[0].Meta.DueAt, "for the latest due time")
	require.Equal(t, 3, once[0].Meta.Missed)

	require.Empty(t, jobsOf(t, pool, "skip"), "skip: the latest due time is older than the grace (1m)")

	all := jobsOf(t, pool, "run_all")
	require.Equal(t, []time.Time{t0, t0.Add(10 * time.Minute), t0.Add(20 * time.Minute), t0.Add(30 * time.Minute)}, dueTimes(all))

	for _, p := range []string{"run_once", "skip", "run_all"} {
		require.Equal(t, t0.Add(40*time.Minute), getRow(t, pool, p).NextRunAt.UTC(), "%s: the next future due time", p)
	}
	require.Nil(t, getRow(t, pool, "skip").LastRunAt)
	require.EqualValues(t, 4, getRow(t, pool, "run_all").RunCount)

	t.Run("skip runs a due time within the grace", func(t *testing.T) {
		t.Parallel()
		url := newDB(t)
		pool := openPool(t, url)
		insertRow(t, pool, row{name: "skip", cron: "*/10 * * * *", misfire: "skip", next: &down})
		clock := newClock(t0.Add(30*time.Minute + 20*time.Second))
		tick(t, newDispatcher(t, url, scheduler.Config{Now: clock.Now}))
		jobs := jobsOf(t, pool, "skip")
		require.Len(t, jobs, 1)
		require.Equal(t, t0.Add(30*time.Minute), jobs[0].Meta.DueAt)
		require.Equal(t, 3, jobs[0].Meta.Missed)
	})

	t.Run("run_all is capped by scheduler.run_all_cap, keeping the most recent", func(t *testing.T) {
		t.Parallel()
		url := newDB(t)
		pool := openPool(t, url)
		setSetting(t, pool, scheduler.SettingRunAllCap, 3)
		insertRow(t, pool, row{name: "all", cron: "* * * * *", misfire: "run_all", next: &down})
		clock := newClock(t0.Add(10*time.Minute + 30*time.Second))
		tick(t, newDispatcher(t, url, scheduler.Config{Now: clock.Now}))
		jobs := jobsOf(t, pool, "all")
		require.Equal(t, []time.Time{t0.Add(8 * time.Minute), t0.Add(9 * time.Minute), t0.Add(10 * time.Minute)}, dueTimes(jobs))
		require.Equal(t, 8, jobs[0].Meta.Missed)
		require.Equal(t, t0.Add(11*time.Minute), getRow(t, pool, "all").NextRunAt.UTC())
	})

	t.Run("a month of downtime of a per-second schedule stays bounded", func(t *testing.T) {
		t.Parallel()
		url := newDB(t)
		pool := openPool(t, url)
		for _, p := range []string{"run_once", "run_all"} {
			insertRow(t, pool, row{name: p, cron: "* * * * * *", misfire: p, next: &down})
		}
		clock := newClock(t0.AddDate(0, 1, 0))
		tick(t, newDispatcher(t, url, scheduler.Config{Now: clock.Now}))
		once := jobsOf(t, pool, "run_once")
		require.Len(t, once, 1)
		require.Equal(t, clock.Now(), once[0].Meta.DueAt)
		require.Len(t, jobsOf(t, pool, "run_all"), scheduler.DefaultRunAllCap)
		require.Equal(t, clock.Now().Add(time.Second), getRow(t, pool, "run_all").NextRunAt.UTC())
	})
}

func TestDispatchersStopCleanly(t *testing.T) {
	t.Parallel()

	url := newDB(t)
	pool := openPool(t, url)
	insertRow(t, pool, row{name: "s", cron: "@every 1s"})
	d := newDispatcher(t, url, scheduler.Config{PollInterval: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	require.Eventually(t, func() bool { return getRow(t, pool, "s").RunCount >= 1 }, 30*time.Second, 20*time.Millisecond)
	require.False(t, d.LastTick().IsZero())
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, pool.QueryRow(context.Background(), `
			SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE '%LISTEN sluice_schedules%'`).Scan(&n))
		return n == 1
	}, 30*time.Second, 20*time.Millisecond, "the listener is up")
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	// No session of the dispatcher is left in a transaction or listening
	// (a closed connection leaves pg_stat_activity a moment later).
	require.Eventually(t, func() bool {
		var busy int
		require.NoError(t, pool.QueryRow(context.Background(), `
			SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid()
			  AND (state LIKE 'idle in transaction%' OR query LIKE '%LISTEN sluice_schedules%')`).Scan(&busy))
		return busy == 0
	}, 30*time.Second, 20*time.Millisecond)
}

// TestOwnUpdatesDoNotNotify: the dispatcher's bookkeeping (next_run_at
// moving later, failures) does not NOTIFY, so dispatchers do not wake each
// other for nothing; an operator's change does.
func TestOwnUpdatesDoNotNotify(t *testing.T) {
	t.Parallel()

	url := newDB(t)
	pool := openPool(t, url)
	due := t0
	insertRow(t, pool, row{name: "a", cron: "* * * * *", next: &due})
	insertRow(t, pool, row{name: "b", cron: "* * * * *", kind: "no.such.kind", next: &due})
	insertRow(t, pool, row{name: "c", cron: "* * * * *"})

	conn, err := pool.Acquire(context.Background())
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(context.Background(), "LISTEN sluice_schedules; LISTEN test_marker")
	require.NoError(t, err)

	clock := newClock(t0.Add(time.Second))
	res := tick(t, newDispatcher(t, url, scheduler.Config{Now: clock.Now}))
	require.Equal(t, scheduler.TickResult{Initialised: 1, Dispatched: 1, Jobs: 1, Failed: 1, Sleep: time.Second}, res)
	_, err = pool.Exec(context.Background(), "NOTIFY test_marker")
	require.NoError(t, err)
	// Notifications arrive in commit order: the marker comes first.
	n, err := conn.Conn().WaitForNotification(context.Background())
	require.NoError(t, err)
	require.Equal(t, "test_marker", n.Channel)

	_, err = pool.Exec(context.Background(), "UPDATE schedules SET next_run_at = next_run_at - interval '1 minute' WHERE name = 'a'")
	require.NoError(t, err)
	n, err = conn.Conn().WaitForNotification(context.Background())
	require.NoError(t, err)
	require.Equal(t, scheduler.NotifyChannel, n.Channel)
}

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()

	_, err := scheduler.New(scheduler.Config{})
	require.ErrorContains(t, err, "Pool is required")
}

// TestSchedulesTableTriggers covers the table's BEFORE UPDATE rules, as an
// operator using plain SQL meets them.
func TestSchedulesTableTriggers(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool := newPoolDB(t)
	due := t0
	insertRow(t, pool, row{name: "s", cron: "* * * * *", next: &due})
	exec := func(sql string) {
		t.Helper()
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err)
	}
	exec(`UPDATE schedules SET updated_at = '2000-01-01Z'`)
	exec(`UPDATE schedules SET next_run_at = next_run_at + interval '1 minute', run_count = 1`)
	require.Equal(t, time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC), getRow(t, pool, "s").UpdatedAt.UTC(), "bookkeeping keeps updated_at")
	exec(`UPDATE schedules SET misfire = 'skip'`)
	r := getRow(t, pool, "s")
	require.WithinDuration(t, time.Now(), r.UpdatedAt, time.Minute, "a definition change sets updated_at")
	require.NotNil(t, r.NextRunAt, "misfire does not touch the cadence")

	exec(`UPDATE schedules SET status = 'failed', failure_count = 6, retry_due_at = next_run_at`)
	exec(`UPDATE schedules SET status = 'active'`)
	require.Zero(t, getRow(t, pool, "s").FailureCount, "failed -> active resets failure_count")

	exec(`UPDATE schedules SET timezone = 'Europe/Paris'`)
	r = getRow(t, pool, "s")
	require.Nil(t, r.NextRunAt, "a new zone: next_run_at is recomputed by the dispatcher")
	require.Nil(t, r.RetryDueAt)
	exec(`UPDATE schedules SET cron = '0 * * * *', next_run_at = '2030-01-01Z'`)
	require.Equal(t, time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), getRow(t, pool, "s").NextRunAt.UTC(), "set in the same UPDATE: kept")
}

// TestDispatcherStartStop: Start runs the dispatcher in the background until
// Stop; a second Start is an error; Stop of a stopped dispatcher does
// nothing; a started dispatcher dispatches.
func TestDispatcherStartStop(t *testing.T) {
	t.Parallel()

	url := newDB(t)
	pool := openPool(t, url)
	// A poll interval long enough that the test's ticks stay few: a test
	// signal nobody waits for fills its channel.
	d := newDispatcher(t, url, scheduler.Config{PollInterval: time.Hour})
	d.TestSignals.Init(t)
	d.Stop() // not started: nothing to do
	require.NoError(t, d.Start(context.Background()))
	require.ErrorContains(t, d.Start(context.Background()), "already started")
	d.TestSignals.Ticked.WaitOrTimeout()
	insertRow(t, pool, row{name: "started", cron: "@every 1s"})
	require.Eventually(t, func() bool { return len(jobsOf(t, pool, "started")) > 0 }, 30*time.Second, 20*time.Millisecond)
	d.Stop()
	d.Stop()
	require.False(t, d.Listening(), "the listener stopped with the dispatcher")
}
