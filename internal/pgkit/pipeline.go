// Package pgkit is sluice's hand-written pgx plumbing: a transaction whose
// statements travel in as few round trips as they can (Pipeline). It
// knows no query by name: it runs what sqlc generated.
package pgkit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Pipeline is one transaction on a connection of a pool whose statements
// travel together where they can: BEGIN, and every statement whose result
// nobody reads (an sqlc ":exec"), wait and go with the next statement that
// returns something, or with COMMIT, in one round trip (a pgx batch). The
// statements still run one after another, each with a snapshot of its own,
// exactly as if sent one by one; an error of a statement that waited is
// returned by the call that sends it, naming the statement.
//
// A transaction that holds a lock from its first statement to its commit
// holds it for its round trips: on a busy 2-CPU machine each costs 1-2 ms
// of scheduling. Sent this way, a lock, a read and the writes after it
// are two round trips.
type Pipeline struct {
	conn  *pgxpool.Conn
	batch *pgx.Batch
	names []string // the names of the queued statements, for errors
	done  bool     // committed or rolled back
	trips int      // round trips sent
}

// rollbackTimeout bounds a Pipeline's ROLLBACK.
const rollbackTimeout = 5 * time.Second

// Begin acquires a connection of pool and queues the BEGIN of its
// transaction (sent with its first statement that returns something).
func Begin(ctx context.Context, pool *pgxpool.Pool) (*Pipeline, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire a connection: %w", err)
	}
	p := &Pipeline{conn: conn, batch: &pgx.Batch{}}
	p.queue("begin", "BEGIN")
	return p, nil
}

// Run runs fn in a Pipeline's transaction on pool and commits, or rolls
// back when fn or the commit fails (or fn panics).
func Run(ctx context.Context, pool *pgxpool.Pool, fn func(p *Pipeline) error) error {
	p, err := Begin(ctx, pool)
	if err != nil {
		return err
	}
	defer p.Rollback(ctx) // a no-op once committed
	if err := fn(p); err != nil {
		return err
	}
	return p.Commit(ctx)
}

// queue adds a statement to the next round trip.
func (p *Pipeline) queue(name, sql string, args ...any) {
	p.batch.Queue(sql, args...)
	p.names = append(p.names, name)
}

// deferrable reports whether sql is an sqlc ":exec", whose caller reads
// nothing of its result but its error, and its name.
func deferrable(sql string) (string, bool) {
	const prefix = "-- name: "
	if !strings.HasPrefix(sql, prefix) {
		return "statement", false
	}
	line, _, _ := strings.Cut(sql[len(prefix):], "\n")
	name, annotation, _ := strings.Cut(strings.TrimSpace(line), " ")
	return name, strings.TrimSpace(annotation) == ":exec"
}

// Trips is how many round trips the pipeline has sent.
func (p *Pipeline) Trips() int { return p.trips }

// send sends the queued statements and sql as one batch, reads the results
// of the queued ones, and returns the batch positioned at sql's.
func (p *Pipeline) send(ctx context.Context, name, sql string, args ...any) (pgx.BatchResults, error) {
	if p.done {
		return nil, errors.New("pipeline: transaction already ended")
	}
	p.queue(name, sql, args...)
	batch, names := p.batch, p.names
	p.batch, p.names = &pgx.Batch{}, nil
	p.trips++
	br := p.conn.SendBatch(ctx, batch)
	for _, n := range names[:len(names)-1] {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return nil, fmt.Errorf("%s: %w", n, err)
		}
	}
	return br, nil
}

// Exec runs sql: an sqlc ":exec" waits for the next round trip; any other
// statement goes now, with those waiting.
func (p *Pipeline) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	name, later := deferrable(sql)
	if later && !p.done {
		p.queue(name, sql, args...)
		return pgconn.CommandTag{}, nil
	}
	br, err := p.send(ctx, name, sql, args...)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return tag, fmt.Errorf("%s: %w", name, err)
	}
	return tag, nil
}

// Query runs sql with the statements waiting, in one round trip.
func (p *Pipeline) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	name, _ := deferrable(sql)
	br, err := p.send(ctx, name, sql, args...)
	if err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &pipelineRows{Rows: rows, br: br}, nil
}

// QueryRow runs sql with the statements waiting and returns its first row.
func (p *Pipeline) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := p.Query(ctx, sql, args...)
	return &pipelineRow{rows: rows, err: err}
}

// Commit sends the statements waiting and COMMIT in one round trip.
func (p *Pipeline) Commit(ctx context.Context) error {
	br, err := p.send(ctx, "commit", "COMMIT")
	if err != nil {
		return err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err == nil && tag.String() == "ROLLBACK" {
		err = pgx.ErrTxCommitRollback
	}
	if err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	p.done = true
	p.conn.Release()
	return nil
}

// Rollback ends the transaction without committing (what waits is
// dropped) and releases the connection. It is a no-op once ended.
func (p *Pipeline) Rollback(ctx context.Context) {
	if p.done {
		return
	}
	p.done = true
	p.batch, p.names = &pgx.Batch{}, nil
	conn := p.conn.Conn()
	if !conn.IsClosed() && conn.PgConn().TxStatus() != 'I' {
		// Even when ctx has ended (a rollback after a timeout), for a
		// bounded time.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		if _, err := conn.Exec(rctx, "ROLLBACK"); err != nil {
			// The connection is in an unknown state: it is not reused.
			_ = conn.Close(rctx)
		}
		cancel()
	}
	p.conn.Release()
}

// pipelineRows are a statement's rows; closing them ends their batch.
type pipelineRows struct {
	pgx.Rows
	br  pgx.BatchResults
	err error
	end bool
}

// Next advances to the next row; after the last, the batch ends.
func (r *pipelineRows) Next() bool {
	if r.end {
		return false
	}
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

// Close closes the rows and their batch.
func (r *pipelineRows) Close() {
	if r.end {
		return
	}
	r.end = true
	r.Rows.Close()
	r.err = r.Rows.Err()
	if err := r.br.Close(); r.err == nil {
		r.err = err
	}
}

// Err is the error of the rows or of their batch.
func (r *pipelineRows) Err() error {
	if r.end {
		return r.err
	}
	return r.Rows.Err()
}

// pipelineRow is the first row of a statement's rows, as pgx's QueryRow.
type pipelineRow struct {
	rows pgx.Rows
	err  error
}

// Scan reads the first row into dest, or returns pgx.ErrNoRows.
func (r *pipelineRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}
