package db

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Pipeline is one transaction on a connection of a pool whose statements
// travel together where they can: BEGIN, and every statement whose result
// nobody reads (an sqlc ":exec"), wait and go with the next statement that
// returns something, or with COMMIT, in one round trip (a pgx batch); and a
// read the caller expects to make next may go ahead with the statement
// before it (Prefetch).
// Every table is read by an index where one serves (enable_seqscan off
// for the transaction, PipelineSettings), so that the statements run from
// the generic plans Postgres caches for each prepared statement, unplanned,
// without the risk CustomPlans avoids for the statements sent alone.
//
// It is for the limiter's line and release transactions, which hold a
// kind's row lock from their first statement to their commit: on a busy
// 2-CPU machine each round trip costs 1-2 ms of scheduling, so the lock
// is held for the round trips, not for the work. The statements still run
// one after another, each with a snapshot of its own, exactly as if sent
// one by one; an error of a deferred statement is returned by the call
// that sends it (naming the statement), and the transaction rolls back.
type Pipeline struct {
	conn  *pgxpool.Conn
	batch *pgx.Batch
	names []string // the names of the queued statements, for errors
	done  bool     // committed or rolled back
	trips int      // round trips sent

	// prefetch is a statement to send right after the next one that
	// returns rows (Prefetch); once sent, open holds the batch whose last
	// result is its rows, until a Query takes them or they are dropped.
	prefetch *prefetched
	open     pgx.BatchResults
}

// prefetched is a statement sent ahead of its Query (Prefetch).
type prefetched struct {
	name string
	sql  string
	args []any
	sent bool
}

// rollbackTimeout bounds a Pipeline's ROLLBACK.
const rollbackTimeout = 5 * time.Second

// BeginPipeline acquires a connection of pool and queues the BEGIN of its
// transaction (sent with its first statement).
func BeginPipeline(ctx context.Context, pool *pgxpool.Pool) (*Pipeline, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire a connection: %w", err)
	}
	p := &Pipeline{conn: conn, batch: &pgx.Batch{}}
	p.queue("begin", "BEGIN")
	p.queue("PipelineSettings", pipelineSettings)
	return p, nil
}

// PipelineFunc runs fn in a Pipeline's transaction on pool and commits, or
// rolls back when fn or the commit fails (or fn panics).
func PipelineFunc(ctx context.Context, pool *pgxpool.Pool, fn func(p *Pipeline) error) error {
	p, err := BeginPipeline(ctx, pool)
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
// nothing of its result but its error.
func deferrable(sql string) (string, bool) {
	const prefix = "-- name: "
	if !strings.HasPrefix(sql, prefix) {
		return "", false
	}
	line, _, _ := strings.Cut(sql[len(prefix):], "\n")
	name, annotation, _ := strings.Cut(strings.TrimSpace(line), " ")
	return name, strings.TrimSpace(annotation) == ":exec"
}

// Prefetch asks for sql (a statement that returns rows; name for errors)
// to be sent right after the next statement that returns rows, in the
// same round trip, when the caller expects to run it next: the Query that
// follows with the same sql and arguments, nothing queued in between,
// reads its rows without a round trip of its own. Any other statement
// drops them unread (they were read in the same transaction, so nothing
// but the server's work is lost). A second Prefetch replaces the first.
func (p *Pipeline) Prefetch(name, sql string, args ...any) {
	p.prefetch = &prefetched{name: name, sql: sql, args: args}
}

// Trips is how many round trips the pipeline has sent.
func (p *Pipeline) Trips() int { return p.trips }

// takePrefetched returns the rows prefetched for sql and args (nil: none
// match, and whatever was prefetched is dropped).
func (p *Pipeline) takePrefetched(sql string, args []any) (pgx.Rows, pgx.BatchResults, error) {
	if p.prefetch == nil || !p.prefetch.sent || p.open == nil {
		return nil, nil, p.dropPrefetched()
	}
	pf, br := p.prefetch, p.open
	if pf.sql != sql || len(p.names) > 0 || !reflect.DeepEqual(pf.args, args) {
		return nil, nil, p.dropPrefetched()
	}
	p.prefetch, p.open = nil, nil
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, nil, fmt.Errorf("%s (prefetched): %w", pf.name, err)
	}
	return rows, br, nil
}

// dropPrefetched drops rows prefetched and not asked for.
func (p *Pipeline) dropPrefetched() error {
	pf, br := p.prefetch, p.open
	if pf == nil || !pf.sent {
		return nil
	}
	p.prefetch, p.open = nil, nil
	if br == nil {
		return nil // the rows before them were not closed: nothing to read yet
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("%s (prefetched): %w", pf.name, err)
	}
	return nil
}

// send sends the queued statements and sql as one batch (followed by the
// statement prefetched, when withPrefetch), reads the results of the
// queued ones, and returns the batch positioned at sql's.
func (p *Pipeline) send(ctx context.Context, withPrefetch bool, name, sql string, args ...any) (pgx.BatchResults, error) {
	if p.done {
		return nil, errors.New("pipeline: transaction already ended")
	}
	if err := p.dropPrefetched(); err != nil {
		return nil, err
	}
	p.queue(name, sql, args...)
	if pf := p.prefetch; withPrefetch && pf != nil {
		p.batch.Queue(pf.sql, pf.args...)
		pf.sent = true
	} else {
		p.prefetch = nil
	}
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
	br, err := p.send(ctx, false, name, sql, args...)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// Query runs sql with the statements waiting, in one round trip (none:
// the rows of a statement prefetched, Prefetch).
func (p *Pipeline) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if p.done {
		return nil, errors.New("pipeline: transaction already ended")
	}
	rows, br, err := p.takePrefetched(sql, args)
	if err != nil {
		return nil, err
	}
	if rows != nil {
		return &pipelineRows{Rows: rows, br: br, p: p, last: true}, nil
	}
	name, _ := deferrable(sql)
	br, err = p.send(ctx, true, name, sql, args...)
	if err != nil {
		return nil, err
	}
	rows, err = br.Query()
	if err != nil {
		_ = br.Close()
		p.prefetch = nil
		return nil, err
	}
	out := &pipelineRows{Rows: rows, br: br, p: p, last: true}
	if p.prefetch != nil && p.prefetch.sent {
		// The batch goes on with the prefetched rows: closing these rows
		// leaves it open for them.
		out.last = false
	}
	return out, nil
}

// QueryRow runs sql with the statements waiting and returns its first row.
func (p *Pipeline) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := p.Query(ctx, sql, args...)
	return &pipelineRow{rows: rows, err: err}
}

// Commit sends the statements waiting and COMMIT in one round trip.
func (p *Pipeline) Commit(ctx context.Context) error {
	if p.done {
		return errors.New("pipeline: transaction already ended")
	}
	br, err := p.send(ctx, false, "commit", "COMMIT")
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
	if p.open != nil {
		_ = p.open.Close()
		p.open, p.prefetch = nil, nil
	}
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

// pipelineRows are a statement's rows; closing them ends their batch,
// unless rows prefetched follow them in it (last false): then the batch
// stays open for them (Pipeline.open).
type pipelineRows struct {
	pgx.Rows
	br   pgx.BatchResults
	p    *Pipeline
	last bool
	err  error
	end  bool
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
	if pf := r.p.prefetch; !r.last && pf != nil && pf.sent {
		if r.err == nil {
			r.p.open = r.br // the prefetched rows come next
			return
		}
		r.p.prefetch = nil
	}
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
