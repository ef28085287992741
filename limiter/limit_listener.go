package limiter

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sluice-dev/sluice/db"
)

// LimitChannel is the channel a change of a kind's limits notifies (a
// trigger on concurrency_limits, sluice_limits_notify; the payload is the
// kind): every worker LISTENs on it and re-reads its copy of the limits at
// once. LimitCacheTTL stays the fallback while the listener is not
// connected.
const LimitChannel = "sluice_limits"

// Reconnect backoff of the limits listener's connection.
const (
	limitListenRetryMin = 100 * time.Millisecond
	limitListenRetryMax = 5 * time.Second
)

// limitListener holds a dedicated connection that LISTENs on LimitChannel
// and expires the worker's copy of the limits whenever a kind's limits
// change (or the connection is made again: a change may have been missed
// meanwhile), so that the next job of any kind reads them afresh.
type limitListener struct {
	l *Limiter

	mu      sync.Mutex
	cancel  context.CancelFunc
	done    chan struct{}
	stopped bool
}

// start runs the listener until stop, once.
func (ll *limitListener) start() {
	ll.mu.Lock()
	defer ll.mu.Unlock()
	if ll.done != nil || ll.stopped {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	ll.cancel, ll.done = cancel, make(chan struct{})
	go func() {
		defer close(ll.done)
		db.Listener{
			Pool:     ll.l.pool,
			Channel:  LimitChannel,
			Listen:   func(ctx context.Context, q *db.Queries) error { return q.ListenLimits(ctx) },
			Logger:   ll.l.logger,
			Lost:     "concurrency limits: listener lost its connection; re-reading the limits every second until it reconnects",
			RetryMin: limitListenRetryMin,
			RetryMax: limitListenRetryMax,
			Connected: func() {
				ll.l.expireCache()
				ll.l.TestSignals.LimitsListening.Signal(struct{}{})
			},
			Notified: func(n *pgconn.Notification) {
				ll.l.expireCache()
				ll.l.TestSignals.LimitsChanged.Signal(n.Payload)
			},
		}.Run(ctx)
	}()
}

// stop ends the listener and waits for it; it never starts again.
func (ll *limitListener) stop() {
	ll.mu.Lock()
	ll.stopped = true
	cancel, done := ll.cancel, ll.done
	ll.mu.Unlock()
	if done == nil {
		return
	}
	cancel()
	<-done
}

// expireCache marks the worker's copy of the limits stale: the next job
// re-reads it (a read under way when the change came is stale too).
func (l *Limiter) expireCache() {
	l.limitsGen.Add(1)
	if c := l.cache.Load(); c != nil {
		l.cache.CompareAndSwap(c, &limitCache{states: c.states})
	}
}
