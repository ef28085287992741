package cli

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/testdb"
)

// TestRunDuplicate: run of a kind with unique insert options while an
// identical job waits (concurrency_limit.resume of a kind, here scheduled
// an hour ahead, with no worker) does not wait for that job, which only a
// worker serving its queue will work: River skips the insert, and run says
// which job it duplicates and exits 1, changing nothing.
func TestRunDuplicate(t *testing.T) {
	t.Parallel()
	url := testdb.New(t)
	pool := livePool(t, url)
	resume := []string{"concurrency_limit.resume", "--args", `{"kind": "demo.sleep"}`}
	code, stdout, stderr := runCLI(t, append([]string{"--database-url", url, "enqueue"}, append(resume, "--in", "1h")...)...)
	require.Equal(t, 0, code, stderr)
	waiting, err := strconv.ParseInt(strings.TrimSpace(stdout), 10, 64)
	require.NoError(t, err, stdout)
	before := testdb.Checksum(t, pool, "river_job")

	// --timeout only bounds the test, should run wait for the job after all.
	code, stdout, stderr = runCLI(t, append([]string{"--database-url", url, "run"}, append(resume, "--timeout", "1m")...)...)
	require.Equal(t, 1, code, stdout)
	require.Empty(t, stdout)
	require.Equal(t, fmt.Sprintf("sluice: concurrency_limit.resume job not run: it is a duplicate of job %d (scheduled in queue maintenance) "+
		"by the kind's unique options, so River skipped its insert; job %d is for a worker serving queue maintenance "+
		"(let it finish, or cancel it, to run the kind here)\n", waiting, waiting), stderr)
	require.Equal(t, before, testdb.Checksum(t, pool, "river_job"), "nothing inserted, nothing changed")

	// Once the waiting job is cancelled, run runs the kind.
	code, _, stderr = runCLI(t, "--database-url", url, "jobs", "cancel", strconv.FormatInt(waiting, 10))
	require.Equal(t, 0, code, stderr)
	code, stdout, stderr = runCLI(t, append([]string{"--database-url", url, "run"}, resume...)...)
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `^concurrency_limit\.resume job \d+ completed in `, stdout)
}

// TestRunTimeout: --timeout bounds the whole run, and its error says what
// run was waiting for: a slot of a kind whose limit is a circuit breaker
// (the job deleted unrun, however long --wait), or the job itself (the job
// cancelled, not left running or waiting).
func TestRunTimeout(t *testing.T) {
	t.Parallel()
	// The bounds are far longer than run takes to insert its job, so that
	// they pass while run waits for a slot or for the job.
	t.Run("waiting for a slot", func(t *testing.T) {
		t.Parallel()
		url := testdb.New(t)
		pool := livePool(t, url)
		code, _, stderr := runCLI(t, "--database-url", url, "limits", "set", "demo.sleep", "-1")
		require.Equal(t, 0, code, stderr)
		code, stdout, stderr := runCLI(t, "--database-url", url, "run", "demo.sleep", "--args", `{"ms": 1}`, "--wait", "1h", "--timeout", "5s")
		require.Equal(t, 1, code, stdout)
		require.Regexp(t, `^sluice: gave up after --timeout 5s waiting for a free demo\.sleep slot \(its limit -1 is a circuit breaker\); job \d+ deleted unrun\n$`, stderr)
		require.Zero(t, qInt(t, pool, `SELECT count(*) FROM river_job WHERE kind = 'demo.sleep'`), "the job is deleted unrun")
		require.Zero(t, qInt(t, pool, `SELECT count(*) FROM concurrency_executions`), "no slot left reserved")
	})
	t.Run("waiting for the job", func(t *testing.T) {
		t.Parallel()
		url := testdb.New(t)
		pool := livePool(t, url)
		code, stdout, stderr := runCLI(t, "--database-url", url, "run", "demo.sleep", "--args", `{"ms": 3600000}`, "--timeout", "5s")
		require.Equal(t, 1, code, stdout)
		m := regexp.MustCompile(`^sluice: gave up after --timeout 5s waiting for job (\d+) of demo\.sleep to (start|finish) \(.+\); job cancelled\n$`).FindStringSubmatch(stderr)
		require.NotNil(t, m, stderr)
		var state string
		require.NoError(t, pool.QueryRow(t.Context(), `SELECT state::text FROM river_job WHERE id = $1`, m[1]).Scan(&state))
		require.Contains(t, []string{"cancelled", "discarded"}, state, "the job is finished, not left to run")
	})
}
