package db_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/testdb"
)

// pipelineStatements are statements shaped as sqlc writes them: an :exec
// travels with the next statement that returns something, an :one goes
// at once.
const (
	pipeInsert = "-- name: PipeInsert :exec\nINSERT INTO pipe_rows (id) VALUES ($1)"
	pipeLock   = "-- name: PipeLock :exec\nLOCK TABLE pipe_rows IN ACCESS EXCLUSIVE MODE"
	pipeCount  = "-- name: PipeCount :one\nSELECT count(*)::int FROM pipe_rows"
	pipeMode   = "-- name: PipeMode :one\nSELECT current_setting('enable_seqscan')"
)

// newPipePool is a pool of one connection over a database with an empty
// pipe_rows table.
func newPipePool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	url := testdb.New(t)
	cfg, err := db.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = 1
	pool, err := db.OpenConfig(context.Background(), cfg, url, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(context.Background(), "CREATE TABLE pipe_rows (id int PRIMARY KEY)")
	require.NoError(t, err)
	return pool
}

// TestPipelineDefersExecs: an :exec is not sent when called (another
// connection still reads the table it will lock), but goes, in order,
// with the next statement that returns something (which sees its row, and
// after which the lock is held); the transaction runs with sequential
// scans off, and the connection is back to the default once it
// committed; what it wrote is there after the commit.
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

	err = db.PipelineFunc(ctx, pool, func(p *db.Pipeline) error {
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
		var mode string
		require.NoError(t, p.QueryRow(ctx, pipeMode).Scan(&mode))
		require.Equal(t, "off", mode, "sequential scans are on in the pipeline")
		_, err := p.Exec(ctx, pipeInsert, 2)
		return err
	})
	require.NoError(t, err)

	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pipe_rows").Scan(&n))
	require.Equal(t, 2, n, "the insert queued before the commit was not committed")
	var mode string
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_setting('enable_seqscan')").Scan(&mode))
	require.Equal(t, "on", mode, "enable_seqscan off outlived the transaction")
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

	err := db.PipelineFunc(ctx, pool, func(p *db.Pipeline) error {
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
	err = db.PipelineFunc(ctx, pool, func(p *db.Pipeline) error {
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
	require.NoError(t, db.PipelineFunc(ctx, pool, func(p *db.Pipeline) error {
		_, err := p.Exec(ctx, pipeInsert, 4)
		return err
	}))
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pipe_rows").Scan(&n))
	require.Equal(t, 1, n)
}

// pipeAbove counts the rows above an id: a statement to prefetch.
const pipeAbove = "-- name: PipeAbove :one\nSELECT count(*)::int FROM pipe_rows WHERE id > $1"

// TestPipelinePrefetch: a statement prefetched goes with the next
// statement that returns rows, after it (it sees that statement's
// effects), and the Query that asks for it next, with the same arguments
// and nothing queued in between, reads its rows without a round trip;
// other arguments, or an :exec queued in between, drop it, and the
// statement runs afresh, in order (it sees the exec's row). A Query after
// an unused prefetch and the commit still work.
func TestPipelinePrefetch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPipePool(t)
	_, err := pool.Exec(ctx, "INSERT INTO pipe_rows VALUES (1), (2), (3)")
	require.NoError(t, err)
	const pipeDelete = "-- name: PipeDelete :many\nDELETE FROM pipe_rows WHERE id = $1 RETURNING id"

	err = db.PipelineFunc(ctx, pool, func(p *db.Pipeline) error {
		var n, deleted int
		// Used: one trip for both; it sees the delete before it.
		p.Prefetch("PipeAbove", pipeAbove, 0)
		require.NoError(t, p.QueryRow(ctx, pipeDelete, 3).Scan(&deleted))
		trips := p.Trips()
		require.NoError(t, p.QueryRow(ctx, pipeAbove, 0).Scan(&n))
		require.Equal(t, 2, n, "the prefetched count ran after the delete")
		require.Equal(t, trips, p.Trips(), "the prefetched rows took a round trip")

		// Other arguments: dropped, and the statement runs afresh.
		p.Prefetch("PipeAbove", pipeAbove, 0)
		require.NoError(t, p.QueryRow(ctx, pipeDelete, 2).Scan(&deleted))
		require.NoError(t, p.QueryRow(ctx, pipeAbove, 5).Scan(&n))
		require.Zero(t, n)
		require.Equal(t, trips+2, p.Trips())

		// An :exec queued in between: dropped; the count sees its row.
		p.Prefetch("PipeAbove", pipeAbove, 0)
		require.NoError(t, p.QueryRow(ctx, pipeDelete, 1).Scan(&deleted))
		_, err := p.Exec(ctx, pipeInsert, 7)
		require.NoError(t, err)
		require.NoError(t, p.QueryRow(ctx, pipeAbove, 0).Scan(&n))
		require.Equal(t, 1, n, "the count ran before the insert queued ahead of it")

		// Unused at the commit.
		p.Prefetch("PipeAbove", pipeAbove, 0)
		return p.QueryRow(ctx, pipeCount).Scan(&n)
	})
	require.NoError(t, err)
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pipe_rows").Scan(&n))
	require.Equal(t, 1, n)
}

// TestPrefetchMatchesTheQueries: PrefetchLineFront and PrefetchKeyLines
// send their statements with the arguments LineFront and KeyLines send
// (the generated methods' order): the query that follows takes no trip.
func TestPrefetchMatchesTheQueries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.NewPool(t)
	err := db.PipelineFunc(ctx, pool, func(p *db.Pipeline) error {
		q := db.New(p)
		front := db.LineFrontParams{Kind: "k", Keys: []string{"a", "b"}, PerKey: 4, KeyMax: 2}
		q.PrefetchLineFront(front)
		if _, err := q.LimitStates(ctx); err != nil {
			return err
		}
		trips := p.Trips()
		if _, err := q.LineFront(ctx, front); err != nil {
			return err
		}
		require.Equal(t, trips, p.Trips(), "LineFront was not prefetched")

		lines := db.KeyLinesParams{Kind: "k", Keys: []string{"a"}, PeriodMs: 1000}
		q.PrefetchKeyLines(lines)
		if _, err := q.LimitStates(ctx); err != nil {
			return err
		}
		trips = p.Trips()
		if _, err := q.KeyLines(ctx, lines); err != nil {
			return err
		}
		require.Equal(t, trips, p.Trips(), "KeyLines was not prefetched")
		return nil
	})
	require.NoError(t, err)
}
