package limiter

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/limiter/internal/ledger"
	"github.com/sluice-dev/sluice/limiter/internal/local"
)

// GrantChannel is the channel a grant round notifies when it gives a slot
// or a start to a job waiting in another worker; the payload is a JSON
// note naming the worker and its jobs.
const GrantChannel = ledger.GrantChannel

// Listener reconnect backoff.
const (
	listenRetryMin = 100 * time.Millisecond
	listenRetryMax = 5 * time.Second
)

// recheckRoundAfter is how long after a change's ledger.RecheckHold a
// worker that heard the change runs the kind's grant round again.
const recheckRoundAfter = 20 * time.Millisecond

// listen holds the worker's one listening connection, on LimitChannel,
// GrantChannel and ReservationChannel, until ctx ends, reconnecting with
// backoff: a change of limits expires the worker's copy of them at once
// and runs a grant round of the kind (and again once the jobs it left to be
// decided again no longer hold their lines), a grant to a job waiting here wakes
// it, and a reservation whose job went is freed (goneReservations). While it is not connected, the copy is re-read
// every LimitCacheTTL and the grants are looked for every GrantPollLost.
func (l *Limiter) listen(ctx context.Context) {
	pgkit.Listener{
		Pool:    l.pool,
		Channel: LimitChannel + ", " + GrantChannel + ", " + ReservationChannel,
		Listen: func(ctx context.Context, q *db.Queries) error {
			if err := q.ListenLimits(ctx); err != nil {
				return err
			}
			if err := q.ListenReservations(ctx); err != nil {
				return err
			}
			return q.ListenGrants(ctx)
		},
		Logger:   l.logger,
		Lost:     "concurrency limits: listener lost its connection; polling until it reconnects",
		RetryMin: listenRetryMin,
		RetryMax: listenRetryMax,
		Connected: func() {
			l.limits.connected()
			l.staleViews()
			l.grants.connected()
			l.TestSignals.Listening.Signal(struct{}{})
		},
		Disconnected: func() {
			l.limits.disconnected()
			l.grants.disconnected()
		},
		Notified: func(n *pgconn.Notification) {
			switch n.Channel {
			case LimitChannel:
				l.limits.expire(n.Payload)
				l.staleViews()
				if n.Payload != "" && !l.isStopped() {
					// A change made by any SQL (a migration, psql) gives its room
					// to the line at once, as the CLI's does in its own
					// transaction.
					l.releaser.submitAsync(&releaseRequest{rounds: []string{n.Payload}})
					// The running jobs it left lacking what the new limits ask
					// held their lines in that round (ledger.RecheckHold); one
					// that began is never decided again, and no release may
					// follow (a job under a rate alone holds no slot): a round
					// after the hold gives the room they held to the line.
					kind := n.Payload
					time.AfterFunc(ledger.RecheckHold+recheckRoundAfter, func() {
						if !l.isStopped() {
							l.releaser.submitAsync(&releaseRequest{rounds: []string{kind}})
						}
					})
				}
				l.TestSignals.LimitsChanged.Signal(n.Payload)
			case GrantChannel:
				l.grants.heard(n.Payload)
			case ReservationChannel:
				l.went.heard(ctx, n.Payload)
			}
		},
	}.Run(ctx)
}

// staleViews tells every queue that the worker heard a change of limits
// (its copy's count of them): the lease keeper's views read before it are
// stale (local.Queue.Heard), so no slot is handed over by them.
func (l *Limiter) staleViews() {
	gen := l.limits.gen.Load()
	l.queues.each(func(q *local.Queue) { q.Heard(gen) })
}
