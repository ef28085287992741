// Package ledger is everything of the limiter that runs under the locks:
// the one way into its tables. Every transaction that changes slots (a
// decision, a release and its grants, a lease, a parking, the reaper, the
// safety net, a change of limits) runs through Ledger.run, which owns the
// kinds' locks (an advisory lock per kind: exclusive, or shared under
// per-key limits alone, where each key's row is its lock), writes the
// counts the transaction changed, retries it after a deadlock, and runs
// what it left to do once it committed. A transaction is two round trips:
// its locks travel with the read it decides from (one JSON document, read
// in the snapshot taken once the locks are held), and its writes with its
// COMMIT.
//
// The ledger has no state of its own between transactions; the worker's
// memory is the local package's.
package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/pgkit"
)

// Ledger bounds.
const (
	// txTimeout bounds one ledger transaction.
	txTimeout = 30 * time.Second
	// deadlockTries is how many times a transaction Postgres aborted to
	// break a deadlock is run.
	deadlockTries = 3
	// relockTries is how many times a transaction whose locks did not fit
	// the limits it read is run again with the right ones.
	relockTries = 3
)

// Ledger runs the limiter's transactions on a pool, for one worker.
type Ledger struct {
	pool     *pgxpool.Pool
	worker   string
	logger   *slog.Logger
	inFlight time.Duration
}

// Config configures a Ledger.
type Config struct {
	// Pool is the database pool.
	Pool *pgxpool.Pool
	// WorkerID names the worker whose slots and waiting jobs the ledger
	// writes.
	WorkerID string
	// Logger receives the ledger's log lines.
	Logger *slog.Logger
	// FetchInFlight is how long another connection's fetch may be in
	// flight before LeaseState counts it as holding jobs fetched at its
	// start (DefaultFetchInFlight when zero).
	FetchInFlight time.Duration
}

// DefaultFetchInFlight is Config.FetchInFlight's default, the value the
// limiter derives from its tolerances (local.LineFetchTolerance less
// local.TakeFresh) and passes.
const DefaultFetchInFlight = 10 * time.Millisecond

// New returns a Ledger on cfg.
func New(cfg Config) *Ledger {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.FetchInFlight <= 0 {
		cfg.FetchInFlight = DefaultFetchInFlight
	}
	return &Ledger{pool: cfg.Pool, worker: cfg.WorkerID, logger: cfg.Logger, inFlight: cfg.FetchInFlight}
}

// WorkerID is the worker the ledger writes for.
func (l *Ledger) WorkerID() string { return l.worker }

// lock is a kind's lock in a ledger transaction: exclusive, or, under
// per-key limits alone, shared with the rows of keys (taken in key order
// after every kind's lock).
type lock struct {
	kind   string
	shared bool
	keys   []string
}

// Tx is a ledger transaction: its statements (on a pipeline, or, for a
// change of limits, a plain transaction), the counts it changed, and what
// it leaves to do once it committed.
type Tx struct {
	ctx    context.Context
	q      *db.Queries
	pgx    pgx.Tx // a plain transaction's (nil on a pipeline)
	l      *Ledger
	counts counts
	after  []func()
}

// Queries are the transaction's statements.
func (tx *Tx) Queries() *db.Queries { return tx.q }

// Context is the transaction's context.
func (tx *Tx) Context() context.Context { return tx.ctx }

// Pgx is a plain transaction's pgx.Tx (River's InsertTx takes it; nil on a
// pipeline).
func (tx *Tx) Pgx() pgx.Tx { return tx.pgx }

// After runs fn once the transaction committed.
func (tx *Tx) After(fn func()) { tx.after = append(tx.after, fn) }

// errRelock is what a transaction returns when the limits it read do not
// fit the locks it took (the caller's copy of them was stale): it is run
// again with locks made from limits.
type errRelock struct {
	limits map[string]Limits
}

func (e *errRelock) Error() string { return "ledger: the kinds' limits changed; locking again" }

// errStale is returned by a transaction that found, as it wrote, that
// what it read has changed under it in a way its locks do not prevent (a
// grant it took claimed meanwhile): run runs it again.
var errStale = errors.New("ledger: a grant read was claimed meanwhile; deciding again")

// run runs fn in one ledger transaction holding locks (in kind order, the
// keys' rows after), writes the counts fn changed, commits, and runs what
// fn left to do after. It runs fn again when Postgres aborted it to break a
// deadlock, or when fn found what it read changed under it (errStale).
func (l *Ledger) run(parent context.Context, locks []lock, fn func(tx *Tx) error) error {
	return l.runOn(parent, locks, false, fn)
}

// runOn is run on a pipeline, or (plain) on a plain pgx transaction.
func (l *Ledger) runOn(parent context.Context, locks []lock, plain bool, fn func(tx *Tx) error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), txTimeout)
	defer cancel()
	slices.SortFunc(locks, func(a, b lock) int {
		switch {
		case a.kind < b.kind:
			return -1
		case a.kind > b.kind:
			return 1
		}
		return 0
	})
	for try := 1; ; try++ {
		var tx *Tx
		body := func(t *Tx) error {
			tx = t
			if err := tx.q.LedgerSettings(ctx, !plain); err != nil {
				return err
			}
			if err := tx.lock(locks); err != nil {
				return err
			}
			if err := fn(tx); err != nil {
				return err
			}
			return tx.counts.save(ctx, tx.q)
		}
		var err error
		if plain {
			err = pgx.BeginFunc(ctx, l.pool, func(ptx pgx.Tx) error {
				return body(&Tx{ctx: ctx, q: db.New(pgkit.CustomPlans(ptx)), pgx: ptx, l: l})
			})
		} else {
			err = pgkit.Run(ctx, l.pool, func(p *pgkit.Pipeline) error { return body(&Tx{ctx: ctx, q: db.New(p), l: l}) })
		}
		var pgErr *pgconn.PgError
		if err != nil && try < deadlockTries && errors.As(err, &pgErr) && pgErr.Code == "40P01" {
			time.Sleep(time.Duration(try) * 5 * time.Millisecond)
			continue
		}
		if err != nil && try < deadlockTries && errors.Is(err, errStale) {
			continue
		}
		if err != nil {
			return err
		}
		for _, f := range tx.after {
			f()
		}
		return nil
	}
}

// lock queues the kinds' locks and the keys' rows (they travel with the
// transaction's first read).
func (tx *Tx) lock(locks []lock) error {
	if len(locks) == 0 {
		return nil
	}
	var kinds []string
	var shared []bool
	var keyKinds, keys []string
	for _, k := range locks {
		kinds, shared = append(kinds, k.kind), append(shared, k.shared)
		sorted := slices.Clone(k.keys)
		slices.Sort(sorted)
		for _, key := range slices.Compact(sorted) {
			keyKinds, keys = append(keyKinds, k.kind), append(keys, key)
			tx.counts.touch(k.kind, key)
		}
	}
	if err := tx.q.LedgerLockKinds(tx.ctx, db.LedgerLockKindsParams{Kinds: kinds, Shared: shared}); err != nil {
		return fmt.Errorf("lock kinds: %w", err)
	}
	if len(keys) > 0 {
		if err := tx.q.LedgerLockKeys(tx.ctx, db.LedgerLockKeysParams{Kinds: keyKinds, Keys: keys}); err != nil {
			return fmt.Errorf("lock keys: %w", err)
		}
	}
	return nil
}

// withRelock runs attempt with the limits guessed, and again (up to
// relockTries) with the limits read, when its locks did not fit them.
func withRelock(guess map[string]Limits, attempt func(guess map[string]Limits) error) error {
	for try := 1; ; try++ {
		err := attempt(guess)
		var relock *errRelock
		if err == nil || try == relockTries || !errors.As(err, &relock) {
			return err
		}
		next := make(map[string]Limits, len(guess)+len(relock.limits))
		for k, v := range guess {
			next[k] = v
		}
		for k, v := range relock.limits {
			next[k] = v
		}
		guess = next
	}
}

// locksFor is the locks of kinds as their limits (guessed) need them: a
// kind under per-key limits alone shared, with the rows of keys (kind →
// keys); any other exclusive.
func locksFor(kinds []string, guess map[string]Limits, keys map[string][]string) []lock {
	out := make([]lock, 0, len(kinds))
	for _, kind := range kinds {
		lim, ok := guess[kind]
		if ok && lim.Regime() == Keys {
			out = append(out, lock{kind: kind, shared: true, keys: keys[kind]})
			continue
		}
		out = append(out, lock{kind: kind})
	}
	return out
}

// checkLocks returns an errRelock when a kind's limits read (limits) do
// not fit the lock taken for it (locks): a kind locked shared that needs
// its exclusive lock, or whose partition is not the one its keys were
// computed with.
func checkLocks(locks []lock, guess map[string]Limits, limits map[string]Limits) error {
	var wrong map[string]Limits
	for _, k := range locks {
		lim := limits[k.kind]
		fits := !k.shared || (lim.Regime() == Keys && slices.Equal(lim.Fields, guess[k.kind].Fields))
		if !fits {
			if wrong == nil {
				wrong = map[string]Limits{}
			}
			wrong[k.kind] = lim
		}
	}
	if wrong != nil {
		return &errRelock{limits: wrong}
	}
	return nil
}
