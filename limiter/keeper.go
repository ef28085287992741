package limiter

import (
	"context"
	"slices"
	"time"

	"github.com/sluice-dev/sluice/limiter/internal/ledger"
	"github.com/sluice-dev/sluice/limiter/internal/local"
)

// Lease keeper defaults.
const (
	// LeasePoll is how often the keeper looks at a kind whose jobs wait in
	// this worker for a leased slot (it reads the kind's state and leases
	// the slots they lack), or whose leased slots other workers hold or
	// want too (their waiting jobs go first).
	LeasePoll = 5 * time.Millisecond
	// LeaseLinePoll is how often it reads the state of a kind on the leased
	// path whose jobs wait in the line here: a slot that frees is handed to
	// the next of them in memory only on a fresh view (local.ViewFresh).
	LeaseLinePoll = 20 * time.Millisecond
	// LeaseIdlePoll is how often it reads the state of a kind whose slots
	// it holds with no job waiting: a job takes a leased slot at once only
	// on a view younger than local.TakeFresh.
	LeaseIdlePoll = 25 * time.Millisecond
	// LeaseLinger is how long a worker keeps leased slots that none of its
	// jobs uses before it gives them back.
	LeaseLinger = 50 * time.Millisecond
	// LeaseRenew is how often a worker marks the leases it holds alive, and
	// checks that the database still counts them.
	LeaseRenew = time.Second
	// LeaseTTL is how long a lease may go unrenewed before
	// concurrency_limit.resume frees it, when its holder is not a live
	// worker (a live worker's leases are the reaper's, once it is dead).
	LeaseTTL = 15 * time.Second
	// LeaseWantedWindow is how long a worker that asked for more slots
	// than it got counts as wanting: the other holders keep to a fair
	// share.
	LeaseWantedWindow = 50 * time.Millisecond
	// LeasePublish is how often, at most, the keeper writes the jobs
	// waiting for a kind's leased slots to its lease row (at once when none
	// waits any more).
	LeasePublish = 20 * time.Millisecond
)

// KeeperConfig configures a worker's lease keeper; a zero field takes its
// default.
type KeeperConfig struct {
	Poll, LinePoll, IdlePoll, Linger, Renew, WantedWindow, Publish time.Duration
}

func (c KeeperConfig) withDefaults() KeeperConfig {
	for _, f := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&c.Poll, LeasePoll}, {&c.LinePoll, LeaseLinePoll}, {&c.IdlePoll, LeaseIdlePoll}, {&c.Linger, LeaseLinger},
		{&c.Renew, LeaseRenew}, {&c.WantedWindow, LeaseWantedWindow}, {&c.Publish, LeasePublish}} {
		if *f.v <= 0 {
			*f.v = f.def
		}
	}
	return c
}

// keeper keeps this worker's side of the leased kinds (a per-kind limit
// alone): for every kind whose slots it leases or whose jobs wait here, it
// gives back the slots given up or idle for a linger, publishes the jobs
// waiting for a leased slot, reads the kind's state into its queue's view,
// leases what the waiting jobs lack, and renews the lease. One goroutine
// serves every kind, woken when a kind needs it.
type keeper struct {
	l    *Limiter
	cfg  KeeperConfig
	wake chan struct{} // buffered 1

	// kinds is the keeper's memory of each kind it serves (its goroutine's
	// own).
	kinds map[string]*keptKind
}

// keptKind is what the keeper remembers of a kind.
type keptKind struct {
	renewed, looked, published time.Time
	needRenew                  bool
	publishedIDs               []int64
	warned                     time.Time
}

func newKeeper(l *Limiter, cfg KeeperConfig) *keeper {
	return &keeper{l: l, cfg: cfg.withDefaults(), wake: make(chan struct{}, 1), kinds: map[string]*keptKind{}}
}

// wakeUp has the keeper look at its kinds now.
func (k *keeper) wakeUp() {
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

// run serves the kinds until ctx ends, then gives back every leased slot
// not in use (the worker's jobs have ended).
func (k *keeper) run(ctx context.Context) {
	timer := time.NewTimer(k.cfg.IdlePoll)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			k.giveAllBack()
			return
		case <-timer.C:
		case <-k.wake:
		}
		next := k.runOnce(ctx)
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(next)
	}
}

// runOnce serves every kind once and returns how soon it is due again.
func (k *keeper) runOnce(ctx context.Context) time.Duration {
	next := k.cfg.IdlePoll
	k.l.queues.each(func(q *local.Queue) {
		leased, _, toReturn := q.LeaseState()
		queued, lined := q.Waiting()
		kept := k.kinds[q.Kind()]
		if leased == 0 && toReturn == 0 && queued == 0 && (kept == nil || len(kept.publishedIDs) == 0) && !q.HasLeasedMarks() {
			if lined == 0 || !k.leasedRegime(ctx, q.Kind()) {
				delete(k.kinds, q.Kind())
				return
			}
		}
		if kept == nil {
			kept = &keptKind{}
			k.kinds[q.Kind()] = kept
		}
		k.serve(ctx, q, kept)
		switch queued, lined = q.Waiting(); {
		case queued > 0 || q.Shared():
			next = min(next, k.cfg.Poll)
		case lined > 0:
			next = min(next, k.cfg.LinePoll)
		}
	})
	return next
}

// leasedRegime reports whether kind is on the leased path as the limits'
// copy has it (per-kind limit alone).
func (k *keeper) leasedRegime(ctx context.Context, kind string) bool {
	lim, err := k.l.limits.of(ctx, kind)
	return err == nil && lim.Regime() == ledger.Leased
}

// serve does one round of a kind's keeping.
func (k *keeper) serve(ctx context.Context, q *local.Queue, kept *keptKind) {
	kind := q.Kind()
	ctx, cancel := context.WithTimeout(ctx, decideTimeout)
	defer cancel()
	warn := func(msg string, err error) {
		if time.Since(kept.warned) >= k.cfg.Renew {
			k.l.logger.Warn(msg, "kind", kind, "error", err)
			kept.warned = time.Now()
		}
	}
	if kept.needRenew || time.Since(kept.renewed) >= k.cfg.Renew {
		if err := k.renew(ctx, q, kept); err != nil {
			warn("concurrency lease: not renewed", err)
			return
		}
	}
	if n := q.Returning(time.Now(), k.cfg.Linger, false); n > 0 {
		g, err := k.l.ledger.ReturnLease(ctx, kind, int32(n))
		if err != nil {
			q.Unreturned(n) // again after a renewal says what went back
			kept.needRenew = true
			warn("concurrency lease: slots not given back yet", err)
			return
		}
		k.l.granted(g)
	}
	k.publish(ctx, q, kept)
	queued, lined := q.Waiting()
	poll := k.cfg.IdlePoll
	switch {
	case queued > 0:
		poll = 0
	case q.Shared():
		poll = k.cfg.Poll
	case lined > 0:
		poll = k.cfg.LinePoll
	}
	if time.Since(kept.looked) < poll {
		return
	}
	if err := k.look(ctx, q); err != nil {
		warn("concurrency lease: kind state not read", err)
		return
	}
	kept.looked = time.Now()
	if want := q.Want(); want > 0 {
		granted, _, offPath, err := k.l.ledger.Lease(ctx, kind, int32(want))
		if err != nil {
			kept.needRenew = true
			warn("concurrency lease: slots not leased", err)
			return
		}
		q.Leased(int(granted))
		if offPath {
			q.Close()
		}
	}
}

// renew marks the worker's lease of the kind alive and makes its count of
// leased slots agree with the database's (a slot lost is not used any
// more; one the database counts and the worker does not hold goes back).
func (k *keeper) renew(ctx context.Context, q *local.Queue, kept *keptKind) error {
	held, err := k.l.ledger.RenewLease(ctx, q.Kind())
	if err != nil {
		kept.needRenew = true
		return err
	}
	k.reconcile(q, held)
	kept.renewed, kept.needRenew = time.Now(), false
	k.l.TestSignals.Renewed.Signal(q.Kind())
	return nil
}

// reconcile makes the worker's count of the kind's leased slots agree with
// held, the database's (a slot lost is not used any more; one the database
// counts and the worker does not hold goes back).
func (k *keeper) reconcile(q *local.Queue, held int32) {
	switch diff := q.Reconcile(int(held)); {
	case diff > 0:
		k.l.logger.Warn("concurrency lease: slots lost (the lease expired or the limit was removed); not used any more",
			"kind", q.Kind(), "slots", diff)
	case diff < 0:
		k.l.logger.Warn("concurrency lease: the database counts slots this worker does not hold; giving them back",
			"kind", q.Kind(), "slots", -diff)
	}
}

// look reads the kind's state into its queue's view.
func (k *keeper) look(ctx context.Context, q *local.Queue) error {
	// Both before the read: a change heard during it makes the view stale,
	// and its age counts from the read's start (a read that waited for a
	// connection shows the kind as it was when its statement began, not as
	// it is when it returns).
	heard, at := k.l.limits.gen.Load(), time.Now()
	st, err := k.l.ledger.LeaseState(ctx, q.Kind(), k.cfg.WantedWindow)
	if err != nil {
		return err
	}
	if !st.Present {
		q.Lost() // the limit went, and its leases with it
		return nil
	}
	// The keeper alone leases and gives back the worker's slots, one
	// statement after the other: what the database counts for it now is
	// what it holds (a lease freed by its expiry is seen at once).
	k.reconcile(q, st.Own)
	k.l.trace("lease view", "kind", q.Kind(), "limit", st.Max, "admitted", st.Admitted, "own", st.Own, "off_path", st.OffPath,
		"others", st.Others, "oldest_other", st.OldestOther, "oldest_other_line", st.OldestOtherLine, "oldest_resumed", st.OldestResumed)
	q.SetView(viewOf(st, heard, at))
	return nil
}

// viewOf is the view of a kind that st gives a worker whose read of it
// began at at, when it had heard heard changes of limits.
func viewOf(st ledger.LeaseState, heard uint64, at time.Time) local.View {
	return local.View{At: at, Limit: st.Max, Admitted: st.Admitted, OffPath: st.OffPath, Keyed: st.Keyed,
		Others: st.Others, OldestOther: st.OldestOther, OldestParked: st.OldestParked, OldestReserved: st.OldestReserved,
		OldestResumed: st.OldestResumed, OldestOtherLine: st.OldestOtherLine, Heard: heard}
}

// publish writes the jobs waiting in this worker for a leased slot, or
// for their decision, to the worker's lease row when they changed: SQL
// tells them from the jobs that work, and the other workers let them go
// first.
func (k *keeper) publish(ctx context.Context, q *local.Queue, kept *keptKind) {
	queued := q.Unplaced()
	ids := make([]int64, len(queued))
	for i, j := range queued {
		ids[i] = j.ID
	}
	slices.Sort(ids)
	// At once when a job older than those published waits (the other
	// workers let it go first), or none waits any more; else at most every
	// Publish.
	// Jobs whose fetch marked them waiting (leased) are published now: the
	// marks go with the publication.
	older := len(ids) > 0 && (len(kept.publishedIDs) == 0 || ids[0] < kept.publishedIDs[0])
	unmark := q.TakeLeasedMarks()
	if len(unmark) == 0 && (slices.Equal(ids, kept.publishedIDs) || (len(ids) > 0 && !older && time.Since(kept.published) < k.cfg.Publish)) {
		return
	}
	if k.l.ledger.PublishWaiting(ctx, q.Kind(), ids, unmark) == nil {
		k.l.trace("published waiting", "kind", q.Kind(), "jobs", ids, "unmarked", unmark)
		kept.publishedIDs, kept.published = ids, time.Now()
		return
	}
	q.NoteLeasedMarks(unmark) // again at the next publication
}

// giveAllBack gives back every leased slot not in use, of every kind
// (three tries; what still fails expires after LeaseTTL, or goes with the
// worker's reap).
func (k *keeper) giveAllBack() {
	k.l.queues.each(func(q *local.Queue) {
		n := q.Returning(time.Now(), k.cfg.Linger, true)
		for try := 1; n > 0 && try <= 3; try++ {
			ctx, cancel := context.WithTimeout(context.Background(), decideTimeout)
			g, err := k.l.ledger.ReturnLease(ctx, q.Kind(), int32(n))
			cancel()
			if err == nil {
				k.l.granted(g)
				break
			}
			k.l.logger.Warn("concurrency lease: slots not given back yet", "kind", q.Kind(), "slots", n, "error", err)
			time.Sleep(time.Duration(try) * 100 * time.Millisecond)
		}
		if kept := k.kinds[q.Kind()]; kept != nil && len(kept.publishedIDs) > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), decideTimeout)
			_ = k.l.ledger.PublishWaiting(ctx, q.Kind(), nil, q.TakeLeasedMarks())
			cancel()
		}
	})
}
