package cli

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
)

func TestPolicyCLI(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	pool, err := pgkit.Open(context.Background(), url, 10*time.Second)
	require.NoError(t, err)
	defer pool.Close()

	// Bad input: exit 2, nothing written.
	for _, args := range [][]string{
		{"policy", "set", "no.such", "--max-waiting", "1", "--on-conflict", "discard"},
		{"policy", "set", "demo.sleep", "--on-conflict", "discard"},
		{"policy", "set", "demo.sleep", "--max-waiting", "1"},
		{"policy", "set", "demo.sleep", "--max-waiting", "0", "--on-conflict", "discard"},
		{"policy", "set", "demo.sleep", "--max-waiting", "1", "--on-conflict", "drop"},
		{"policy", "set", "demo.sleep", "--max-waiting", "1", "--on-conflict", "discard", "--by-args", "nope"},
		{"policy", "set", "demo.sleep", "--max-waiting", "1", "--on-conflict", "debounce", "--debounce", "5s"},
		{"policy", "set", "demo.sleep", "--max-waiting", "1", "--on-conflict", "debounce", "--debounce", "5s", "--max-delay", "1s"},
		{"policy", "set", "demo.sleep", "--max-waiting", "1", "--on-conflict", "replace", "--debounce", "5s", "--max-delay", "1m"},
		{"policy", "set", "demo.sleep", "--max-waiting", "x", "--on-conflict", "discard"},
		{"policy", "reset", "demo.sleep"},
		{"policy", "keys"},
	} {
		code, out := sluice(t, url, args...)
		require.Equal(t, 2, code, "%v: %s", args, out)
	}
	require.Zero(t, qInt(t, pool, "SELECT count(*) FROM enqueue_policies"))

	code, out := sluice(t, url, "policy", "set", "demo.sleep", "--max-waiting", "1", "--by-args", "ms",
		"--on-conflict", "debounce", "--debounce", "2s", "--max-delay", "1m")
	require.Equal(t, 0, code, out)
	require.Equal(t, "policy of demo.sleep: max 1 waiting per ms, on conflict debounce 2s (max delay 1m0s)\n", out)
	code, out = sluice(t, url, "policy", "list")
	require.Equal(t, 0, code, out)
	require.Regexp(t, `(?m)^demo\.sleep\s+ms\s+1\s+debounce\s+2s\s+1m0s\s+sql$`, out)
	code, out = sluice(t, url, "policy", "list", "--json")
	require.Equal(t, 0, code, out)
	var docs []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &docs))
	require.EqualValues(t, 2000, docs[0]["debounce_ms"])

	// sluice enqueue meets the policy: the second enqueue of a key answers
	// with the waiting job's id.
	code, first := sluice(t, url, "enqueue", "demo.sleep", "--args", `{"ms": 5}`)
	require.Equal(t, 0, code, first)
	code, second := sluice(t, url, "enqueue", "demo.sleep", "--args", `{"ms": 5}`)
	require.Equal(t, 0, code, second)
	require.Regexp(t, `^\d+\n$`, first)
	require.Contains(t, second, "the enqueue policy of demo.sleep answered with job "+first[:len(first)-1])
	require.Equal(t, 1, qInt(t, pool, "SELECT count(*) FROM river_job WHERE kind = 'demo.sleep'"))
	code, out = sluice(t, url, "jobs", "show", first[:len(first)-1])
	require.Equal(t, 0, code, out)
	require.Regexp(t, `enqueue policy:\s+key 5; debounced 1 time\(s\) by later enqueues`, out)

	code, out = sluice(t, url, "policy", "keys", "demo.sleep")
	require.Equal(t, 0, code, out)
	require.Regexp(t, `(?m)^5\s+1\s+1\s+1\s+0\s+0\s+1\s`, out)
	code, out = sluice(t, url, "policy", "keys", "demo.sleep", "--full", "--json")
	require.Equal(t, 0, code, out)
	var keys []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &keys))
	require.Len(t, keys, 1)
	require.EqualValues(t, 1, keys[0]["debounced"])

	code, out = sluice(t, url, "policy", "set", "demo.sleep", "--max-waiting", "2", "--on-conflict", "replace", "--keep-scheduled-at")
	require.Equal(t, 0, code, out)
	require.Equal(t, "policy of demo.sleep: max 2 waiting, on conflict replace, keeping the waiting job's scheduled_at\n", out)
	code, out = sluice(t, url, "policy", "list")
	require.Equal(t, 0, code, out)
	require.Regexp(t, `(?m)^demo\.sleep\s+-\s+2\s+replace \(keeps scheduled_at\)\s+-\s+-\s+sql$`, out)

	// reject: sluice enqueue exits 1 with the error, inserting nothing.
	code, out = sluice(t, url, "policy", "set", "demo.sleep", "--max-waiting", "1", "--by-args", "ms", "--on-conflict", "reject")
	require.Equal(t, 0, code, out)
	code, out = sluice(t, url, "enqueue", "demo.sleep", "--args", `{"ms": 5}`)
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "enqueue policy of demo.sleep: key 5 already has 1 waiting jobs (max_waiting 1): insert rejected (SQLSTATE SLR01)")
	require.Equal(t, 1, qInt(t, pool, "SELECT count(*) FROM river_job WHERE kind = 'demo.sleep'"))

	code, out = sluice(t, url, "policy", "clear", "demo.sleep")
	require.Equal(t, 0, code, out)
	require.Zero(t, qInt(t, pool, "SELECT count(*) FROM enqueue_policies"))
	code, out = sluice(t, url, "policy", "clear", "demo.sleep")
	require.Equal(t, 2, code, out)
	require.Contains(t, out, `no enqueue policy is set for "demo.sleep"`)
}
