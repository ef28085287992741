package policy_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/policy"
)

// An InsertMany under a policy into river_job analyzed while empty (a new
// install autovacuum has seen, a quiet system after River's cleaner) finds
// each key's counts row and waiting job by their indexes. Planned from
// the empty tables' statistics, the trigger's lookups were sequential
// scans, one per row inserted, each reading the rows the statement had
// inserted before it: 2,000 rows made 10,000 scans, 10,000 rows took
// 36-53 s (migration 00027). The inserting transaction's own scan counts
// tell.
func TestInsertManyIntoAnEmptyAnalyzedTableUsesTheIndexes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	e.set(t, policy.Policy{ByArgs: []string{"tenant"}, MaxWaiting: 1, OnConflict: policy.Discard})
	_, err := e.pool.Exec(ctx, "VACUUM ANALYZE river_job, enqueue_policy_counts")
	require.NoError(t, err)

	const n = 2000
	rows := make([]river.InsertManyParams, n)
	for i := range rows {
		rows[i] = river.InsertManyParams{Args: syncArgs{Tenant: fmt.Sprintf("t%d", i), Seq: i}}
	}
	// seqScans inserts rows in one transaction and returns how many jobs
	// went in and how many sequential scans of the two tables it made.
	seqScans := func() (inserted, scans int) {
		t.Helper()
		tx, err := e.pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck // committed below
		res, err := e.client.InsertManyTx(ctx, tx, rows)
		require.NoError(t, err)
		for _, r := range res {
			if !r.UniqueSkippedAsDuplicate {
				inserted++
			}
		}
		require.NoError(t, tx.QueryRow(ctx, `SELECT COALESCE(sum(seq_scan), 0)::int FROM pg_stat_xact_user_tables
			WHERE relname IN ('river_job', 'enqueue_policy_counts')`).Scan(&scans))
		require.NoError(t, tx.Commit(ctx))
		return inserted, scans
	}

	inserted, scans := seqScans()
	require.Equal(t, n, inserted, "every key had room")
	require.Less(t, scans, 10, "sequential scans while inserting %d rows into empty keys", n)
	inserted, scans = seqScans()
	require.Zero(t, inserted, "every key is full: each insert answered with the waiting job")
	require.Less(t, scans, 10, "sequential scans while answering %d rows from full keys", n)
}
