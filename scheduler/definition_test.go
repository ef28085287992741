package scheduler_test

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/kinds"
	"github.com/sluice-dev/sluice/modules/demo"
	"github.com/sluice-dev/sluice/scheduler"
)

func TestValidate(t *testing.T) {
	t.Parallel()

	registry := jobtest.Registry(t)
	good := scheduler.Definition{Name: "nightly", Cron: "0 3 * * *", Kind: "demo.sleep", Args: json.RawMessage(`{"ms": 5}`), Enabled: true}

	c, err := scheduler.Validate(registry, good)
	require.NoError(t, err)
	require.Equal(t, "UTC", c.Timezone, "default zone")
	require.Equal(t, scheduler.MisfireRunOnce, c.Misfire, "default misfire")
	require.Equal(t, demo.SleepArgs{MS: 5}, c.JobArgs)

	for _, tc := range []struct {
		name   string
		edit   func(d *scheduler.Definition)
		field  string
		reason string
	}{
		{"empty name", func(d *scheduler.Definition) { d.Name = "" }, "name", "want 1 to 128"},
		{"name with space", func(d *scheduler.Definition) { d.Name = "a b" }, "name", "letters, digits"},
		{"name starting with dash", func(d *scheduler.Definition) { d.Name = "-a" }, "name", "starting with a letter or digit"},
		{"name too long", func(d *scheduler.Definition) { d.Name = strings.Repeat("a", 129) }, "name", "128"},
		{"empty cron", func(d *scheduler.Definition) { d.Cron = "" }, "cron", "empty expression"},
		{"cron field count", func(d *scheduler.Definition) { d.Cron = "* *" }, "cron", "want 5 fields"},
		{"cron minute range", func(d *scheduler.Definition) { d.Cron = "75 * * * *" }, "cron", `minute field "75"`},
		{"cron hour range", func(d *scheduler.Definition) { d.Cron = "0 24 * * *" }, "cron", `hour field "24"`},
		{"cron seconds range", func(d *scheduler.Definition) { d.Cron = "60 0 * * * *" }, "cron", `second field "60"`},
		{"cron weekday name", func(d *scheduler.Definition) { d.Cron = "0 0 * * funday" }, "cron", `day-of-week field "funday"`},
		{"cron never fires", func(d *scheduler.Definition) { d.Cron = "0 0 31 4 *" }, "cron", "never fires"},
		{"cron descriptor", func(d *scheduler.Definition) { d.Cron = "@often" }, "cron", "unknown descriptor"},
		{"cron every too short", func(d *scheduler.Definition) { d.Cron = "@every 10ms" }, "cron", "at least 1s"},
		{"cron every not a duration", func(d *scheduler.Definition) { d.Cron = "@every day" }, "cron", "not a duration"},
		{"cron tz prefix", func(d *scheduler.Definition) { d.Cron = "CRON_TZ=Asia/Tokyo 0 0 * * *" }, "cron", "--tz"},
		{"unknown zone", func(d *scheduler.Definition) { d.Timezone = "Europe/Atlantis" }, "timezone", "unknown time zone"},
		{"local zone", func(d *scheduler.Definition) { d.Timezone = "Local" }, "timezone", "local zone"},
		{"unknown kind", func(d *scheduler.Definition) { d.Kind = "demo.slep" }, "kind", "not a job kind this binary knows (known kinds: "},
		{"empty kind", func(d *scheduler.Definition) { d.Kind = "" }, "kind", "not a job kind"},
		{"args not JSON", func(d *scheduler.Definition) { d.Args = json.RawMessage(`{"ms":`) }, "args", "malformed JSON"},
		{"args not an object", func(d *scheduler.Definition) { d.Args = json.RawMessage(`[1]`) }, "args", "must be a JSON object"},
		{"args unknown field", func(d *scheduler.Definition) { d.Args = json.RawMessage(`{"sec": 1}`) }, "args", `for demo.sleep: unknown field "sec"`},
		{"args out of range", func(d *scheduler.Definition) { d.Args = json.RawMessage(`{"ms": -1}`) }, "args", `field "ms": must be between`},
		{"args wrong type", func(d *scheduler.Definition) { d.Args = json.RawMessage(`{"ms": "1"}`) }, "args", `field "ms"`},
		{"queue", func(d *scheduler.Definition) { d.Queue = "Not A Queue" }, "queue", "lowercase letters"},
		{"misfire", func(d *scheduler.Definition) { d.Misfire = "sometimes" }, "misfire", "want run_once, skip or run_all"},
		{"negative retries", func(d *scheduler.Definition) { d.MaxRetries = -1 }, "max_retries", "want 0 to 1000"},
		{"too many retries", func(d *scheduler.Definition) { d.MaxRetries = 1001 }, "max_retries", "want 0 to 1000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := good
			tc.edit(&d)
			_, err := scheduler.Validate(registry, d)
			require.Error(t, err)
			var fieldErr *scheduler.FieldError
			require.True(t, errors.As(err, &fieldErr), "%T: %v", err, err)
			require.Equal(t, tc.field, fieldErr.Field, err.Error())
			require.Contains(t, err.Error(), "invalid "+tc.field)
			require.Contains(t, err.Error(), tc.reason)
			require.NotContains(t, err.Error(), "\n")
		})
	}

	t.Run("unknown kind unwraps to the registry's error", func(t *testing.T) {
		t.Parallel()
		d := good
		d.Kind = "nope"
		_, err := scheduler.Validate(registry, d)
		var unknown *kinds.UnknownKindError
		require.ErrorAs(t, err, &unknown)
	})
}

func TestBackoff(t *testing.T) {
	t.Parallel()

	s := time.Second
	for failures, want := range map[int]time.Duration{1: 5 * s, 2: 10 * s, 3: 20 * s, 4: 40 * s, 5: 60 * s, 50: 60 * s} {
		require.Equal(t, want, scheduler.Backoff(5*s, 60*s, failures), "failures=%d", failures)
	}
}

// TestBackoffAtTheCap: the doubling never overflows, whatever the number of
// failures and however large the cap (a retry_backoff_cap of centuries).
func TestBackoffAtTheCap(t *testing.T) {
	t.Parallel()
	const huge = time.Duration(math.MaxInt64)
	for _, tc := range []struct {
		base, cap time.Duration
		failures  int
		want      time.Duration
	}{
		{time.Hour, huge, 1, time.Hour},
		{time.Hour, huge, 40, huge},
		{time.Hour, huge, math.MaxInt32, huge},
		{5 * time.Second, 5 * time.Minute, math.MaxInt32, 5 * time.Minute},
		{time.Nanosecond, huge, 62, time.Duration(1) << 61},
		{time.Nanosecond, huge, 64, huge},
		{time.Minute, time.Second, 3, time.Second},
	} {
		got := scheduler.Backoff(tc.base, tc.cap, tc.failures)
		require.Equal(t, tc.want, got, "base %s cap %s failures %d", tc.base, tc.cap, tc.failures)
		require.Positive(t, got)
	}
}
