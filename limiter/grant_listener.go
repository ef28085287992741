package limiter

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/db"
)

// GrantChannel is the channel a grant round notifies (NotifyGrants) when it
// gives a slot or a start to a job waiting in another worker, with that
// worker's id as the payload ("*": a job resumed ahead, which any worker
// may have taken), and on which a worker's line poller LISTENs while jobs
// wait in it.
const GrantChannel = "sluice_grants"

// anyWorker is NotifyGrants' payload for every worker.
const anyWorker = "*"

// Reconnect backoff of the grant listener's connection.
const (
	grantListenRetryMin = 100 * time.Millisecond
	grantListenRetryMax = 5 * time.Second
)

// grantListener holds, while the line poller runs, a dedicated connection
// that LISTENs on GrantChannel, and wakes the poller (wake) when a
// notification names this worker or every worker. Until it is connected,
// and whenever it loses its connection, the poller looks for grants every
// LinePoll itself (HasGrants), as it did before notifications.
type grantListener struct {
	l         *Limiter
	wake      chan struct{} // buffered 1: a claim is due
	listening atomic.Bool
}

// newGrantListener returns a listener for l, not started.
func newGrantListener(l *Limiter) *grantListener {
	return &grantListener{l: l, wake: make(chan struct{}, 1)}
}

// notify asks the poller for a claim (coalesced with one already asked).
func (g *grantListener) notify() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// run listens until ctx is done, reconnecting with backoff.
func (g *grantListener) run(ctx context.Context) {
	retry := grantListenRetryMin
	for {
		started := time.Now()
		err := g.listenOnce(ctx)
		g.listening.Store(false)
		if ctx.Err() != nil {
			return
		}
		if time.Since(started) > grantListenRetryMax {
			retry = grantListenRetryMin
		}
		g.l.logger.Warn("concurrency line: grant listener lost its connection; polling until it reconnects",
			"error", err, "retry_in", retry.String())
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
		retry = min(retry*2, grantListenRetryMax)
	}
}

// listenOnce runs one LISTEN connection until it fails or ctx is done. The
// connection is taken out of the pool and closed afterwards, so no session
// with a LISTEN goes back into the pool.
func (g *grantListener) listenOnce(ctx context.Context) error {
	pooled, err := g.l.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire connection: %w", err)
	}
	conn := pooled.Hijack()
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	if err := db.New(conn).ListenGrants(ctx); err != nil {
		return fmt.Errorf("listen %s: %w", GrantChannel, err)
	}
	g.listening.Store(true)
	g.l.TestSignals.GrantListening.Signal(struct{}{})
	// Grants given before the LISTEN took effect: claim them now.
	g.notify()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("wait for notification: %w", err)
		}
		if n.Payload == g.l.workerID || n.Payload == anyWorker {
			g.notify()
		}
	}
}
