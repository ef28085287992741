package pgkit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/db"
)

// releaseTimeout bounds the unlock of a session lock; past it the connection
// is closed instead, which releases the lock just as surely.
const releaseTimeout = 5 * time.Second

// SessionLock is a session-level advisory lock, keyed by
// hashtextextended(name, 0), held on a connection taken out of the pool for
// as long as the lock is held. Because the lock belongs to the session, a
// crash of the holder (process or connection) releases it.
type SessionLock struct {
	conn *pgxpool.Conn
	name string
}

// TryLock takes the session lock of name without waiting. It returns
// (nil, nil) when another session holds it.
func TryLock(ctx context.Context, pool *pgxpool.Pool, name string) (*SessionLock, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire connection for lock %q: %w", name, err)
	}
	acquired, err := db.New(conn).TryAdvisoryLock(ctx, name)
	if err != nil {
		discard(conn)
		return nil, fmt.Errorf("try advisory lock %q: %w", name, err)
	}
	if !acquired {
		conn.Release()
		return nil, nil
	}
	return &SessionLock{conn: conn, name: name}, nil
}

// Lock takes the session lock of name, waiting until it is free or ctx ends.
func Lock(ctx context.Context, pool *pgxpool.Pool, name string) (*SessionLock, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire connection for lock %q: %w", name, err)
	}
	if err := db.New(conn).AdvisoryLock(ctx, name); err != nil {
		// The wait may have been interrupted after the server granted the
		// lock; closing the connection makes sure it is not left held.
		discard(conn)
		return nil, fmt.Errorf("advisory lock %q: %w", name, err)
	}
	return &SessionLock{conn: conn, name: name}, nil
}

// Ping checks that the lock's connection (and so the lock) is alive. It must
// not run concurrently with Release.
func (l *SessionLock) Ping(ctx context.Context) error {
	if l == nil || l.conn == nil {
		return errors.New("lock released")
	}
	return l.conn.Ping(ctx)
}

// Name is the name the lock was taken for.
func (l *SessionLock) Name() string { return l.name }

// Release unlocks and returns the connection to the pool. If the unlock cannot
// be confirmed (cancelled context, broken connection), the connection is
// closed, which releases the lock on the server. Release is safe to call more
// than once.
func (l *SessionLock) Release(ctx context.Context) error {
	if l == nil || l.conn == nil {
		return nil
	}
	conn := l.conn
	l.conn = nil

	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	released, err := db.New(conn).AdvisoryUnlock(ctx, l.name)
	if err != nil || !released {
		discard(conn)
		if err == nil {
			err = errors.New("lock was not held by this session")
		}
		return fmt.Errorf("release advisory lock %q (connection closed instead): %w", l.name, err)
	}
	conn.Release()
	return nil
}

// discard closes a pooled connection instead of returning it to the pool, so
// that no session state (such as an advisory lock) survives.
func discard(conn *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	_ = conn.Hijack().Close(ctx)
}
