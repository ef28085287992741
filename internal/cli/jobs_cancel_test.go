package cli

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
)

// insertRunningJob inserts a River job row in the running state, as if a
// worker were working it.
func insertRunningJob(t *testing.T, url, kind string) int64 {
	t.Helper()
	ctx := context.Background()
	pool, err := pgkit.Open(ctx, url, 10*time.Second)
	require.NoError(t, err)
	defer pool.Close()
	var id int64
	require.NoError(t, pool.QueryRow(ctx, `
		INSERT INTO river_job (args, kind, max_attempts, state, queue, attempt, attempted_at, attempted_by)
		VALUES ('{"ms": 600000, "ignore_cancel": true}', $1, 1, 'running', 'default', 1, now(), '{test}')
		RETURNING id`, kind).Scan(&id))
	return id
}

// TestJobsCancelTracksRunningJob: a running job cancelled with `sluice jobs
// cancel` (River's JobCancel) is registered with the cancellation monitor by
// the module's trigger on river_job, in the statement that cancels it.
func TestJobsCancelTracksRunningJob(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	pool, err := pgkit.Open(ctx, url, 10*time.Second)
	require.NoError(t, err)
	defer pool.Close()

	id := insertRunningJob(t, url, "demo.sleep")
	code, stdout, stderr := runCLI(t, "--database-url", url, "jobs", "cancel", strconv.FormatInt(id, 10))
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "is running: cancellation requested")

	var kind string
	var cancelledAt time.Time
	var counted *time.Time
	require.NoError(t, pool.QueryRow(ctx, "SELECT kind, cancelled_at, counted_at FROM task_cancellation_tracker WHERE job_id = $1", id).
		Scan(&kind, &cancelledAt, &counted))
	require.Equal(t, "demo.sleep", kind)
	require.Nil(t, counted)
	var metadata []byte
	require.NoError(t, pool.QueryRow(ctx, "SELECT metadata FROM river_job WHERE id = $1", id).Scan(&metadata))
	var meta struct {
		CancelAttemptedAt time.Time `json:"cancel_attempted_at"`
	}
	require.NoError(t, json.Unmarshal(metadata, &meta))
	require.WithinDuration(t, meta.CancelAttemptedAt, cancelledAt, time.Microsecond, "tracked with River's cancellation time")

	// A job that is not running is cancelled outright and not tracked.
	code, out := sluice(t, url, "enqueue", "demo.sleep", "--at", time.Now().Add(time.Hour).Format(time.RFC3339))
	require.Equal(t, 0, code, out)
	queued := out[:len(out)-1]
	code, stdout, stderr = runCLI(t, "--database-url", url, "jobs", "cancel", queued)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "cancelled")
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM task_cancellation_tracker").Scan(&n))
	require.Equal(t, 1, n)
}

// TestJobsCancelTrackingIsAtomic: if the job cannot be tracked, it is not
// cancelled either (the tracking is part of the cancelling statement).
func TestJobsCancelTrackingIsAtomic(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	pool, err := pgkit.Open(ctx, url, 10*time.Second)
	require.NoError(t, err)
	defer pool.Close()
	_, err = pool.Exec(ctx, "ALTER TABLE task_cancellation_tracker ADD CONSTRAINT test_refuse CHECK (kind <> 'demo.sleep')")
	require.NoError(t, err)

	id := insertRunningJob(t, url, "demo.sleep")
	before := testdb.Checksum(t, pool, "river_job", "task_cancellation_tracker")
	code, stdout, stderr := runCLI(t, "--database-url", url, "jobs", "cancel", strconv.FormatInt(id, 10))
	require.Equal(t, 1, code, stdout)
	require.Contains(t, stderr, "test_refuse")
	require.Equal(t, before, testdb.Checksum(t, pool, "river_job", "task_cancellation_tracker"), "the cancellation was rolled back")
}
