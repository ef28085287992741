package pgkit_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
)

// TestCustomPlans: a statement sent through CustomPlans is planned at each
// run for the table as it is: after ten runs on an empty table it has left
// no prepared statement on the connection (no cached generic plan to
// reuse), where pgx's default mode leaves one; and planned through it once
// the table has grown to 20,000 rows, it reads the table by its index.
func TestCustomPlans(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.NewPool(t)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `CREATE TEMP TABLE plan_probe (k int, v int);
		CREATE INDEX ON plan_probe (k, v);
		ANALYZE plan_probe`)
	require.NoError(t, err)

	const probe = `SELECT v FROM plan_probe WHERE k = $1 ORDER BY v LIMIT 1`
	prepared := func() int {
		var n int
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_prepared_statements WHERE statement = $1`, probe).Scan(&n))
		return n
	}
	custom := pgkit.CustomPlans(conn)
	for i := range 10 {
		rows, err := custom.Query(ctx, probe, i)
		require.NoError(t, err)
		rows.Close()
	}
	require.Zero(t, prepared(), "CustomPlans left a prepared statement")

	// A scan of 20,000 rows for one key reads them all; the index, a few.
	_, err = conn.Exec(ctx, `INSERT INTO plan_probe SELECT g % 100, g FROM generate_series(1, 20000) g`)
	require.NoError(t, err)
	rows, err := custom.Query(ctx, `EXPLAIN `+probe, 7)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Contains(t, strings.Join(lines, "\n"), "Index", "a custom plan of the grown table does not use its index")

	rows, err = conn.Query(ctx, probe, 1)
	require.NoError(t, err)
	rows.Close()
	require.Equal(t, 1, prepared(), "pgx's default mode is expected to prepare the statement (the contrast above)")
}
