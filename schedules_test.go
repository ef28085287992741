package sluice_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/cli"
	"github.com/sluice-dev/sluice/kinds"
	"github.com/sluice-dev/sluice/scheduler"
)

// TickArgs are the args of the declared schedules' jobs; N must be
// positive.
type TickArgs struct {
	N int `json:"n"`
}

func (TickArgs) Kind() string { return "test.tick" }

func (a TickArgs) Validate() error {
	if a.N < 1 {
		return fmt.Errorf(`field "n": must be positive, got %d`, a.N)
	}
	return nil
}

// TickWorker works test.tick jobs: nothing to do.
type TickWorker struct{ river.WorkerDefaults[TickArgs] }

func (*TickWorker) Work(context.Context, *river.Job[TickArgs]) error { return nil }

func tickWorkers() *river.Workers {
	workers := river.NewWorkers()
	river.AddWorker(workers, &TickWorker{})
	return workers
}

// scheduleRow is what the tests read of a schedules row.
type scheduleRow struct {
	cron, timezone, source string
	enabled                bool
	priority               *int16
	tags                   []string
}

func readSchedule(t *testing.T, pool *pgxpool.Pool, name string) (scheduleRow, bool) {
	t.Helper()
	var r scheduleRow
	err := pool.QueryRow(context.Background(),
		`SELECT cron, timezone, source, enabled, priority, tags FROM schedules WHERE name = $1`, name).
		Scan(&r.cron, &r.timezone, &r.source, &r.enabled, &r.priority, &r.tags)
	if err != nil {
		require.ErrorContains(t, err, "no rows")
		return r, false
	}
	return r, true
}

// runFor starts a worker of cfg under id, runs it until until returns true
// (checked every 100ms, at most 30s), and stops it.
func runWorkers(t *testing.T, cfg sluice.Config, ids []string, until func() bool) {
	t.Helper()
	var ws []*sluice.Worker
	for _, id := range ids {
		c := cfg
		c.ID = id
		w, err := sluice.New(context.Background(), c)
		require.NoError(t, err)
		require.NoError(t, w.Start(context.Background()))
		ws = append(ws, w)
	}
	require.Eventually(t, until, 30*time.Second, 100*time.Millisecond)
	for _, w := range ws {
		require.NoError(t, stop(t, w))
	}
}

// TestDeclaredSchedules: schedules declared in Go are written at start
// with source config and run once per due time across two workers; an
// operator's change survives a restart; reset restores the declaration; a
// schedule no longer declared is removed; a declared one cannot be
// removed.
func TestDeclaredSchedules(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := testConfig(t, tickWorkers())
	cfg.HTTPAddr = ""
	cfg.SchedulePollInterval = 100 * time.Millisecond
	cfg.Schedules = []sluice.Schedule{
		{Name: "tick", Cron: "@every 1s", Args: TickArgs{N: 1},
			InsertOpts: &river.InsertOpts{Priority: 2, Tags: []string{"declared"}}},
		{Name: "nightly", Cron: "0 3 * * *", Timezone: "Europe/Berlin", Args: TickArgs{N: 2}},
		{Name: "gone", Cron: "@hourly", Args: TickArgs{N: 3}, Disabled: true},
	}
	pool := openPool(t, cfg.DatabaseURL)

	tickJobs := func() (jobs, dues int) {
		require.NoError(t, pool.QueryRow(ctx,
			`SELECT count(*), count(DISTINCT metadata->>'due_at') FROM river_job WHERE metadata->>'schedule' = 'tick'`).
			Scan(&jobs, &dues))
		return jobs, dues
	}
	// Two workers write the same declarations at once and share the
	// dispatching.
	runWorkers(t, cfg, []string{"declared-a", "declared-b"}, func() bool { n, _ := tickJobs(); return n >= 3 })
	jobs, dues := tickJobs()
	require.Equal(t, jobs, dues, "one job per due time across two workers")
	var priority int
	var tags []string
	require.NoError(t, pool.QueryRow(ctx,
		`SELECT priority, tags FROM river_job WHERE metadata->>'schedule' = 'tick' ORDER BY id LIMIT 1`).Scan(&priority, &tags))
	require.Equal(t, 2, priority)
	require.Equal(t, []string{"declared"}, tags)

	tick, ok := readSchedule(t, pool, "tick")
	require.True(t, ok)
	require.Equal(t, scheduleRow{cron: "@every 1s", timezone: "UTC", source: "config", enabled: true,
		priority: ptr[int16](2), tags: []string{"declared"}}, tick)
	gone, ok := readSchedule(t, pool, "gone")
	require.True(t, ok)
	require.False(t, gone.enabled)

	// The operator moves nightly to 4 o'clock with SQL.
	_, err := pool.Exec(ctx, `UPDATE schedules SET cron = '0 4 * * *' WHERE name = 'nightly'`)
	require.NoError(t, err)
	nightly, _ := readSchedule(t, pool, "nightly")
	require.Equal(t, "sql", nightly.source)

	// The next deploy changes tick, keeps nightly and drops gone.
	cfg.Schedules = []sluice.Schedule{
		{Name: "tick", Cron: "@every 2s", Args: TickArgs{N: 1}},
		{Name: "nightly", Cron: "0 3 * * *", Timezone: "Europe/Berlin", Args: TickArgs{N: 2}},
	}
	runWorkers(t, cfg, []string{"declared-c"}, func() bool { return true })
	tick, _ = readSchedule(t, pool, "tick")
	require.Equal(t, scheduleRow{cron: "@every 2s", timezone: "UTC", source: "config", enabled: true}, tick)
	nightly, _ = readSchedule(t, pool, "nightly")
	require.Equal(t, "0 4 * * *", nightly.cron, "the operator's change outlives the restart")
	require.Equal(t, "sql", nightly.source)
	_, ok = readSchedule(t, pool, "gone")
	require.False(t, ok, "a schedule no longer declared is removed")

	// schedule reset, through the command line.
	run := func(args ...string) (int, string) {
		var out, errOut bytes.Buffer
		code := cli.Run(ctx, cfg, append([]string{"--database-url", cfg.DatabaseURL}, args...), &out, &errOut)
		return code, out.String() + errOut.String()
	}
	code, out := run("schedule", "reset", "nightly")
	require.Equal(t, 0, code, out)
	nightly, _ = readSchedule(t, pool, "nightly")
	require.Equal(t, scheduleRow{cron: "0 3 * * *", timezone: "Europe/Berlin", source: "config", enabled: true}, nightly)
	code, out = run("schedule", "reset", "gone")
	require.Equal(t, 2, code, out)
	require.Contains(t, out, `schedule "gone" is not declared`)
	code, out = run("schedule", "remove", "tick")
	require.Equal(t, 2, code, out)
	require.Contains(t, out, "sluice schedule disable tick")
	_, ok = readSchedule(t, pool, "tick")
	require.True(t, ok, "a refused remove changes nothing")

	// An operator's disable is a change too: it outlives the restart.
	code, out = run("schedule", "disable", "tick")
	require.Equal(t, 0, code, out)
	code, out = run("schedule", "list")
	require.Equal(t, 0, code, out)
	require.Regexp(t, `(?m)^tick\s+@every 2s\s+UTC\s+test.tick\s+false\s+active\s+sql\s`, out)
	runWorkers(t, cfg, []string{"declared-d"}, func() bool { return true })
	tick, _ = readSchedule(t, pool, "tick")
	require.False(t, tick.enabled)
	require.Equal(t, "sql", tick.source)
}

// TestDeclaredSchedulesRefused: a bad declaration is refused by New and by
// Main before anything runs, naming the schedule, and writes nothing.
func TestDeclaredSchedulesRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testConfig(t, nil).DatabaseURL
	for name, tc := range map[string]struct {
		decl sluice.Schedule
		want string
	}{
		"cron":     {sluice.Schedule{Name: "bad-cron", Cron: "61 * * * *", Args: TickArgs{N: 1}}, `schedule bad-cron: invalid cron "61 * * * *": minute field "61": 61 out of range`},
		"zone":     {sluice.Schedule{Name: "bad-zone", Cron: "@daily", Timezone: "Mars/Olympus", Args: TickArgs{N: 1}}, `schedule bad-zone: invalid timezone "Mars/Olympus"`},
		"kind":     {sluice.Schedule{Name: "bad-kind", Cron: "@daily", Args: GreetArgs{Name: "x"}}, `schedule bad-kind: invalid kind "greet": not a job kind this binary knows`},
		"validate": {sluice.Schedule{Name: "bad-args", Cron: "@daily", Args: TickArgs{N: 0}}, `schedule bad-args: invalid args: for test.tick: field "n": must be positive, got 0`},
		"nil args": {sluice.Schedule{Name: "no-args", Cron: "@daily"}, `schedule no-args: invalid args: Args is nil`},
		"name":     {sluice.Schedule{Name: "bad name", Cron: "@daily", Args: TickArgs{N: 1}}, `schedule bad name: invalid name "bad name"`},
		"priority": {sluice.Schedule{Name: "bad-prio", Cron: "@daily", Args: TickArgs{N: 1}, InsertOpts: &river.InsertOpts{Priority: 9}}, `schedule bad-prio: invalid InsertOpts.Priority "9"`},
		"unique":   {sluice.Schedule{Name: "bad-unique", Cron: "@daily", Args: TickArgs{N: 1}, InsertOpts: &river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}}, `schedule bad-unique: invalid InsertOpts.UniqueOpts`},
		"misfire":  {sluice.Schedule{Name: "bad-misfire", Cron: "@daily", Args: TickArgs{N: 1}, Misfire: "later"}, `schedule bad-misfire: invalid misfire "later"`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := sluice.Config{DatabaseURL: url, Workers: tickWorkers(), Schedules: []sluice.Schedule{tc.decl}}
			_, err := sluice.New(ctx, cfg)
			require.ErrorContains(t, err, tc.want)
			var out, errOut bytes.Buffer
			code := cli.Run(ctx, cfg, []string{"schedule", "list", "--database-url", url}, &out, &errOut)
			require.Equal(t, 1, code)
			require.Contains(t, errOut.String(), tc.want)
			require.Empty(t, out.String())
		})
	}
	t.Run("twice", func(t *testing.T) {
		t.Parallel()
		d := sluice.Schedule{Name: "twice", Cron: "@daily", Args: TickArgs{N: 1}}
		_, err := sluice.New(ctx, sluice.Config{DatabaseURL: url, Workers: tickWorkers(), Schedules: []sluice.Schedule{d, d}})
		require.ErrorContains(t, err, "schedule twice is declared twice")
	})
	// Refused before anything ran: nothing was written.
	var n int
	require.NoError(t, openPool(t, url).QueryRow(ctx,
		`SELECT (SELECT count(*) FROM schedule_declarations) + (SELECT count(*) FROM schedules WHERE kind = 'test.tick')`).Scan(&n))
	require.Zero(t, n)
}

// TestCompileDeclaredKinds: the kind of a declared schedule comes from its
// typed args, and its args are stored as their JSON.
func TestCompileDeclaredKinds(t *testing.T) {
	t.Parallel()
	reg, err := kinds.New(kinds.Of[TickArgs]())
	require.NoError(t, err)
	rows, err := scheduler.CompileDeclared(reg, []sluice.Schedule{{Name: "k", Cron: "@every 15m", Args: TickArgs{N: 7},
		InsertOpts: &river.InsertOpts{Queue: "ticks", MaxAttempts: 3}}})
	require.NoError(t, err)
	require.Equal(t, "test.tick", rows[0].Kind)
	require.JSONEq(t, `{"n":7}`, string(rows[0].Args))
	require.Equal(t, "ticks", rows[0].Queue)
	require.Equal(t, 3, rows[0].MaxAttempts)
	require.True(t, rows[0].Enabled)
	var fieldErr *scheduler.FieldError
	_, err = scheduler.CompileDeclared(reg, []sluice.Schedule{{Name: "k", Cron: "@every 15m", Args: TickArgs{N: 1},
		InsertOpts: &river.InsertOpts{Tags: []string{"no spaces"}}}})
	require.True(t, errors.As(err, &fieldErr), "%v", err)
	require.Equal(t, "InsertOpts.Tags", fieldErr.Field)
}

func ptr[T any](v T) *T { return &v }
