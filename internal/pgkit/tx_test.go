package pgkit_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
)

// TestInTx: fn's writes are committed when it returns nil, and rolled back
// when it returns an error, which InTx returns as is.
func TestInTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.NewPool(t)
	_, err := pool.Exec(ctx, `CREATE TABLE intx_test (n integer)`)
	require.NoError(t, err)
	insert := func(n int, fail error) error {
		return pgkit.InTx(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO intx_test VALUES ($1)`, n); err != nil {
				return err
			}
			return fail
		})
	}
	require.NoError(t, insert(1, nil))
	boom := errors.New("boom")
	require.ErrorIs(t, insert(2, boom), boom)
	var got []int32
	rows, err := pool.Query(ctx, `SELECT n FROM intx_test ORDER BY n`)
	require.NoError(t, err)
	got, err = pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	require.Equal(t, []int32{1}, got, "the first committed, the second rolled back")
}
