package pgkit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
)

// pipelineStatements are statements shaped as sqlc writes them: an :exec
// travels with the next statement that returns something, an :one goes
// at once.
const (
	pipeInsert = "-- name: PipeInsert :exec\nINSERT INTO pipe_rows (id) VALUES ($1)"
	pipeLock   = "-- name: PipeLock :exec\nLOCK TABLE pipe_rows IN ACCESS EXCLUSIVE MODE"
	pipeCount  = "-- name: PipeCount :one\nSELECT count(*)::int FROM pipe_rows"
)

// newPipePool is a pool of one connection over a database with an empty
// pipe_rows table.
func newPipePool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	url := testdb.New(t)
	cfg, err := pgkit.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = 1
	pool, err := pgkit.OpenConfig(context.Background(), cfg, url, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(context.Background(), "CREATE TABLE pipe_rows (id int PRIMARY KEY)")
	require.NoError(t, err)
	return pool
}

// TestPipelineDefersExecs: an :exec is not sent when called (another
// connection still reads the table it will lock), but goes, in order,
// with the next statement that returns something (which sees its row, and
// after which the lock is held); what it wrote is there after the commit,
// the last :exec with the COMMIT.
func TestPipelineDefersExecs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPipePool(t)
	other, err := pgx.Connect(ctx, pool.Config().ConnConfig.ConnString())
	require.NoError(t, err)
	defer other.Close(ctx)
	readOther := func() error {
		_, err := other.Exec(ctx, "SET lock_timeout = '200ms'; SELECT count(*) FROM pipe_rows")
		return err
	}

	err = pgkit.Run(ctx, pool, func(p *pgkit.Pipeline) error {
		if _, err := p.Exec(ctx, pipeInsert, 1); err != nil {
			return err
		}
		if _, err := p.Exec(ctx, pipeLock); err != nil {
			return err
		}
		require.NoError(t, readOther(), "the lock was taken before a statement that returns something")
		var n int
		require.NoError(t, p.QueryRow(ctx, pipeCount).Scan(&n))
		require.Equal(t, 1, n, "the insert did not run before the count")
		var pgErr *pgconn.PgError
		require.ErrorAs(t, readOther(), &pgErr, "the lock is not held after the count")
		require.Equal(t, "55P03", pgErr.Code)
		_, err := p.Exec(ctx, pipeInsert, 2)
		return err
	})
	require.NoError(t, err)

	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pipe_rows").Scan(&n))
	require.Equal(t, 2, n, "the insert queued before the commit was not committed")
}

// TestPipelineDeferredErrorRollsBack: an :exec that fails returns no error
// when called; the next statement returns its error, naming it, and the
// transaction rolls back whole (the row inserted before it is gone); the
// pool's one connection is usable again. A failure of fn rolls back what
// waits too.
func TestPipelineDeferredErrorRollsBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPipePool(t)

	err := pgkit.Run(ctx, pool, func(p *pgkit.Pipeline) error {
		if _, err := p.Exec(ctx, pipeInsert, 1); err != nil {
			return err
		}
		if _, err := p.Exec(ctx, pipeInsert, 1); err != nil {
			t.Fatalf("a deferred statement failed when queued: %v", err)
		}
		var n int
		return p.QueryRow(ctx, pipeCount).Scan(&n)
	})
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "23505", pgErr.Code)
	require.ErrorContains(t, err, "PipeInsert")

	errFn := errors.New("fn failed")
	err = pgkit.Run(ctx, pool, func(p *pgkit.Pipeline) error {
		var n int
		if err := p.QueryRow(ctx, pipeCount).Scan(&n); err != nil {
			return err
		}
		if _, err := p.Exec(ctx, pipeInsert, 3); err != nil {
			return err
		}
		return errFn
	})
	require.ErrorIs(t, err, errFn)

	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pipe_rows").Scan(&n))
	require.Zero(t, n, "a failed transaction left rows")
	require.NoError(t, pgkit.Run(ctx, pool, func(p *pgkit.Pipeline) error {
		_, err := p.Exec(ctx, pipeInsert, 4)
		return err
	}))
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pipe_rows").Scan(&n))
	require.Equal(t, 1, n)
}
