package cli

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
)

// sluiceTables are the tables whose rows a failed command must not change.
var sluiceTables = []string{"river_job", "river_queue", "settings", "maintenance_runs"}

// TestBadInput runs every command with malformed input: each exits 2 (1 for
// an unknown job or queue, which may be gone by the time its name is used),
// says what was wrong in one line, and leaves the database as it was.
func TestBadInput(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	pool, err := pgkit.Open(context.Background(), url, 10*time.Second)
	require.NoError(t, err)
	defer pool.Close()
	// Something to protect: a queued job.
	code, _, stderr := runCLI(t, "--database-url", url, "enqueue", "demo.sleep", "--args", `{"ms": 1}`, "--at", "2099-01-01T00:00:00Z")
	require.Equal(t, 0, code, stderr)
	before := testdb.Checksum(t, pool, sluiceTables...)

	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"unknown command", []string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{"unknown flag", []string{"run", "demo.sleep", "--sleepy"}, 2, "unknown flag: --sleepy"},
		{"run unknown kind", []string{"run", "demo.slep"}, 2, `unknown job kind "demo.slep"`},
		{"run no kind", []string{"run"}, 2, "expects a job KIND"},
		{"run malformed JSON", []string{"run", "demo.sleep", "--args", `{"ms":`}, 2, "malformed JSON"},
		{"run args not an object", []string{"run", "demo.sleep", "--args", `"ms"`}, 2, "must be a JSON object"},
		{"run unknown field", []string{"run", "demo.sleep", "--args", `{"seconds": 1}`}, 2, `unknown field "seconds"`},
		{"run out of range", []string{"run", "demo.sleep", "--args", `{"ms": -5}`}, 2, `field "ms": must be between`},
		{"run wrong type", []string{"run", "demo.sleep", "--args", `{"ms": "5"}`}, 2, `field "ms"`},
		{"run zero timeout", []string{"run", "demo.sleep", "--timeout", "0"}, 2, "invalid --timeout 0s: want a positive duration"},
		{"run negative timeout", []string{"run", "demo.sleep", "--timeout", "-1m"}, 2, "invalid --timeout -1m0s: want a positive duration"},
		{"run timeout not a duration", []string{"run", "demo.sleep", "--timeout", "soon"}, 2, `invalid argument "soon" for "--timeout"`},
		{"enqueue unknown kind", []string{"enqueue", "nope"}, 2, `unknown job kind "nope"`},
		{"enqueue field name in capitals", []string{"enqueue", "demo.sleep", "--args", `{"MS": 5}`}, 2, `unknown field "MS" (field names are case-sensitive: "ms")`},
		{"enqueue null field", []string{"enqueue", "demo.sleep", "--args", `{"ms": null}`}, 2, `field "ms": null is not a int64`},
		{"schedule add null field", []string{"schedule", "add", "--name", "n", "--cron", "@hourly", "--kind", "demo.sleep", "--args", `{"fail": null}`}, 2, `field "fail": null is not a bool`},
		{"enqueue bad queue", []string{"enqueue", "demo.sleep", "--queue", "Bad Queue"}, 2, `invalid --queue "Bad Queue"`},
		{"enqueue bad time", []string{"enqueue", "demo.sleep", "--at", "tomorrow"}, 2, `invalid --at "tomorrow"`},
		{"enqueue two kinds", []string{"enqueue", "demo.sleep", "demo.sleep"}, 2, "expects a job KIND"},
		{"cancel not a number", []string{"jobs", "cancel", "x"}, 2, `invalid job ID "x"`},
		{"cancel zero", []string{"jobs", "cancel", "0"}, 2, `invalid job ID "0"`},
		{"cancel unknown job", []string{"jobs", "cancel", "987654321"}, 1, "no job with id 987654321"},
		{"cancel no ID", []string{"jobs", "cancel"}, 2, "expects one or more job IDs"},
		{"cancel one bad ID of two", []string{"jobs", "cancel", "1", "x"}, 2, `invalid job ID "x"`},
		{"retry unknown jobs", []string{"jobs", "retry", "987654321", "987654322"}, 1, "no jobs with ids 987654321, 987654322"},
		{"retry negative ID", []string{"jobs", "retry", "--", "-3"}, 2, `invalid job ID "-3"`},
		{"delete unknown job", []string{"jobs", "delete", "987654321"}, 1, "no job with id 987654321"},
		{"delete not a number", []string{"jobs", "delete", "1e3"}, 2, `invalid job ID "1e3"`},
		{"show unknown job", []string{"jobs", "show", "987654321"}, 1, "no job with id 987654321"},
		{"show two IDs", []string{"jobs", "show", "1", "2"}, 2, "expects a job ID"},
		{"list bad state", []string{"jobs", "list", "--state", "done"}, 2, `invalid --state "done"`},
		{"list one bad state of two", []string{"jobs", "list", "--state", "available,stuck"}, 2, `invalid --state "stuck"`},
		{"list malformed kind", []string{"jobs", "list", "--kind", "demo slep"}, 2, `invalid --kind "demo slep"`},
		{"list bad queue", []string{"jobs", "list", "--queue", "Emails"}, 2, `invalid queue name "Emails"`},
		{"list zero limit", []string{"jobs", "list", "--limit", "0"}, 2, "invalid --limit 0"},
		{"list huge limit", []string{"jobs", "list", "--limit", "10001"}, 2, "invalid --limit 10001"},
		{"jobs without subcommand", []string{"jobs"}, 2, "needs a subcommand"},
		{"jobs unknown subcommand", []string{"jobs", "frob", "1"}, 2, `unknown subcommand "frob"`},
		{"queues without subcommand", []string{"queues"}, 2, "needs a subcommand"},
		{"queues list extra", []string{"queues", "list", "x"}, 2, "expects no arguments"},
		{"pause bad name", []string{"queues", "pause", "Bad Queue"}, 2, `invalid queue name "Bad Queue"`},
		{"pause no name", []string{"queues", "pause"}, 2, "expects a QUEUE"},
		{"pause unknown queue", []string{"queues", "pause", "nowhere"}, 1, `no queue "nowhere" known to River`},
		{"resume unknown queue", []string{"queues", "resume", "nowhere"}, 1, `no queue "nowhere" known to River`},
		{"resume long name", []string{"queues", "resume", strings.Repeat("q", 65)}, 2, "at most 64 characters"},
		{"enqueue priority 0", []string{"enqueue", "demo.sleep", "--priority", "0"}, 2, "invalid --priority 0"},
		{"enqueue priority 5", []string{"enqueue", "demo.sleep", "--priority", "5"}, 2, "invalid --priority 5"},
		{"enqueue max attempts 0", []string{"enqueue", "demo.sleep", "--max-attempts", "0"}, 2, "invalid --max-attempts 0"},
		{"enqueue max attempts huge", []string{"enqueue", "demo.sleep", "--max-attempts", "40000"}, 2, "invalid --max-attempts 40000"},
		{"enqueue bad tag", []string{"enqueue", "demo.sleep", "--tags", "ok-tag,no spaces"}, 2, `invalid --tags "no spaces"`},
		{"enqueue short tag", []string{"enqueue", "demo.sleep", "--tags", "ab"}, 2, `invalid --tags "ab"`},
		{"enqueue at and in", []string{"enqueue", "demo.sleep", "--at", "2099-01-01T00:00:00Z", "--in", "1h"}, 2, "--at and --in both"},
		{"enqueue negative in", []string{"enqueue", "demo.sleep", "--in", "-5m"}, 2, "invalid --in -5m0s"},
		{"enqueue bad in", []string{"enqueue", "demo.sleep", "--in", "soon"}, 2, `invalid argument "soon" for "--in"`},
		{"enqueue short unique period", []string{"enqueue", "demo.sleep", "--unique-by-args", "--unique-period", "500ms"}, 2, "invalid --unique-period 500ms"},
		{"enqueue empty queue", []string{"enqueue", "demo.sleep", "--queue", ""}, 2, `invalid --queue ""`},
		{"migrate unknown direction", []string{"migrate", "sideways"}, 2, `unknown migrate direction "sideways"`},
		{"migrate down bad version", []string{"migrate", "down", "--to", "-1"}, 2, `invalid --to "-1"`},
		{"migrate up with --to", []string{"migrate", "up", "--to", "1"}, 2, "--to, --component, --river and --force apply to migrate down only"},
		{"migrate river without to 0", []string{"migrate", "down", "--river"}, 2, "--river needs --to 0"},
		{"worker zero workers", []string{"worker", "--default-workers", "0"}, 2, "must be at least 1"},
		{"worker not a number", []string{"worker", "--maintenance-workers", "many"}, 2, "invalid argument"},
		{"worker negative timeout", []string{"worker", "--shutdown-timeout", "-1s"}, 2, "must not be negative"},
		{"worker bad duration", []string{"worker", "--job-timeout", "forever"}, 2, "invalid argument"},
		{"worker metrics interval too short", []string{"worker", "--metrics-interval", "10ms"}, 2, "metrics interval must be at least 1s, got 10ms"},
		{"worker metrics interval negative", []string{"worker", "--metrics-interval", "-1s"}, 2, "metrics interval must be at least 1s"},
		{"worker off loopback without token", []string{"worker", "--http-addr", "0.0.0.0:0"}, 2, `HTTP address "0.0.0.0:0" is off loopback and no token is set: set SLUICE_HTTP_TOKEN`},
		{"worker empty host without token", []string{"worker", "--http-addr", ":8089"}, 2, `HTTP address ":8089" is off loopback and no token is set`},
		{"worker host name without token", []string{"worker", "--http-addr", "example.com:8089"}, 2, "is off loopback and no token is set"},
		{"worker queues without count", []string{"worker", "--queues", "default"}, 2, `invalid --queues (or $SLUICE_QUEUES) "default"`},
		{"worker queues zero", []string{"worker", "--queues", "default=0"}, 2, "jobs at once must be between 1 and 10000, got 0"},
		{"worker queues huge", []string{"worker", "--queues", "emails=10001"}, 2, "jobs at once must be between 1 and 10000, got 10001"},
		{"worker queues bad name", []string{"worker", "--queues", "E-mails=5"}, 2, `invalid queue name "E-mails"`},
		{"worker queues twice", []string{"worker", "--queues", "emails=5,emails=6"}, 2, `queue "emails" is given twice`},
		{"worker queues maintenance", []string{"worker", "--queues", "maintenance=5"}, 2, `queue "maintenance" is sluice's own`},
		{"worker queues and default workers", []string{"worker", "--queues", "emails=5", "--default-workers", "10"}, 2, "are both set"},
		{"bad log level", []string{"--log-level", "loud", "run", "demo.sleep"}, 2, `invalid --log-level (or $SLUICE_LOG_LEVEL) "loud"`},
		{"bad log format", []string{"--log-format", "xml", "run", "demo.sleep"}, 2, `invalid --log-format (or $SLUICE_LOG_FORMAT) "xml"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--database-url", url}, tc.args...)
			code, stdout, stderr := runCLI(t, args...)
			require.Equal(t, tc.code, code, "stdout=%q stderr=%q", stdout, stderr)
			require.Contains(t, stderr, tc.want)
			require.True(t, strings.HasPrefix(stderr, "sluice: "), stderr)
			if tc.code == 2 {
				require.Regexp(t, `(?m)^Run 'sluice( [a-z ]+)? --help' for usage\.$`, stderr, "a usage error points to the help")
			}
			require.Empty(t, stdout)
		})
	}

	require.Equal(t, before, testdb.Checksum(t, pool, sluiceTables...), "a rejected command changed the database")
}

// TestDatabaseURLErrors covers a missing, malformed and unreachable
// database through the real binary and its environment.
func TestDatabaseURLErrors(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name string
		env  []string
		code int
		want string
	}{
		{"missing", []string{"DATABASE_URL="}, 2, "no database URL"},
		{"malformed", []string{"DATABASE_URL=postgres://bob:s3cretpw@127.0.0.1:99999999/x"}, 2, "invalid database URL"},
		{"unreachable", []string{"DATABASE_URL=postgres://bob:s3cretpw@127.0.0.1:1/x?connect_timeout=2"}, 1, "connect to database host=127.0.0.1 port=1"},
		{"bad env number", []string{"DATABASE_URL=postgres://127.0.0.1/x", "SLUICE_DEFAULT_WORKERS=lots"}, 2, "invalid $SLUICE_DEFAULT_WORKERS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, args := range [][]string{
				{"run", "demo.sleep"},
				{"enqueue", "demo.sleep"},
				{"jobs", "cancel", "1"},
				{"jobs", "list"},
				{"queues", "list"},
				{"queues", "pause", "default"},
				{"migrate", "up"},
				{"worker"},
			} {
				if strings.Contains(tc.name, "env number") && args[0] != "worker" {
					continue
				}
				cmd := exec.Command(sluiceBin, args...)
				cmd.Env = append(os.Environ(), tc.env...)
				out, err := cmd.CombinedOutput()
				var exitErr *exec.ExitError
				require.ErrorAs(t, err, &exitErr, "%v: %s", args, out)
				require.Equal(t, tc.code, exitErr.ExitCode(), "%v: %s", args, out)
				require.Contains(t, string(out), tc.want, "%v", args)
				require.NotContains(t, string(out), "s3cretpw", "the password leaked: %v", args)
			}
		})
	}
}
