package limiter

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/limiter/internal/ledger"
)

// TestReleasesWrittenInOrderAfterAFailure: a release that failed is
// written again before any release that came after it, never after one.
// Job 1 ended and its slot was handed over in memory to job 2, whose run
// ended too; the move failed (a lock timeout, as a database restart would
// fail it), job 2's own release then committed at once. Written in their
// order, the slot goes; written in the other (the failed move retried
// last, as independent retries of each release could), job 1's slot row
// became job 2's after job 2 had ended, and stayed taken forever (seen in
// TestPostgresRestartDuringAdmission).
func TestReleasesWrittenInOrderAfterAFailure(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	const kind = "test.release.order"
	pool, l := slotTaken(t, kind)
	t.Cleanup(l.Flush)
	taken := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM concurrency_executions WHERE kind = $1`, kind).Scan(&n))
		return n
	}

	// The move fails: the test holds the kind's ledger lock.
	lock, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer lock.Rollback(ctx) //nolint:errcheck
	_, err = lock.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('sluice.limit_row:' || $1, 0))`, kind)
	require.NoError(t, err)
	l.releaseBatch([]*releaseRequest{{handed: &ledger.HandOver{From: ledger.Held{ID: 1, Kind: kind}, To: ledger.Held{ID: 2, Kind: kind}}}})
	require.Equal(t, 1, taken(), "the move failed: job 1's slot row is there still")
	require.NoError(t, lock.Rollback(ctx))

	// Job 2 ended: its release commits, and the slot is free from then on
	// (the failed move's retries come 100 ms and more after it failed).
	l.releaseBatch([]*releaseRequest{{ended: &ledger.Held{ID: 2, Kind: kind}}})
	require.Zero(t, taken(), "the slot is free once job 2's release committed")
	require.Never(t, func() bool { return taken() > 0 }, 2*time.Second, 20*time.Millisecond,
		"a slot row came back after job 2's release")
	var admitted int
	require.NoError(t, pool.QueryRow(ctx, `SELECT admitted FROM concurrency_limits WHERE kind = $1`, kind).Scan(&admitted))
	require.Zero(t, admitted, "the kind counts no slot taken")
}

// TestFlushTriesAFailedReleaseOnceMore: a worker that stops right after a
// release failed (its retry not due yet) writes it once more as it
// flushes, rather than leave the slot to the safety net.
func TestFlushTriesAFailedReleaseOnceMore(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	const kind = "test.release.flush"
	pool, l := slotTaken(t, kind)

	lock, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer lock.Rollback(ctx) //nolint:errcheck
	_, err = lock.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('sluice.limit_row:' || $1, 0))`, kind)
	require.NoError(t, err)
	l.releaseBatch([]*releaseRequest{{ended: &ledger.Held{ID: 1, Kind: kind}}})
	require.NoError(t, lock.Rollback(ctx))

	l.Flush()
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM concurrency_executions WHERE kind = $1`, kind).Scan(&n))
	require.Zero(t, n, "the failed release was not written at the flush")
}

// slotTaken sets up kind, limited to 1, on a fresh database whose
// statements give up on a lock after 200 ms, with job 1 holding its slot in
// worker "w1", and returns the pool and that worker's Limiter (not
// flushed).
func slotTaken(t *testing.T, kind string) (*pgxpool.Pool, *Limiter) {
	t.Helper()
	ctx := context.Background()
	url := testdb.New(t)
	pool, err := pgkit.Open(ctx, url+sepOf(url)+"lock_timeout=200", 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = db.New(pool).SetConcurrencyLimit(ctx, db.SetConcurrencyLimitParams{Kind: kind, MaxConcurrency: 1})
	require.NoError(t, err)
	l, err := New(Config{Pool: pool, WorkerID: "w1"})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO concurrency_executions (job_id, kind, worker_id) VALUES (1, $1, 'w1')`, kind)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE concurrency_limits SET admitted = 1 WHERE kind = $1`, kind)
	require.NoError(t, err)
	return pool, l
}

// sepOf is the separator before a parameter added to url.
func sepOf(url string) string {
	if strings.Contains(url, "?") {
		return "&"
	}
	return "?"
}
