package e2e_test

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/proc"
	"github.com/sluice-dev/sluice/internal/testdb"
)

// unreachableURL points at a port nothing listens on, with a password that
// must never be printed.
const unreachableURL = "postgres://bob:s3cretpw@127.0.0.1:1/sluice?connect_timeout=5"

// badInput is one malformed invocation of a command.
type badInput struct {
	// command is the command path as `sluice --help` lists it.
	command string
	args    []string
	env     []string
	// want is a substring of the one-line error.
	want string
}

// badInputs are the malformed invocations, at least one per command; each
// must exit 2 with one line `sluice: …` (plus cobra's usage hint) and change
// nothing. The database holds a schedule named "existing".
var badInputs = []badInput{
	{"", []string{"frobnicate"}, nil, `unknown command "frobnicate"`},
	{"", []string{"--log-level", "loud", "stats"}, nil, `invalid --log-level (or $SLUICE_LOG_LEVEL) "loud"`},
	{"", []string{"--log-format", "xml", "stats"}, nil, `invalid --log-format (or $SLUICE_LOG_FORMAT) "xml"`},
	{"", []string{"stats"}, []string{"SLUICE_LOG_LEVEL=loud"}, `"loud": want debug, info, warn or error`},

	{"migrate", []string{"migrate", "sideways"}, nil, `unknown migrate direction "sideways"`},
	{"migrate", []string{"migrate", "down", "--to", "-1"}, nil, `invalid --to "-1"`},
	{"migrate", []string{"migrate", "down", "--to", "x"}, nil, `invalid --to "x"`},
	{"migrate", []string{"migrate", "up", "--to", "1"}, nil, "--to, --component, --river and --force apply to migrate down only"},
	{"migrate", []string{"migrate", "down", "--river"}, nil, "--river needs --to 0"},
	{"migrate", []string{"migrate", "up", "down"}, nil, "migrate expects at most one of up, down, status"},

	{"worker", []string{"worker", "--default-workers", "0"}, nil, "must be at least 1"},
	{"worker", []string{"worker", "--maintenance-workers", "many"}, nil, `invalid argument "many" for "--maintenance-workers"`},
	{"worker", []string{"worker", "--job-timeout", "forever"}, nil, `invalid argument "forever" for "--job-timeout"`},
	{"worker", []string{"worker", "--shutdown-timeout", "-1s"}, nil, "must not be negative"},
	{"worker", []string{"worker", "--http-addr", "nonsense"}, nil, `invalid HTTP address "nonsense"`},
	{"worker", []string{"worker"}, []string{"SLUICE_HTTP_ADDR=127.0.0.1:http"}, `port "http" is not a number`},
	{"worker", []string{"worker", "--rescue-stuck-jobs-after", "1s"}, nil, "rescue-stuck-jobs-after (1s) must be at least the job timeout"},
	{"worker", []string{"worker", "--schedule-batch-size", "0"}, nil, "--schedule-batch-size must be at least 1"},
	{"worker", []string{"worker", "--schedule-poll-interval", "1ms"}, nil, "schedule poll interval must be at least 10ms"},
	{"worker", []string{"worker", "--heartbeat-interval", "1ms"}, nil, "heartbeat interval must be at least 100ms"},
	{"worker", []string{"worker", "--fetch-cooldown", "100us"}, nil, "fetch cooldown must be at least 1ms"},
	{"worker", []string{"worker", "--park-after", "2h"}, nil, "park-after must be between 1ms and 1h"},
	{"worker", []string{"worker"}, []string{"SLUICE_PARK_AFTER=-1s"}, "park-after must be between 1ms and 1h"},
	{"worker", []string{"worker", "--id", strings.Repeat("x", 101)}, nil, "worker id must be at most 100 characters"},
	{"worker", []string{"worker", "extra"}, nil, "expects no arguments"},
	{"worker", []string{"worker"}, []string{"SLUICE_DEFAULT_WORKERS=lots"}, "invalid $SLUICE_DEFAULT_WORKERS"},
	{"worker", []string{"worker", "--http-addr", "0.0.0.0:0"}, nil, `HTTP address "0.0.0.0:0" is off loopback and no token is set: set SLUICE_HTTP_TOKEN`},
	{"worker", []string{"worker"}, []string{"SLUICE_HTTP_ADDR=:8089"}, `HTTP address ":8089" is off loopback and no token is set`},
	{"worker", []string{"worker"}, []string{"SLUICE_HTTP_TOKEN=tiny"}, "HTTP token (SLUICE_HTTP_TOKEN) too short: want at least 16 characters, got 4"},
	{"worker", []string{"worker", "--http-addr", "0.0.0.0:0"}, []string{"SLUICE_HTTP_TOKEN=has spaces in the token"}, "not printable ASCII (or a space) at byte 4"},
	{"worker", []string{"worker", "--queues", "default"}, nil, `"default": want QUEUE=N`},
	{"worker", []string{"worker", "--queues", ""}, nil, "want QUEUE=N[,QUEUE=N...]"},
	{"worker", []string{"worker", "--queues", "default=20,,emails=5"}, nil, `"": want QUEUE=N`},
	{"worker", []string{"worker", "--queues", "emails=five"}, nil, `"five" is not a number of jobs`},
	{"worker", []string{"worker", "--queues", "emails=0"}, nil, `queue "emails": jobs at once must be between 1 and 10000, got 0`},
	{"worker", []string{"worker", "--queues", "emails=-5"}, nil, "got -5"},
	{"worker", []string{"worker", "--queues", "emails=100000"}, nil, "got 100000"},
	{"worker", []string{"worker", "--queues", "Emails=5"}, nil, `invalid queue name "Emails"`},
	{"worker", []string{"worker", "--queues", "emails=5,emails=6"}, nil, `queue "emails" is given twice`},
	{"worker", []string{"worker", "--queues", "maintenance=8"}, nil, `queue "maintenance" is sluice's own`},
	{"worker", []string{"worker", "--queues", "default=5", "--default-workers", "5"}, nil, "--queues (or $SLUICE_QUEUES) and --default-workers (or $SLUICE_DEFAULT_WORKERS) are both set"},
	{"worker", []string{"worker"}, []string{"SLUICE_QUEUES=emails=5", "SLUICE_DEFAULT_WORKERS=5"}, "are both set"},
	{"worker", []string{"worker"}, []string{"SLUICE_QUEUES=emails"}, `invalid --queues (or $SLUICE_QUEUES) "emails"`},

	{"run", []string{"run"}, nil, "expects a job KIND"},
	{"run", []string{"run", "demo.slep"}, nil, `unknown job kind "demo.slep"`},
	{"run", []string{"run", "concurrency_limit.resume", "--args", `{"kind": "nope"}`}, nil, `field "kind": unknown job kind "nope"`},
	{"run", []string{"run", "demo.sleep", "--args", `{"ms":`}, nil, "malformed JSON"},
	{"run", []string{"run", "demo.sleep", "--wait", "-1s"}, nil, "invalid --wait -1s"},
	{"run", []string{"run", "demo.sleep", "--wait", "soon"}, nil, `invalid argument "soon" for "--wait"`},
	{"run", []string{"run", "demo.sleep", "--args", `{"fail": "yes"}`}, nil, `field "fail": want bool`},
	{"run", []string{"run", "demo.sleep", "--args", `"ms"`}, nil, "args must be a JSON object"},
	{"run", []string{"run", "demo.sleep", "--args", `{"seconds": 1}`}, nil, `unknown field "seconds"`},
	{"run", []string{"run", "demo.sleep", "--args", `{"ms": -5}`}, nil, `field "ms": must be between`},
	{"run", []string{"run", "demo.sleep", "--args", `{"ms": "5"}`}, nil, `field "ms": want int64`},
	{"run", []string{"run", "export.project", "--args", `{}`}, nil, `field "export_job_id": must be a positive`},
	{"run", []string{"run", "concurrency_limit.resume", "--args", `{"kind": 5}`}, nil, `field "kind": want string`},
	{"run", []string{"run", "ci.drop_canceling_builds", "--args", `{"x": 1}`}, nil, `unknown field "x"`},

	{"enqueue", []string{"enqueue"}, nil, "expects a job KIND"},
	{"enqueue", []string{"enqueue", "nope"}, nil, `unknown job kind "nope"`},
	{"enqueue", []string{"enqueue", "demo.sleep", "--queue", "Bad Queue"}, nil, `invalid --queue "Bad Queue"`},
	{"enqueue", []string{"enqueue", "demo.sleep", "--at", "tomorrow"}, nil, `invalid --at "tomorrow"`},
	{"enqueue", []string{"enqueue", "demo.sleep", "--args", `[1]`}, nil, "args must be a JSON object"},
	{"enqueue", []string{"enqueue", "demo.sleep", "--args", `{"ms": 1e99}`}, nil, `field "ms"`},
	{"enqueue", []string{"enqueue", "export.project", "--args", `{"export_job_id": 0}`}, nil, `field "export_job_id"`},
	{"enqueue", []string{"enqueue", "demo.sleep", "--priority", "0"}, nil, "invalid --priority 0: want 1 (first) to 4 (last)"},
	{"enqueue", []string{"enqueue", "demo.sleep", "--priority", "5"}, nil, "invalid --priority 5"},
	{"enqueue", []string{"enqueue", "demo.sleep", "--priority", "high"}, nil, `invalid argument "high" for "--priority"`},
	{"enqueue", []string{"enqueue", "demo.sleep", "--max-attempts", "0"}, nil, "invalid --max-attempts 0: want 1 to 32767"},
	{"enqueue", []string{"enqueue", "demo.sleep", "--max-attempts", "-2"}, nil, "invalid --max-attempts -2"},
	{"enqueue", []string{"enqueue", "demo.sleep", "--max-attempts", "32768"}, nil, "invalid --max-attempts 32768"},
	{"enqueue", []string{"enqueue", "demo.sleep", "--tags", "nightly,bad tag"}, nil, `invalid --tags "bad tag"`},
	{"enqueue", []string{"enqueue", "demo.sleep", "--tags", "x"}, nil, `invalid --tags "x"`},
	{"enqueue", []string{"enqueue", "demo.sleep", "--tags", strings.Repeat("t", 256)}, nil, "invalid --tags"},
	{"enqueue", []string{"enqueue", "demo.sleep", "--at", "2099-01-01T00:00:00Z", "--in", "1h"}, nil, "--at and --in both say when to run: give one"},
	{"enqueue", []string{"enqueue", "demo.sleep", "--in", "0s"}, nil, "invalid --in 0s: want a positive duration"},
	{"enqueue", []string{"enqueue", "demo.sleep", "--in", "-1h"}, nil, "invalid --in -1h0m0s"},
	{"enqueue", []string{"enqueue", "demo.sleep", "--in", "later"}, nil, `invalid argument "later" for "--in"`},
	{"enqueue", []string{"enqueue", "demo.sleep", "--at", "2099-01-01"}, nil, `invalid --at "2099-01-01"`},
	{"enqueue", []string{"enqueue", "demo.sleep", "--unique-by-args", "--unique-period", "10ms"}, nil, "invalid --unique-period 10ms: want at least 1s"},
	{"enqueue", []string{"enqueue", "demo.sleep", "--unique-period", "-1m"}, nil, "invalid --unique-period -1m0s"},
	{"enqueue", []string{"enqueue", "demo.sleep", "--unique-by-args=perhaps"}, nil, `invalid argument "perhaps" for "--unique-by-args"`},
	{"enqueue", []string{"enqueue", "demo.sleep", "--queue", strings.Repeat("q", 65)}, nil, "invalid --queue"},

	{"export", []string{"export"}, nil, "expects a PROJECT_ID"},
	{"export", []string{"export", "abc"}, nil, `invalid PROJECT_ID "abc"`},
	{"export", []string{"export", "0"}, nil, `invalid PROJECT_ID "0"`},
	{"export", []string{"export", "--", "-5"}, nil, `invalid PROJECT_ID "-5"`},
	{"export", []string{"export", "99999999999999999999"}, nil, `invalid PROJECT_ID "99999999999999999999"`},
	{"export", []string{"export", "1", "2"}, nil, "expects a PROJECT_ID"},

	{"jobs", []string{"jobs"}, nil, "needs a subcommand"},
	{"jobs", []string{"jobs", "frob", "1"}, nil, `unknown subcommand "frob"`},
	{"jobs list", []string{"jobs", "list", "--state", "done"}, nil, `invalid --state "done": want one of available, cancelled, completed`},
	{"jobs list", []string{"jobs", "list", "--state", "pending,parked"}, nil, `invalid --state "parked"`},
	{"jobs list", []string{"jobs", "list", "--kind", "no pe"}, nil, `invalid --kind "no pe"`},
	{"jobs list", []string{"jobs", "list", "--queue", "Bad Q"}, nil, `invalid queue name "Bad Q"`},
	{"jobs list", []string{"jobs", "list", "--limit", "0"}, nil, "invalid --limit 0: want 1 to 10000"},
	{"jobs list", []string{"jobs", "list", "--limit", "lots"}, nil, `invalid argument "lots" for "--limit"`},
	{"jobs list", []string{"jobs", "list", "extra"}, nil, "expects no arguments"},
	{"jobs show", []string{"jobs", "show"}, nil, "expects a job ID"},
	{"jobs show", []string{"jobs", "show", "1", "2"}, nil, "expects a job ID"},
	{"jobs show", []string{"jobs", "show", "abc"}, nil, `invalid job ID "abc"`},
	{"jobs show", []string{"jobs", "show", "1", "--json=maybe"}, nil, `invalid argument "maybe" for "--json"`},
	{"jobs retry", []string{"jobs", "retry"}, nil, "expects one or more job IDs"},
	{"jobs retry", []string{"jobs", "retry", "1", "two"}, nil, `invalid job ID "two"`},
	{"jobs retry", []string{"jobs", "retry", "--", "-1"}, nil, `invalid job ID "-1"`},
	{"jobs cancel", []string{"jobs", "cancel"}, nil, "expects one or more job IDs"},
	{"jobs cancel", []string{"jobs", "cancel", "x"}, nil, `invalid job ID "x"`},
	{"jobs cancel", []string{"jobs", "cancel", "0"}, nil, `invalid job ID "0"`},
	{"jobs cancel", []string{"jobs", "cancel", "1", "99999999999999999999"}, nil, `invalid job ID "99999999999999999999"`},
	{"jobs delete", []string{"jobs", "delete"}, nil, "expects one or more job IDs"},
	{"jobs delete", []string{"jobs", "delete", "1.5"}, nil, `invalid job ID "1.5"`},

	{"queues", []string{"queues"}, nil, "needs a subcommand"},
	{"queues", []string{"queues", "drain", "default"}, nil, `unknown subcommand "drain"`},
	{"queues list", []string{"queues", "list", "default"}, nil, "expects no arguments"},
	{"queues list", []string{"queues", "list", "--json=maybe"}, nil, `invalid argument "maybe" for "--json"`},
	{"queues pause", []string{"queues", "pause"}, nil, "expects a QUEUE"},
	{"queues pause", []string{"queues", "pause", "Emails"}, nil, `invalid queue name "Emails"`},
	{"queues pause", []string{"queues", "pause", "a", "b"}, nil, "expects a QUEUE"},
	{"queues resume", []string{"queues", "resume"}, nil, "expects a QUEUE"},
	{"queues resume", []string{"queues", "resume", "no--double"}, nil, `invalid queue name "no--double"`},

	{"schedule", []string{"schedule"}, nil, "needs a subcommand"},
	{"schedule", []string{"schedule", "frob"}, nil, `unknown subcommand "frob"`},
	{"schedule add", []string{"schedule", "add", "--cron", "* * * * *", "--kind", "demo.sleep"}, nil, "--name is required"},
	{"schedule add", []string{"schedule", "add", "--name", "", "--cron", "* * * * *", "--kind", "demo.sleep"}, nil, `invalid name ""`},
	{"schedule add", []string{"schedule", "add", "--name", "x", "--cron", "61 * * * *", "--kind", "demo.sleep"}, nil, `invalid cron "61 * * * *": minute field`},
	{"schedule add", []string{"schedule", "add", "--name", "x", "--cron", "* * *", "--kind", "demo.sleep"}, nil, `invalid cron "* * *": want 5 fields`},
	{"schedule add", []string{"schedule", "add", "--name", "x", "--cron", "@every 0s", "--kind", "demo.sleep"}, nil, "the interval must be at least 1s"},
	{"schedule add", []string{"schedule", "add", "--name", "x", "--cron", "@every 1500ms", "--kind", "demo.sleep"}, nil, "whole number of seconds"},
	{"schedule add", []string{"schedule", "add", "--name", "x", "--cron", "@fortnightly", "--kind", "demo.sleep"}, nil, "unknown descriptor"},
	{"schedule add", []string{"schedule", "add", "--name", "x", "--cron", "* * * * *", "--tz", "Mars/Base", "--kind", "demo.sleep"}, nil, `invalid timezone "Mars/Base"`},
	{"schedule add", []string{"schedule", "add", "--name", "x", "--cron", "* * * * *", "--tz", "Local", "--kind", "demo.sleep"}, nil, `invalid timezone "Local"`},
	{"schedule add", []string{"schedule", "add", "--name", "x", "--cron", "* * * * *", "--kind", "nope"}, nil, `invalid kind "nope"`},
	{"schedule add", []string{"schedule", "add", "--name", "x", "--cron", "* * * * *", "--kind", "demo.sleep", "--args", "{"}, nil, "malformed JSON"},
	{"schedule add", []string{"schedule", "add", "--name", "x", "--cron", "* * * * *", "--kind", "demo.sleep", "--args", `{"ms": -1}`}, nil, `field "ms"`},
	{"schedule add", []string{"schedule", "add", "--name", "x", "--cron", "* * * * *", "--kind", "demo.sleep", "--misfire", "sometimes"}, nil, `invalid misfire "sometimes"`},
	{"schedule add", []string{"schedule", "add", "--name", "x", "--cron", "* * * * *", "--kind", "demo.sleep", "--max-retries", "-1"}, nil, `invalid max_retries "-1"`},
	{"schedule add", []string{"schedule", "add", "--name", "x", "--cron", "* * * * *", "--kind", "demo.sleep", "--max-retries", "lots"}, nil, `invalid argument "lots" for "--max-retries"`},
	{"schedule add", []string{"schedule", "add", "--name", "x", "--cron", "* * * * *", "--kind", "demo.sleep", "--queue", "Bad Q"}, nil, `invalid queue "Bad Q"`},
	{"schedule add", []string{"schedule", "add", "--name", "x", "--cron", "* * * * *", "--kind", "demo.sleep", "--disabled=maybe"}, nil, `invalid argument "maybe" for "--disabled"`},
	{"schedule add", []string{"schedule", "add", "--name", "existing", "--cron", "* * * * *", "--kind", "demo.sleep"}, nil, `a schedule named "existing" already exists`},
	{"schedule add", []string{"schedule", "add", "--name", "x", "--cron", "* * * * *", "--kind", "demo.sleep", "extra"}, nil, "expects no arguments"},
	{"schedule update", []string{"schedule", "update"}, nil, "expects a schedule NAME"},
	{"schedule update", []string{"schedule", "update", "nope", "--cron", "* * * * *"}, nil, `no schedule named "nope"`},
	{"schedule update", []string{"schedule", "update", "existing", "--cron", "99 * * * *"}, nil, `invalid cron "99 * * * *"`},
	{"schedule update", []string{"schedule", "update", "existing", "--tz", "Nowhere/City"}, nil, `invalid timezone "Nowhere/City"`},
	{"schedule update", []string{"schedule", "update", "existing", "--kind", "nope"}, nil, `invalid kind "nope"`},
	{"schedule update", []string{"schedule", "update", "existing", "--args", `{"ms":`}, nil, "malformed JSON"},
	{"schedule update", []string{"schedule", "update", "existing", "--misfire", "x"}, nil, `invalid misfire "x"`},
	{"schedule update", []string{"schedule", "update", "existing", "--max-retries", "5000"}, nil, `invalid max_retries "5000"`},
	{"schedule update", []string{"schedule", "update", "existing"}, nil, "nothing to update"},
	{"schedule update", []string{"schedule", "update", "existing", "--name", "other"}, nil, "unknown flag: --name"},
	{"schedule remove", []string{"schedule", "remove"}, nil, "expects a schedule NAME"},
	{"schedule remove", []string{"schedule", "remove", "nope"}, nil, `no schedule named "nope"`},
	{"schedule remove", []string{"schedule", "remove", "existing", "extra"}, nil, "expects a schedule NAME"},
	{"schedule enable", []string{"schedule", "enable"}, nil, "expects a schedule NAME"},
	{"schedule enable", []string{"schedule", "enable", "nope"}, nil, `no schedule named "nope"`},
	{"schedule disable", []string{"schedule", "disable", "nope"}, nil, `no schedule named "nope"`},
	{"schedule disable", []string{"schedule", "disable", "existing", "extra"}, nil, "expects a schedule NAME"},
	{"schedule trigger", []string{"schedule", "trigger", "nope"}, nil, `no schedule named "nope"`},
	{"schedule trigger", []string{"schedule", "trigger"}, nil, "expects a schedule NAME"},
	{"schedule reset", []string{"schedule", "reset"}, nil, "expects a schedule NAME"},
	{"schedule reset", []string{"schedule", "reset", "existing"}, nil, `schedule "existing" is not declared in Go`},
	{"schedule list", []string{"schedule", "list", "extra"}, nil, "expects no arguments"},
	{"schedule list", []string{"schedule", "list", "--json=maybe"}, nil, `invalid argument "maybe" for "--json"`},
	{"schedule next", []string{"schedule", "next"}, nil, "expects one cron EXPR"},
	{"schedule next", []string{"schedule", "next", "60 * * * *"}, nil, `invalid cron "60 * * * *": minute field "60"`},
	{"schedule next", []string{"schedule", "next", "* 24 * * *"}, nil, `hour field "24"`},
	{"schedule next", []string{"schedule", "next", "*/0 * * * *"}, nil, `minute field "*/0": step 0 out of range`},
	{"schedule next", []string{"schedule", "next", "*/61 * * * *"}, nil, `minute field "*/61": step 61 out of range`},
	{"schedule next", []string{"schedule", "next", "0 1,,2 * * *"}, nil, `hour field "1,,2": empty list item`},
	{"schedule next", []string{"schedule", "next", "0 0 * * L"}, nil, `day-of-week field "L": L (the last day of the month) is allowed only in the day-of-month field`},
	{"schedule next", []string{"schedule", "next", "0 0 1#1 * *"}, nil, `day-of-month field "1#1": N#k (the k-th weekday N of the month) is allowed only in the day-of-week field`},
	{"schedule next", []string{"schedule", "next", "@fortnightly"}, nil, "unknown descriptor"},
	{"schedule next", []string{"schedule", "next", "@every 999ms"}, nil, "the interval must be at least 1s"},
	{"schedule next", []string{"schedule", "next", "@every 1001ms"}, nil, "whole number of seconds"},
	{"schedule next", []string{"schedule", "next", "* * * * *", "--tz", "EST+5"}, nil, `invalid timezone "EST+5"`},
	{"schedule next", []string{"schedule", "next", "* * * * *", "--count", "0"}, nil, "invalid --count 0"},
	{"schedule next", []string{"schedule", "next", "* * * * *", "--from", "now"}, nil, `invalid --from "now"`},

	{"limits", []string{"limits"}, nil, "needs a subcommand"},
	{"limits", []string{"limits", "frob"}, nil, `unknown subcommand "frob"`},
	{"limits set", []string{"limits", "set"}, nil, "expects a job KIND and a limit N"},
	{"limits set", []string{"limits", "set", "demo.sleep"}, nil, "expects a job KIND and a limit N"},
	{"limits set", []string{"limits", "set", "nope", "3"}, nil, `unknown job kind "nope"`},
	{"limits set", []string{"limits", "set", "demo.sleep", "many"}, nil, `invalid limit "many"`},
	{"limits set", []string{"limits", "set", "demo.sleep", "1.5"}, nil, `invalid limit "1.5"`},
	{"limits set", []string{"limits", "set", "demo.sleep", "99999999999"}, nil, `invalid limit "99999999999"`},
	{"limits set", []string{"limits", "set", "demo.sleep", "2", "--by-args", "nope"}, nil, `its args have no field "nope"`},
	{"limits set", []string{"limits", "set", "demo.sleep", "0", "--by-args", "ms"}, nil, "invalid per-key limit 0"},
	{"limits rate", []string{"limits", "rate", "demo.sleep"}, nil, "expects a job KIND and a rate N/DURATION"},
	{"limits rate", []string{"limits", "rate", "nope", "5/1s"}, nil, `unknown job kind "nope"`},
	{"limits rate", []string{"limits", "rate", "demo.sleep", "0/1s"}, nil, "N must be 1 to"},
	{"limits rate", []string{"limits", "rate", "demo.sleep", "5/100ms"}, nil, "the window must be at least 1s"},
	{"limits rate", []string{"limits", "rate", "demo.sleep", "5/soon"}, nil, "DURATION must be a Go duration"},
	{"limits rate", []string{"limits", "rate", "demo.sleep", "5/1s", "--by-args", "nope"}, nil, `its args have no field "nope"`},
	{"limits clear", []string{"limits", "clear"}, nil, "expects a job KIND"},
	{"limits clear", []string{"limits", "clear", "demo.sleep"}, nil, `no such limit is set for "demo.sleep"`},
	{"limits list", []string{"limits", "list", "extra"}, nil, "expects no arguments"},
	{"limits list", []string{"limits", "list", "--json=maybe"}, nil, `invalid argument "maybe" for "--json"`},

	{"policy", []string{"policy"}, nil, "needs a subcommand"},
	{"policy set", []string{"policy", "set"}, nil, "expects a job KIND"},
	{"policy set", []string{"policy", "set", "nope", "--max-waiting", "1", "--on-conflict", "discard"}, nil, `unknown job kind "nope"`},
	{"policy set", []string{"policy", "set", "demo.sleep", "--on-conflict", "discard"}, nil, "--max-waiting N is required"},
	{"policy set", []string{"policy", "set", "demo.sleep", "--max-waiting", "1"}, nil, "--on-conflict discard|replace|debounce|reject is required"},
	{"policy set", []string{"policy", "set", "demo.sleep", "--max-waiting", "0", "--on-conflict", "discard"}, nil, "max waiting 0: want 1 to"},
	{"policy set", []string{"policy", "set", "demo.sleep", "--max-waiting", "x", "--on-conflict", "discard"}, nil, `invalid argument "x" for "--max-waiting"`},
	{"policy set", []string{"policy", "set", "demo.sleep", "--max-waiting", "1", "--on-conflict", "drop"}, nil, `on conflict "drop": want discard, replace, debounce or reject`},
	{"policy set", []string{"policy", "set", "demo.sleep", "--max-waiting", "1", "--on-conflict", "discard", "--by-args", "nope"}, nil, `its args have no field "nope"`},
	{"policy set", []string{"policy", "set", "demo.sleep", "--max-waiting", "1", "--on-conflict", "debounce", "--debounce", "1s"}, nil, "needs --debounce D and --max-delay M"},
	{"policy set", []string{"policy", "set", "demo.sleep", "--max-waiting", "1", "--on-conflict", "debounce", "--debounce", "5s", "--max-delay", "1s"}, nil, "at least the debounce"},
	{"policy set", []string{"policy", "set", "demo.sleep", "--max-waiting", "1", "--on-conflict", "replace", "--debounce", "1s", "--max-delay", "5s"}, nil, "go with --on-conflict debounce only"},
	{"policy set", []string{"policy", "set", "demo.sleep", "--max-waiting", "1", "--on-conflict", "discard", "--keep-scheduled-at"}, nil, "--keep-scheduled-at goes with --on-conflict replace only"},
	{"policy list", []string{"policy", "list", "extra"}, nil, "expects no arguments"},
	{"policy list", []string{"policy", "list", "--json=maybe"}, nil, `invalid argument "maybe" for "--json"`},
	{"policy clear", []string{"policy", "clear"}, nil, "expects a job KIND"},
	{"policy clear", []string{"policy", "clear", "demo.sleep"}, nil, `no enqueue policy is set for "demo.sleep"`},
	{"policy reset", []string{"policy", "reset"}, nil, "expects a job KIND"},
	{"policy reset", []string{"policy", "reset", "demo.sleep"}, nil, "no enqueue policy of demo.sleep is declared in Go"},
	{"policy keys", []string{"policy", "keys"}, nil, "expects a job KIND"},
	{"policy keys", []string{"policy", "keys", "demo.sleep", "--json=maybe"}, nil, `invalid argument "maybe" for "--json"`},

	{"parked", []string{"parked"}, nil, "needs a subcommand"},
	{"parked list", []string{"parked", "list", "nope"}, nil, `unknown job kind "nope"`},
	{"parked list", []string{"parked", "list", "--max", "0"}, nil, "invalid --max 0"},
	{"parked list", []string{"parked", "list", "--max", "x"}, nil, `invalid argument "x" for "--max"`},
	{"parked list", []string{"parked", "list", "a", "b"}, nil, "expects at most one KIND"},

	{"stats", []string{"stats", "extra"}, nil, "expects no arguments"},
	{"stats", []string{"stats", "--json=maybe"}, nil, `invalid argument "maybe" for "--json"`},
	{"health", []string{"health", "extra"}, nil, "expects no arguments"},
	{"health", []string{"health", "--json=maybe"}, nil, `invalid argument "maybe" for "--json"`},
}

// unknownNames name a job or queue that does not exist: each must exit 1 (a
// runtime failure: a job or queue may be gone by the time it is named) with
// one line `sluice: …` naming it, and change nothing.
var unknownNames = []badInput{
	{"jobs show", []string{"jobs", "show", "987654321"}, nil, "no job with id 987654321"},
	{"jobs retry", []string{"jobs", "retry", "987654321"}, nil, "no job with id 987654321"},
	{"jobs cancel", []string{"jobs", "cancel", "987654321"}, nil, "no job with id 987654321"},
	{"jobs cancel", []string{"jobs", "cancel", "987654321", "987654322"}, nil, "no jobs with ids 987654321, 987654322"},
	{"jobs delete", []string{"jobs", "delete", "987654321"}, nil, "no job with id 987654321"},
	{"queues pause", []string{"queues", "pause", "nowhere"}, nil, `no queue "nowhere" known to River`},
	{"queues resume", []string{"queues", "resume", "nowhere"}, nil, `no queue "nowhere" known to River`},
}

// validInvocations are well-formed invocations of every command that uses
// the database: against an unreachable one each must exit 1 (health: 2,
// CRITICAL) with a one-line error that names the server, not the password.
var validInvocations = map[string][]string{
	"migrate":          {"migrate", "up"},
	"worker":           {"worker", "--http-addr", ""},
	"run":              {"run", "demo.sleep", "--args", `{"ms": 1}`},
	"enqueue":          {"enqueue", "demo.sleep"},
	"export":           {"export", "1"},
	"jobs list":        {"jobs", "list"},
	"jobs show":        {"jobs", "show", "1"},
	"jobs retry":       {"jobs", "retry", "1"},
	"jobs cancel":      {"jobs", "cancel", "1"},
	"jobs delete":      {"jobs", "delete", "1", "2"},
	"queues list":      {"queues", "list"},
	"queues pause":     {"queues", "pause", "default"},
	"queues resume":    {"queues", "resume", "*"},
	"schedule add":     {"schedule", "add", "--name", "x", "--cron", "* * * * *", "--kind", "demo.sleep"},
	"schedule update":  {"schedule", "update", "x", "--cron", "0 * * * *"},
	"schedule remove":  {"schedule", "remove", "x"},
	"schedule enable":  {"schedule", "enable", "x"},
	"schedule disable": {"schedule", "disable", "x"},
	"schedule trigger": {"schedule", "trigger", "x"},
	"schedule reset":   {"schedule", "reset", "x"},
	"schedule list":    {"schedule", "list"},
	"limits list":      {"limits", "list"},
	"limits set":       {"limits", "set", "demo.sleep", "3"},
	"limits rate":      {"limits", "rate", "demo.sleep", "5/1s"},
	"limits clear":     {"limits", "clear", "demo.sleep"},
	"policy set":       {"policy", "set", "demo.sleep", "--max-waiting", "1", "--on-conflict", "discard"},
	"policy list":      {"policy", "list"},
	"policy clear":     {"policy", "clear", "demo.sleep"},
	"policy reset":     {"policy", "reset", "demo.sleep"},
	"policy keys":      {"policy", "keys", "demo.sleep"},
	"parked list":      {"parked", "list"},
	"stats":            {"stats"},
	"health":           {"health"},
}

// noDatabase are valid invocations of the commands that never connect to
// the database: with an unreachable one they succeed all the same.
var noDatabase = map[string][]string{
	"schedule next": {"schedule", "next", "0 9 ? * 5#3", "--tz", "Europe/Berlin", "--count", "3"},
}

// usageHint is the line cobra adds after a usage error.
var usageHint = regexp.MustCompile(`^Run 'sluice( [a-z]+)* --help' for usage\.$`)

// TestBadInputEveryCommand runs every command `sluice --help` lists (and
// every subcommand) with malformed input and with an unreachable database:
// exit 2 for bad input (1 for an unknown job or queue, and for an
// unreachable database; `health` says CRITICAL, 2), a one-line `sluice: …`
// error naming what was wrong, no password in it, and every table of the
// database — sluice's and River's — unchanged.
func TestBadInputEveryCommand(t *testing.T) {
	t.Parallel()

	h := newHarness(t, testdb.New(t))
	// Something to protect in most tables.
	h.ok("schedule", "add", "--name", "existing", "--cron", "0 3 * * *", "--kind", "demo.sleep", "--args", `{"ms": 1}`)
	h.ok("enqueue", "demo.sleep", "--at", "2099-01-01T00:00:00Z")
	h.ok("limits", "set", "export.project", "2")
	h.ok("export", "7")
	h.exec(`INSERT INTO ci_builds (project_id, status) VALUES (7, 'running')`)
	tables := allTables(h)
	before := testdb.Checksum(t, h.pool, tables...)

	commands := commandPaths(t)
	t.Logf("commands: %q", commands)
	covered := map[string]bool{}
	for _, tc := range badInputs {
		covered[tc.command] = true
	}
	for _, c := range commands {
		require.True(t, covered[c], "no malformed input for `sluice %s`: add cases to badInputs", c)
		if _, ok := noDatabase[c]; !ok && !isGroup(t, c) {
			require.Contains(t, validInvocations, c, "no valid invocation of `sluice %s` for the unreachable-database case", c)
		}
	}

	for _, tc := range badInputs {
		res := proc.Run(t, h.url, tc.env, tc.args...)
		requireOneLineError(t, res, 2, tc.want, tc.args)
	}
	for _, tc := range unknownNames {
		res := proc.Run(t, h.url, tc.env, tc.args...)
		requireOneLineError(t, res, 1, tc.want, tc.args)
	}
	require.Equal(t, before, testdb.Checksum(t, h.pool, tables...), "a rejected command changed the database")

	for command, args := range validInvocations {
		res := proc.Run(t, unreachableURL, nil, args...)
		if command == "health" {
			require.Equal(t, 2, res.Code, "health on an unreachable database is CRITICAL: %q %q", res.Stdout, res.Stderr)
			require.True(t, strings.HasPrefix(res.Stdout, "CRITICAL: database: unreachable: connect to database host=127.0.0.1 port=1"), res.Stdout)
			require.NotContains(t, res.Stdout+res.Stderr, "s3cretpw")
			continue
		}
		requireOneLineError(t, res, 1, "connect to database host=127.0.0.1 port=1 user=bob database=sluice", args)
	}
	for _, args := range noDatabase {
		res := proc.Run(t, unreachableURL, nil, args...)
		require.Equal(t, 0, res.Code, "sluice %q: stdout=%q stderr=%q", args, res.Stdout, res.Stderr)
		require.Len(t, strings.Split(strings.TrimSuffix(res.Stdout, "\n"), "\n"), 3, "sluice %q", args)
	}
	// A malformed or missing URL is bad input.
	for _, url := range []string{"postgres://bob:s3cretpw@127.0.0.1:99999999/x", ""} {
		for _, args := range [][]string{{"stats"}, {"schedule", "list"}, {"worker"}} {
			res := proc.Run(t, url, nil, args...)
			requireOneLineError(t, res, 2, "database URL", args)
		}
	}
}

// requireOneLineError checks a rejected command: its exit code, nothing on
// stdout, and one line `sluice: …` containing want on stderr (then at most
// cobra's usage hint), without the password of unreachableURL.
func requireOneLineError(t *testing.T, res proc.Result, code int, want string, args []string) {
	t.Helper()
	require.Equal(t, code, res.Code, "sluice %q: stdout=%q stderr=%q", args, res.Stdout, res.Stderr)
	require.Empty(t, res.Stdout, "sluice %q", args)
	lines := strings.Split(strings.TrimSuffix(res.Stderr, "\n"), "\n")
	require.True(t, strings.HasPrefix(lines[0], "sluice: "), "sluice %q: %q", args, res.Stderr)
	require.Contains(t, lines[0], want, "sluice %q", args)
	require.LessOrEqual(t, len(lines), 2, "sluice %q: more than one line: %q", args, res.Stderr)
	if len(lines) == 2 {
		require.Regexp(t, usageHint, lines[1], "sluice %q", args)
	}
	require.NotContains(t, res.Stderr, "s3cretpw", "sluice %q: the password leaked", args)
}

// commandPaths lists every command and subcommand `sluice --help` shows
// ("" is the root), except cobra's own help command.
func commandPaths(t *testing.T) []string {
	t.Helper()
	paths := []string{""}
	var walk func(path []string)
	walk = func(path []string) {
		res := proc.Run(t, "", nil, append(slices.Clone(path), "--help")...)
		require.Equal(t, 0, res.Code, "sluice %v --help: %s", path, res.Stderr)
		for _, sub := range subcommands(res.Stdout) {
			if sub == "help" || sub == "completion" {
				continue
			}
			p := append(slices.Clone(path), sub)
			paths = append(paths, strings.Join(p, " "))
			walk(p)
		}
	}
	walk(nil)
	require.Greater(t, len(paths), 15, "the help output was not parsed: %v", paths)
	return paths
}

// subcommands parses the "Available Commands:" section of a help text.
func subcommands(help string) []string {
	var subs []string
	in := false
	for _, line := range strings.Split(help, "\n") {
		switch {
		case strings.HasPrefix(line, "Available Commands:"):
			in = true
		case in && strings.TrimSpace(line) == "":
			return subs
		case in:
			subs = append(subs, strings.Fields(line)[0])
		}
	}
	return subs
}

// isGroup reports whether command only groups subcommands.
func isGroup(t *testing.T, command string) bool {
	t.Helper()
	if command == "" {
		return true
	}
	res := proc.Run(t, "", nil, append(strings.Fields(command), "--help")...)
	return len(subcommands(res.Stdout)) > 0
}

// allTables lists every table of the test's database: sluice's and River's.
func allTables(h *harness) []string {
	h.t.Helper()
	rows, err := h.pool.Query(context.Background(), `
		SELECT format('%I.%I', schemaname, tablename) FROM pg_tables
		WHERE schemaname = ANY (current_schemas(false)) ORDER BY 1`)
	require.NoError(h.t, err)
	var tables []string
	for rows.Next() {
		var name string
		require.NoError(h.t, rows.Scan(&name))
		tables = append(tables, name)
	}
	require.NoError(h.t, rows.Err())
	require.Contains(h.t, tables, "public.river_job")
	require.Contains(h.t, tables, "sluice.schedules")
	return tables
}
