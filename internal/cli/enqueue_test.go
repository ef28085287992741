package cli

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
)

// TestEnqueueOptions: every insert option lands in the River row as River's
// InsertOpts put it there.
func TestEnqueueOptions(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	pool := livePool(t, url)
	row := func(id int64) (queue string, priority, maxAttempts int, tags []string, state string, scheduledAt time.Time) {
		t.Helper()
		require.NoError(t, pool.QueryRow(ctx, `SELECT queue, priority, max_attempts, tags, state::text, scheduled_at FROM river_job WHERE id = $1`, id).
			Scan(&queue, &priority, &maxAttempts, &tags, &state, &scheduledAt))
		return
	}

	id := enqueueID(t, url, "demo.sleep", "--args", `{"ms": 3}`, "--queue", "emails", "--priority", "4",
		"--max-attempts", "2", "--tags", "nightly,batch_7,re-run")
	queue, priority, maxAttempts, tags, state, _ := row(id)
	require.Equal(t, "emails", queue)
	require.Equal(t, 4, priority)
	require.Equal(t, 2, maxAttempts)
	require.Equal(t, []string{"nightly", "batch_7", "re-run"}, tags)
	require.Equal(t, "available", state)

	// Defaults: the kind's own InsertOpts (maintenance kinds: their queue and
	// 3 attempts), else River's.
	id = enqueueID(t, url, "ci.drop_running_builds")
	queue, priority, maxAttempts, tags, _, _ = row(id)
	require.Equal(t, "maintenance", queue)
	require.Equal(t, 1, priority)
	require.Equal(t, 3, maxAttempts)
	require.Empty(t, tags)

	before := time.Now()
	id = enqueueID(t, url, "demo.sleep", "--in", "90m")
	_, _, _, _, state, at := row(id)
	require.Equal(t, "scheduled", state)
	require.WithinDuration(t, before.Add(90*time.Minute), at, time.Minute)
	id = enqueueID(t, url, "demo.sleep", "--at", "2099-01-02T03:04:05Z")
	_, _, _, _, state, at = row(id)
	require.Equal(t, "scheduled", state)
	require.True(t, at.Equal(time.Date(2099, 1, 2, 3, 4, 5, 0, time.UTC)), at)
}

// TestEnqueueUnique: --unique-by-args and --unique-period insert nothing
// when a job of the kind with the same args (in the same period) exists,
// and print that job's id, saying so.
func TestEnqueueUnique(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	pool := livePool(t, url)
	first := enqueueID(t, url, "demo.sleep", "--args", `{"ms": 1}`, "--unique-by-args", "--in", "1h")

	code, stdout, stderr := runCLI(t, "--database-url", url, "enqueue", "demo.sleep", "--args", `{"ms": 1}`, "--unique-by-args", "--in", "1h")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, fmt.Sprintf("%d\n", first), stdout)
	require.Equal(t, fmt.Sprintf("sluice: not inserted: job %d (demo.sleep, scheduled) is its duplicate\n", first), stderr)

	other := enqueueID(t, url, "demo.sleep", "--args", `{"ms": 2}`, "--unique-by-args", "--in", "1h")
	require.NotEqual(t, first, other, "other args: another job")
	require.Equal(t, 2, jobtest.Count(t, pool, `SELECT count(*) FROM river_job`))

	// By period: one job of the kind per day, whatever its args.
	daily := enqueueID(t, url, "ci.drop_running_builds", "--unique-period", "24h")
	code, stdout, stderr = runCLI(t, "--database-url", url, "enqueue", "ci.drop_running_builds", "--unique-period", "24h")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, fmt.Sprintf("%d\n", daily), stdout)
	require.Contains(t, stderr, "is its duplicate")
	require.Equal(t, 3, jobtest.Count(t, pool, `SELECT count(*) FROM river_job`))
}

// TestEnqueueBadOptionsWriteNothing: each malformed option exits 2 before
// anything is written.
func TestEnqueueBadOptionsWriteNothing(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	pool := livePool(t, url)
	for _, args := range [][]string{
		{"--queue", "Emails"},
		{"--priority", "0"},
		{"--priority", "9"},
		{"--max-attempts", "0"},
		{"--max-attempts", "100000"},
		{"--tags", "ok-tag,two words"},
		{"--tags", "a"},
		{"--at", "2099-01-01T00:00:00Z", "--in", "5m"},
		{"--at", "next week"},
		{"--in", "-1s"},
		{"--in", "0s"},
		{"--unique-period", "999ms"},
		{"--unique-by-args", "--unique-period", "0s"},
	} {
		code, stdout, stderr := runCLI(t, append([]string{"--database-url", url, "enqueue", "demo.sleep"}, args...)...)
		require.Equal(t, 2, code, "%v: %s%s", args, stdout, stderr)
		require.Empty(t, stdout, "%v", args)
		require.True(t, strings.HasPrefix(stderr, "sluice: invalid --") || strings.HasPrefix(stderr, "sluice: --at and --in"), "%v: %s", args, stderr)
	}
	require.Zero(t, jobtest.Count(t, pool, `SELECT count(*) FROM river_job`), "nothing was inserted")
}
