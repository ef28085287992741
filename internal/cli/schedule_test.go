package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/scheduler"
)

// scheduleTables are the tables a rejected schedule command must not change.
var scheduleTables = []string{"schedules", "river_job", "settings", "sluice_workers"}

func TestScheduleCLI(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	pool, err := pgkit.Open(context.Background(), url, 10*time.Second)
	require.NoError(t, err)
	defer pool.Close()
	// Only this test's schedules, not the built-in kinds' defaults.
	_, err = pool.Exec(context.Background(), "DELETE FROM schedules")
	require.NoError(t, err)
	cli := func(wantCode int, args ...string) string {
		t.Helper()
		code, stdout, stderr := runCLI(t, append([]string{"--database-url", url}, args...)...)
		require.Equal(t, wantCode, code, "args=%v stdout=%q stderr=%q", args, stdout, stderr)
		return stdout + stderr
	}

	out := cli(0, "schedule", "add", "--name", "nightly", "--cron", "30 2 * * *", "--tz", "America/New_York",
		"--kind", "demo.sleep", "--args", `{"ms": 5}`, "--misfire", "skip", "--max-retries", "2")
	require.Regexp(t, `^schedule nightly added: next run at \d{4}-\d\d-\d\dT0[67]:30:00Z\n$`, out)
	out = cli(0, "schedule", "add", "--name", "tick", "--cron", "@every 5s", "--kind", "demo.sleep", "--disabled")
	require.Equal(t, "schedule tick added: disabled\n", out)

	// A row from plain SQL (as a migration writes it) has no next_run_at
	// until a worker computes it; its next due time shows all the same.
	_, err = pool.Exec(context.Background(), `INSERT INTO schedules (name, cron, timezone, kind) VALUES ('fromsql', '0 9 ? * 5#3', 'Europe/London', 'demo.sleep')`)
	require.NoError(t, err)
	_, err = pool.Exec(context.Background(), `INSERT INTO schedules (name, cron, kind) VALUES ('badsql', '*/61 * * * *', 'demo.sleep')`)
	require.NoError(t, err)

	out = cli(0, "schedule", "list")
	require.Regexp(t, `(?m)^NAME\s+CRON\s+TIMEZONE\s+KIND\s+ENABLED\s+STATUS\s+SOURCE\s+NEXT RUN\s+NEXT DUE\s+LAST RUN\s+RUNS\s+LAST ERROR$`, out)
	m := regexp.MustCompile(`(?m)^nightly\s+30 2 \* \* \*\s+America/New_York\s+demo\.sleep\s+true\s+active\s+sql\s+(\S+Z)\s+(\S+)\s+-\s+0\s+-$`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	nextRun, err := time.Parse(time.RFC3339, m[1])
	require.NoError(t, err)
	nextDue, err := time.Parse(time.RFC3339, m[2])
	require.NoError(t, err)
	require.True(t, nextRun.Equal(nextDue), "NEXT DUE %s is next_run_at %s", m[2], m[1])
	require.Regexp(t, `T0[23]:30:00-0[45]:00$`, m[2], "NEXT DUE is local time with its offset")
	require.Regexp(t, `(?m)^tick\s+@every 5s\s+UTC\s+demo\.sleep\s+false\s+active\s+sql\s+\S+Z\s+-\s+-`, out, "disabled: no due time")
	m = regexp.MustCompile(`(?m)^fromsql\s+0 9 \? \* 5#3\s+Europe/London\s+demo\.sleep\s+true\s+active\s+sql\s+-\s+(\S+)\s`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	due, err := time.Parse(time.RFC3339, m[1])
	require.NoError(t, err)
	require.Equal(t, time.Friday, due.Weekday())
	require.Equal(t, 3, (due.Day()-1)/7+1, "the third Friday")
	require.Equal(t, 9, due.Hour())
	require.Regexp(t, `(?m)^badsql\s+\*/61 \* \* \* \*\s+UTC\s+demo\.sleep\s+true\s+active\s+sql\s+-\s+invalid\s`, out)
	_, err = pool.Exec(context.Background(), `DELETE FROM schedules WHERE name IN ('fromsql', 'badsql')`)
	require.NoError(t, err)

	var list []map[string]any
	require.NoError(t, json.Unmarshal([]byte(cli(0, "schedule", "list", "--json")), &list))
	require.Len(t, list, 2)
	require.Equal(t, "nightly", list[0]["name"])
	require.Equal(t, map[string]any{"ms": float64(5)}, list[0]["args"])
	require.Equal(t, "skip", list[0]["misfire"])
	require.EqualValues(t, 2, list[0]["max_retries"])
	require.Nil(t, list[0]["queue"])
	require.Regexp(t, `Z$`, list[0]["next_run_at"])
	require.Equal(t, list[0]["next_run_at"], list[0]["next_due_at"])
	require.Nil(t, list[1]["next_due_at"], "disabled")

	// update: a new cron recomputes next_run_at; other fields keep theirs.
	out = cli(0, "schedule", "update", "nightly", "--cron", "0 4 * * *")
	require.Regexp(t, `^schedule nightly updated: next run at \S+T0[89]:00:00Z\n$`, out)
	row, err := db.New(pool).GetSchedule(context.Background(), "nightly")
	require.NoError(t, err)
	require.Equal(t, "America/New_York", row.Timezone)
	require.Equal(t, "skip", row.Misfire)
	require.Equal(t, 4, row.NextRunAt.In(mustZone(t, "America/New_York")).Hour())
	cli(0, "schedule", "update", "nightly", "--queue", "reports")
	cli(0, "schedule", "update", "nightly", "--queue", "")
	row, err = db.New(pool).GetSchedule(context.Background(), "nightly")
	require.NoError(t, err)
	require.Nil(t, row.Queue, `--queue "" goes back to the kind's queue`)

	require.Equal(t, "schedule nightly disabled\n", cli(0, "schedule", "disable", "nightly"))
	require.Equal(t, "schedule nightly is disabled already\n", cli(0, "schedule", "disable", "nightly"))
	require.Regexp(t, `^schedule nightly enabled: next run at \S+Z\n$`, cli(0, "schedule", "enable", "nightly"))
	require.Regexp(t, `^schedule nightly is enabled already`, cli(0, "schedule", "enable", "nightly"))

	// enable makes a failed schedule active again.
	_, err = pool.Exec(context.Background(), `UPDATE schedules SET status = 'failed', failure_count = 3, last_error = 'boom' WHERE name = 'tick'`)
	require.NoError(t, err)
	require.Regexp(t, `(?m)^tick\s.*\sfailed\s.*\sboom$`, cli(0, "schedule", "list"))
	cli(0, "schedule", "enable", "tick")
	row, err = db.New(pool).GetSchedule(context.Background(), "tick")
	require.NoError(t, err)
	require.True(t, row.Enabled)
	require.Equal(t, "active", row.Status)
	require.Zero(t, row.FailureCount)
	require.Nil(t, row.LastError)

	// trigger: one job now, cadence unchanged.
	before, err := db.New(pool).GetSchedule(context.Background(), "nightly")
	require.NoError(t, err)
	out = cli(0, "schedule", "trigger", "nightly")
	m = regexp.MustCompile(`^schedule nightly triggered: job (\d+)\n$`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	var kind, schedule string
	var trigger bool
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT kind, metadata->>'schedule', (metadata->>'trigger')::bool FROM river_job WHERE id = $1`, m[1]).Scan(&kind, &schedule, &trigger))
	require.Equal(t, "demo.sleep", kind)
	require.Equal(t, "nightly", schedule)
	require.True(t, trigger)
	after, err := db.New(pool).GetSchedule(context.Background(), "nightly")
	require.NoError(t, err)
	require.Equal(t, before.NextRunAt.UTC(), after.NextRunAt.UTC())
	require.Equal(t, before.RunCount+1, after.RunCount)

	require.Equal(t, "schedule tick removed\n", cli(0, "schedule", "remove", "tick"))
	require.NotContains(t, cli(0, "schedule", "list"), "tick")
}

func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	require.NoError(t, err)
	return loc
}

// TestScheduleBadInput: every rejected schedule command exits 2 with one
// line naming the field and the reason, and changes nothing.
func TestScheduleBadInput(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	pool, err := pgkit.Open(context.Background(), url, 10*time.Second)
	require.NoError(t, err)
	defer pool.Close()
	code, _, stderr := runCLI(t, "--database-url", url, "schedule", "add", "--name", "existing", "--cron", "0 * * * *", "--kind", "demo.sleep")
	require.Equal(t, 0, code, stderr)
	// A row written with plain SQL, invalid for this binary.
	_, err = pool.Exec(context.Background(), `INSERT INTO schedules (name, cron, kind) VALUES ('sqlrow', '0 * * * *', 'gone.kind')`)
	require.NoError(t, err)
	before := testdb.Checksum(t, pool, scheduleTables...)

	add := func(extra ...string) []string {
		base := map[string]string{"--name": "n", "--cron": "0 * * * *", "--kind": "demo.sleep"}
		args := []string{"schedule", "add"}
		for i := 0; i < len(extra); i += 2 {
			if _, ok := base[extra[i]]; ok {
				base[extra[i]] = extra[i+1]
				continue
			}
			args = append(args, extra[i], extra[i+1])
		}
		for _, f := range []string{"--name", "--cron", "--kind"} {
			if base[f] != "-" {
				args = append(args, f, base[f])
			}
		}
		return args
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no subcommand", []string{"schedule"}, "needs a subcommand"},
		{"unknown subcommand", []string{"schedule", "pause", "x"}, `unknown subcommand "pause"`},
		{"add without name", add("--name", "-"), "--name is required"},
		{"add without cron", add("--cron", "-"), "--cron is required"},
		{"add without kind", add("--kind", "-"), "--kind is required"},
		{"add bad name", add("--name", "no spaces"), `invalid name "no spaces"`},
		{"add existing name", add("--name", "existing"), `a schedule named "existing" already exists`},
		{"add bad cron", add("--cron", "0 0 * *"), `invalid cron "0 0 * *": want 5 fields`},
		{"add bad cron field", add("--cron", "0 0 32 * *"), `invalid cron "0 0 32 * *": day-of-month field "32"`},
		{"add bad every", add("--cron", "@every 0s"), "at least 1s"},
		{"add minute 60", add("--cron", "60 * * * *"), `invalid cron "60 * * * *": minute field "60": 60 out of range: want 0 to 59`},
		{"add hour 24", add("--cron", "* 24 * * *"), `invalid cron "* 24 * * *": hour field "24": 24 out of range: want 0 to 23`},
		{"add step 0", add("--cron", "*/0 * * * *"), `minute field "*/0": step 0 out of range: want 1 to 60`},
		{"add step 61", add("--cron", "*/61 * * * *"), `minute field "*/61": step 61 out of range: want 1 to 60`},
		{"add empty list item", add("--cron", "0 1,,2 * * *"), `hour field "1,,2": empty list item`},
		{"add L outside day-of-month", add("--cron", "0 0 * * L"), `day-of-week field "L": L (the last day of the month) is allowed only in the day-of-month field`},
		{"add # outside day-of-week", add("--cron", "0 0 5#3 * *"), `day-of-month field "5#3": N#k (the k-th weekday N of the month) is allowed only in the day-of-week field`},
		{"add unknown descriptor", add("--cron", "@fortnightly"), `invalid cron "@fortnightly": unknown descriptor`},
		{"add every below 1s", add("--cron", "@every 500ms"), "@every: the interval must be at least 1s, got 500ms"},
		{"add every fraction", add("--cron", "@every 1500ms"), "@every: the interval must be a whole number of seconds, got 1.5s"},
		{"add bad zone", add("--tz", "Atlantis/Capital"), `invalid timezone "Atlantis/Capital": unknown time zone`},
		{"add offset zone", add("--tz", "+05:00"), `invalid timezone "+05:00": unknown time zone`},
		{"add unknown kind", add("--kind", "demo.slep"), `invalid kind "demo.slep"`},
		{"add malformed args", add("--args", `{"ms":`), "invalid args: for demo.sleep: malformed JSON"},
		{"add args not object", add("--args", `[]`), "must be a JSON object"},
		{"add bad args", add("--args", `{"ms": -3}`), `field "ms": must be between`},
		{"add unknown arg", add("--args", `{"msec": 3}`), `unknown field "msec"`},
		{"add bad queue", add("--queue", "Q Q"), `invalid queue "Q Q"`},
		{"add bad misfire", add("--misfire", "never"), `invalid misfire "never": want run_once, skip or run_all`},
		{"add bad retries", add("--max-retries", "-1"), `invalid max_retries "-1"`},
		{"add retries not a number", add("--max-retries", "few"), "invalid argument"},
		{"add positional", append(add(), "extra"), "expects no arguments"},
		{"update unknown", []string{"schedule", "update", "nope", "--cron", "* * * * *"}, `no schedule named "nope"`},
		{"update nothing", []string{"schedule", "update", "existing"}, "nothing to update"},
		{"update bad cron", []string{"schedule", "update", "existing", "--cron", "x"}, `invalid cron "x"`},
		{"update bad step", []string{"schedule", "update", "existing", "--cron", "0 */25 * * *"}, `hour field "*/25": step 25 out of range`},
		{"update bad zone", []string{"schedule", "update", "existing", "--tz", "Europe/Atlantis"}, `invalid timezone "Europe/Atlantis"`},
		{"update bad kind", []string{"schedule", "update", "existing", "--kind", "x"}, `invalid kind "x"`},
		{"update args for kind", []string{"schedule", "update", "existing", "--args", `{"nope": 1}`}, `unknown field "nope"`},
		{"update no name", []string{"schedule", "update", "--cron", "* * * * *"}, "expects a schedule NAME"},
		{"remove unknown", []string{"schedule", "remove", "nope"}, `no schedule named "nope"`},
		{"remove two", []string{"schedule", "remove", "a", "b"}, "expects a schedule NAME"},
		{"enable unknown", []string{"schedule", "enable", "nope"}, `no schedule named "nope"`},
		{"enable invalid row", []string{"schedule", "disable", "sqlrow"}, ""},
		{"disable unknown", []string{"schedule", "disable", "nope"}, `no schedule named "nope"`},
		{"trigger unknown", []string{"schedule", "trigger", "nope"}, `no schedule named "nope"`},
		{"trigger invalid row", []string{"schedule", "trigger", "sqlrow"}, `schedule "sqlrow": invalid kind "gone.kind"`},
		{"list positional", []string{"schedule", "list", "x"}, "expects no arguments"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.want == "" {
				// Disabling an invalid row is allowed; set it back.
				code, _, stderr := runCLI(t, "--database-url", url, "schedule", "disable", "sqlrow")
				require.Equal(t, 0, code, stderr)
				_, err := pool.Exec(context.Background(), `UPDATE schedules SET enabled = true WHERE name = 'sqlrow'`)
				require.NoError(t, err)
				code, _, stderr = runCLI(t, "--database-url", url, "schedule", "enable", "sqlrow")
				require.Equal(t, 0, code, "enabled already: nothing to check: %s", stderr)
				return
			}
			code, stdout, stderr := runCLI(t, append([]string{"--database-url", url}, tc.args...)...)
			require.Equal(t, 2, code, "stdout=%q stderr=%q", stdout, stderr)
			require.Contains(t, stderr, tc.want)
			require.True(t, strings.HasPrefix(stderr, "sluice: "), stderr)
			require.Equal(t, 1, strings.Count(strings.SplitN(stderr, "Run '", 2)[0], "\n"), "one line: %q", stderr)
			require.Empty(t, stdout)
		})
	}
	// The trigger on disable/enable of sqlrow above resets next_run_at:
	// compare without it.
	_, err = pool.Exec(context.Background(), `UPDATE schedules SET next_run_at = NULL, updated_at = created_at WHERE name = 'sqlrow'`)
	require.NoError(t, err)
	require.Equal(t, before, testdb.Checksum(t, pool, scheduleTables...), "a rejected command changed the database")

	// A failed row that is still invalid cannot be enabled.
	_, err = pool.Exec(context.Background(), `UPDATE schedules SET status = 'failed' WHERE name = 'sqlrow'`)
	require.NoError(t, err)
	code, _, stderr = runCLI(t, "--database-url", url, "schedule", "enable", "sqlrow")
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, `schedule "sqlrow": invalid kind "gone.kind"`)
	require.Contains(t, stderr, "sluice schedule update sqlrow")
}

// TestScheduleNextCLI: schedule next prints the due times the dispatcher's
// code computes, UTC then local time, without a database.
func TestScheduleNextCLI(t *testing.T) {
	t.Parallel()

	next := func(args ...string) string {
		t.Helper()
		code, stdout, stderr := runCLI(t, append([]string{"schedule", "next"}, args...)...)
		require.Equal(t, 0, code, "args=%v stderr=%q", args, stderr)
		require.Empty(t, stderr)
		return stdout
	}
	// The spring-forward night: the skipped 02:xx run after the jump.
	require.Equal(t, `2026-03-08T07:00:00Z  2026-03-08T03:00:00-04:00
2026-03-08T07:15:00Z  2026-03-08T03:15:00-04:00
2026-03-08T07:30:00Z  2026-03-08T03:30:00-04:00
2026-03-08T07:45:00Z  2026-03-08T03:45:00-04:00
2026-03-09T06:00:00Z  2026-03-09T02:00:00-04:00
`, next("*/15 2 * * *", "--tz", "America/New_York", "--from", "2026-03-08T00:00:00-05:00", "--count", "5"))
	// The fall-back night: 01:30 once, at its first occurrence; every
	// hour follows real time.
	require.Equal(t, "2026-11-01T05:30:00Z  2026-11-01T01:30:00-04:00\n2026-11-02T06:30:00Z  2026-11-02T01:30:00-05:00\n",
		next("30 1 * * *", "--tz", "America/New_York", "--from", "2026-11-01T00:00:00-04:00", "--count", "2"))
	require.Equal(t, "2026-11-01T05:00:00Z  2026-11-01T01:00:00-04:00\n2026-11-01T06:00:00Z  2026-11-01T01:00:00-05:00\n",
		next("0 * * * *", "--tz", "America/New_York", "--from", "2026-11-01T04:30:00Z", "--count", "2"))
	// A leap day eight years away; the new syntax.
	require.Equal(t, "2104-02-29T00:00:00Z  2104-02-29T00:00:00+00:00\n", next("0 0 29 2 *", "--from", "2096-03-01T00:00:00Z", "--count", "1"))
	require.Equal(t, "2026-05-10T00:00:00Z  2026-05-10T00:00:00+00:00\n2026-05-15T00:00:00Z  2026-05-15T00:00:00+00:00\n",
		next("0 0 * * 5-7", "--from", "2026-05-09T12:00:00Z", "--count", "2"))
	require.Equal(t, "2026-05-30T23:00:00Z  2026-05-31T00:00:00+01:00\n", next("0 0 L * ?", "--tz", "Europe/London", "--from", "2026-05-20T00:00:00Z", "--count", "1"))
	require.Equal(t, "2026-06-19T09:00:00Z  2026-06-19T09:00:00+00:00\n", next("0 9 ? * 5#3", "--from", "2026-05-20T00:00:00Z", "--count", "1"))
	// RFC 3339 ends with the year 9999: the listing stops there, saying so.
	code, stdout, stderr := runCLI(t, "schedule", "next", "30 0 1 1 *", "--from", "9999-12-31T23:30:00Z", "--count", "3")
	require.Equal(t, 0, code, stderr)
	require.Empty(t, stdout)
	require.Equal(t, "no further due time before the year 10000\n", stderr)
	// It is the dispatcher's code: the same times as scheduler.Cron.
	c, err := scheduler.ParseCron("*/7 1-3 * * 1-7", "Australia/Lord_Howe")
	require.NoError(t, err)
	var want strings.Builder
	at := time.Date(2025, time.October, 4, 14, 0, 0, 0, time.UTC)
	for range 50 {
		at = c.Next(at)
		fmt.Fprintf(&want, "%s  %s\n", at.UTC().Format(time.RFC3339), at.In(c.Location()).Format("2006-01-02T15:04:05-07:00"))
	}
	require.Equal(t, want.String(), next("*/7 1-3 * * 1-7", "--tz", "Australia/Lord_Howe", "--from", "2025-10-04T14:00:00Z", "--count", "50"))
	// Default: 10 times after now.
	lines := strings.Split(strings.TrimSuffix(next("@hourly"), "\n"), "\n")
	require.Len(t, lines, 10)
	require.Regexp(t, `^\S+:00:00Z  \S+:00:00\+00:00$`, lines[0])

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"minute 60", []string{"60 * * * *"}, `invalid cron "60 * * * *": minute field "60": 60 out of range: want 0 to 59`},
		{"hour 24", []string{"* 24 * * *"}, `hour field "24": 24 out of range: want 0 to 23`},
		{"step 0", []string{"*/0 * * * *"}, `minute field "*/0": step 0 out of range`},
		{"step 61", []string{"*/61 * * * *"}, `minute field "*/61": step 61 out of range`},
		{"empty list item", []string{"0,,30 * * * *"}, `minute field "0,,30": empty list item`},
		{"L in the minutes", []string{"L * * * *"}, `minute field "L": L (the last day of the month) is allowed only in the day-of-month field`},
		{"# in the month", []string{"0 0 * 1#2 *"}, `month field "1#2": N#k (the k-th weekday N of the month) is allowed only in the day-of-week field`},
		{"unknown descriptor", []string{"@sometimes"}, `invalid cron "@sometimes": unknown descriptor`},
		{"every below 1s", []string{"@every 100ms"}, "at least 1s"},
		{"every fraction", []string{"@every 2.5s"}, "whole number of seconds"},
		{"never fires", []string{"0 0 31 2 *"}, "never fires"},
		{"zone", []string{"* * * * *", "--tz", "Moon/Tranquility"}, `invalid timezone "Moon/Tranquility": unknown time zone`},
		{"local zone", []string{"* * * * *", "--tz", "Local"}, `invalid timezone "Local"`},
		{"count 0", []string{"* * * * *", "--count", "0"}, "invalid --count 0: want 1 to 10000"},
		{"count too many", []string{"* * * * *", "--count", "10001"}, "invalid --count 10001"},
		{"count not a number", []string{"* * * * *", "--count", "many"}, `invalid argument "many" for "--count"`},
		{"from", []string{"* * * * *", "--from", "2026-03-08"}, `invalid --from "2026-03-08": want an RFC 3339 time`},
		{"unquoted", []string{"0", "2", "*", "*", "*"}, "expects one cron EXPR (quote it"},
		{"no expression", nil, "expects one cron EXPR"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, append([]string{"schedule", "next"}, tc.args...)...)
			require.Equal(t, 2, code, "stdout=%q stderr=%q", stdout, stderr)
			require.Contains(t, stderr, tc.want)
			require.True(t, strings.HasPrefix(stderr, "sluice: "), stderr)
			require.Equal(t, 1, strings.Count(strings.SplitN(stderr, "Run '", 2)[0], "\n"), "one line: %q", stderr)
			require.Empty(t, stdout)
		})
	}
}

// TestHealthCLI runs `sluice health` through the binary: its exit codes
// follow the monitoring-plugin convention.
func TestHealthCLI(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	pool, err := pgkit.Open(context.Background(), url, 10*time.Second)
	require.NoError(t, err)
	defer pool.Close()

	code, out := sluice(t, url, "health")
	require.Equal(t, 2, code, out)
	require.True(t, strings.HasPrefix(out, "CRITICAL: "), out)
	require.Regexp(t, `(?m)^workers\s+CRITICAL\s+no live worker`, out)
	require.NotContains(t, out, "sluice: ")

	_, err = pool.Exec(context.Background(), `INSERT INTO sluice_workers (id, host, pid, heartbeat_interval, dispatcher_tick_at, poll_interval)
		VALUES ('w', 'h', 1, '1h', now(), '1h')`)
	require.NoError(t, err)
	code, out = sluice(t, url, "health")
	require.Equal(t, 0, code, out)
	require.Regexp(t, `^OK: all checks passed \| live_workers=1 `, out)

	_, err = pool.Exec(context.Background(), `INSERT INTO schedules (name, cron, kind, status) VALUES ('broken', '* * * * *', 'demo.sleep', 'failed')`)
	require.NoError(t, err)
	code, out = sluice(t, url, "health", "--json")
	require.Equal(t, 1, code, out)
	var report map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &report))
	require.Equal(t, "WARNING", report["status"])
	require.Equal(t, []any{"broken"}, report["failed_names"])

	cmd := exec.Command(sluiceBin, "health")
	cmd.Env = append(os.Environ(), "DATABASE_URL=postgres://bob:s3cretpw@127.0.0.1:1/x?connect_timeout=2")
	outb, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	require.ErrorAs(t, err, &exitErr)
	require.Equal(t, 2, exitErr.ExitCode(), string(outb))
	require.Contains(t, string(outb), "CRITICAL: database: unreachable")
	require.NotContains(t, string(outb), "s3cretpw")
}

// TestScheduleDatabaseErrors: without a database URL the schedule commands
// are usage errors (exit 2); with an unreachable one, runtime failures
// (exit 1); the password never shows.
func TestScheduleDatabaseErrors(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		env  string
		code int
		want string
	}{
		{"DATABASE_URL=", 2, "no database URL"},
		{"DATABASE_URL=postgres://bob:s3cretpw@127.0.0.1:1/x?connect_timeout=2", 1, "connect to database host=127.0.0.1 port=1"},
	} {
		for _, args := range [][]string{
			{"schedule", "list"},
			{"schedule", "add", "--name", "n", "--cron", "@hourly", "--kind", "demo.sleep"},
			{"schedule", "trigger", "n"},
		} {
			cmd := exec.Command(sluiceBin, args...)
			cmd.Env = append(os.Environ(), tc.env)
			out, err := cmd.CombinedOutput()
			var exitErr *exec.ExitError
			require.ErrorAs(t, err, &exitErr, "%v: %s", args, out)
			require.Equal(t, tc.code, exitErr.ExitCode(), "%v: %s", args, out)
			require.Contains(t, string(out), tc.want, "%v", args)
			require.NotContains(t, string(out), "s3cretpw", "%v", args)
		}
	}
}

// TestScheduleUpdateHelpShowsNoDefaults: update changes only the flags
// given, so its help shows no defaults (add's does, and applies them).
func TestScheduleUpdateHelpShowsNoDefaults(t *testing.T) {
	t.Parallel()
	code, out, _ := runCLI(t, "schedule", "update", "--help")
	require.Equal(t, 0, code)
	local, _, _ := strings.Cut(out, "Global Flags:")
	require.Contains(t, local, "--tz")
	for _, line := range strings.Split(local, "\n") {
		if strings.Contains(line, "--") && regexp.MustCompile(`\(default ("|\d)`).MatchString(line) {
			t.Errorf("update --help shows a default: %q", line)
		}
	}
	code, out, _ = runCLI(t, "schedule", "add", "--help")
	require.Equal(t, 0, code)
	require.Contains(t, out, `(default "UTC")`)
	require.Contains(t, out, `(default "run_once")`)
}
