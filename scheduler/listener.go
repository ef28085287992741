package scheduler

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/pgkit"
)

// Reconnect backoff of the LISTEN connection.
const (
	listenRetryMin = 500 * time.Millisecond
	listenRetryMax = 30 * time.Second
)

// listen holds a dedicated connection that LISTENs on NotifyChannel and
// wakes the dispatcher on every notification, until ctx is done
// (pgkit.Listener). A lost connection is re-established with backoff; every
// (re)connect wakes the dispatcher too, for notifications missed while
// disconnected. Polling goes on meanwhile, so a broken listener only
// delays dispatch to the poll interval.
func (d *Dispatcher) listen(ctx context.Context) {
	pgkit.Listener{
		Pool:     d.cfg.Pool,
		Channel:  NotifyChannel,
		Listen:   func(ctx context.Context, q *db.Queries) error { return q.ListenSchedules(ctx) },
		Logger:   d.logger,
		Lost:     "schedule listener lost its connection; polling until it reconnects",
		RetryMin: listenRetryMin,
		RetryMax: listenRetryMax,
		Connected: func() {
			d.listening.Store(true)
			d.TestSignals.Listening.Signal(struct{}{})
			d.logger.Debug("schedule listener connected", "channel", NotifyChannel)
			d.Wake()
		},
		Disconnected: func() { d.listening.Store(false) },
		Notified:     func(*pgconn.Notification) { d.Wake() },
	}.Run(ctx)
}
