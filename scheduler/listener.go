package scheduler

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice/db"
)

// Reconnect backoff of the LISTEN connection.
const (
	listenRetryMin = 500 * time.Millisecond
	listenRetryMax = 30 * time.Second
)

// listen holds a dedicated connection that LISTENs on NotifyChannel and
// wakes the dispatcher on every notification, until ctx is done. A lost
// connection is re-established with backoff; every (re)connect wakes the
// dispatcher too, for notifications missed while disconnected. Polling goes
// on meanwhile, so a broken listener only delays dispatch to the poll
// interval.
func (d *Dispatcher) listen(ctx context.Context) {
	retry := listenRetryMin
	for {
		started := time.Now()
		err := d.listenOnce(ctx)
		d.listening.Store(false)
		if ctx.Err() != nil {
			return
		}
		if time.Since(started) > listenRetryMax {
			retry = listenRetryMin
		}
		d.logger.Warn("schedule listener lost its connection; polling until it reconnects",
			"error", err, "retry_in", retry.String())
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
		retry = min(retry*2, listenRetryMax)
	}
}

// listenOnce runs one LISTEN connection until it fails or ctx is done. The
// connection is taken out of the pool and closed afterwards, so no session
// with a LISTEN goes back into the pool.
func (d *Dispatcher) listenOnce(ctx context.Context) error {
	pooled, err := d.cfg.Pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire connection: %w", err)
	}
	conn := pooled.Hijack()
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	if err := db.New(conn).ListenSchedules(ctx); err != nil {
		return fmt.Errorf("listen %s: %w", NotifyChannel, err)
	}
	d.listening.Store(true)
	d.TestSignals.Listening.Signal(struct{}{})
	d.logger.Debug("schedule listener connected", "channel", NotifyChannel)
	d.Wake()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("wait for notification: %w", err)
		}
		d.Wake()
	}
}
