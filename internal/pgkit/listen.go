package pgkit

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/db"
)

// Listener holds a dedicated connection of a pool that LISTENs on a channel
// and hands every notification on, reconnecting with backoff when the
// connection is lost; its owner polls meanwhile, so a broken listener only
// delays what a notification would have hurried. The connection is taken
// out of the pool and closed afterwards: no session with a LISTEN goes
// back into the pool.
type Listener struct {
	// Pool gives the connection (required).
	Pool *pgxpool.Pool
	// Channel names the channel, for errors.
	Channel string
	// Listen subscribes the connection (an sqlc LISTEN statement).
	Listen func(ctx context.Context, q *db.Queries) error
	// Logger receives a warning each time the connection is lost (Lost,
	// with the error and the retry delay).
	Logger *slog.Logger
	Lost   string
	// RetryMin and RetryMax bound the reconnect backoff.
	RetryMin, RetryMax time.Duration
	// Connected runs on every (re)connect, once the LISTEN took effect
	// (a notification may have been missed meanwhile); Disconnected when
	// the connection is lost or ctx ends. Either may be nil.
	Connected, Disconnected func()
	// Notified runs for every notification.
	Notified func(n *pgconn.Notification)
}

// Run listens until ctx is done.
func (l Listener) Run(ctx context.Context) {
	retry := l.RetryMin
	for {
		started := time.Now()
		err := l.once(ctx)
		if l.Disconnected != nil {
			l.Disconnected()
		}
		if ctx.Err() != nil {
			return
		}
		if time.Since(started) > l.RetryMax {
			retry = l.RetryMin
		}
		l.Logger.Warn(l.Lost, "error", err, "retry_in", retry.String())
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
		retry = min(retry*2, l.RetryMax)
	}
}

// once runs one LISTEN connection until it fails or ctx is done.
func (l Listener) once(ctx context.Context) error {
	pooled, err := l.Pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire connection: %w", err)
	}
	conn := pooled.Hijack()
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	if err := l.Listen(ctx, db.New(conn)); err != nil {
		return fmt.Errorf("listen %s: %w", l.Channel, err)
	}
	if l.Connected != nil {
		l.Connected()
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("wait for notification: %w", err)
		}
		l.Notified(n)
	}
}
