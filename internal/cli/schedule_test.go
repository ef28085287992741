package cli

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/testdb"
)

// scheduleTables are the tables a rejected schedule command must not change.
var scheduleTables = []string{"schedules", "river_job", "settings", "sluice_workers"}

func TestScheduleCLI(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	pool, err := db.Open(context.Background(), url, 10*time.Second)
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

	out = cli(0, "schedule", "list")
	require.Regexp(t, `(?m)^NAME\s+CRON\s+TIMEZONE\s+KIND\s+ENABLED\s+STATUS\s+NEXT RUN\s+LAST RUN\s+RUNS\s+LAST ERROR$`, out)
	require.Regexp(t, `(?m)^nightly\s+30 2 \* \* \*\s+America/New_York\s+demo\.sleep\s+true\s+active\s+\S+Z\s+-\s+0\s+-$`, out)
	require.Regexp(t, `(?m)^tick\s+@every 5s\s+UTC\s+demo\.sleep\s+false\s+active`, out)

	var list []map[string]any
	require.NoError(t, json.Unmarshal([]byte(cli(0, "schedule", "list", "--json")), &list))
	require.Len(t, list, 2)
	require.Equal(t, "nightly", list[0]["name"])
	require.Equal(t, map[string]any{"ms": float64(5)}, list[0]["args"])
	require.Equal(t, "skip", list[0]["misfire"])
	require.EqualValues(t, 2, list[0]["max_retries"])
	require.Nil(t, list[0]["queue"])
	require.Regexp(t, `Z$`, list[0]["next_run_at"])

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
	m := regexp.MustCompile(`^schedule nightly triggered: job (\d+)\n$`).FindStringSubmatch(out)
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
	pool, err := db.Open(context.Background(), url, 10*time.Second)
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
		{"add bad zone", add("--tz", "Atlantis/Capital"), `invalid timezone "Atlantis/Capital": unknown time zone`},
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

// TestHealthCLI runs `sluice health` through the binary: its exit codes
// follow the monitoring-plugin convention.
func TestHealthCLI(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	pool, err := db.Open(context.Background(), url, 10*time.Second)
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
