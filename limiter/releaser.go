package limiter

import (
	"context"
	"slices"
	"time"

	"github.com/sluice-dev/sluice/limiter/internal/ledger"
	"github.com/sluice-dev/sluice/limiter/internal/local"
)

// releaseRetries are the delays, one after the other, at which a worker
// whose release failed on a database error writes it again (the same
// release: its frees, moves and grant rounds are written once however
// often they run); after the last it leaves the kinds to
// concurrency_limit.resume, which frees the slots of jobs no longer
// running.
var releaseRetries = []time.Duration{
	100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second,
}

// releaseRequest is one thing for the releaser to write: a job that ended
// holding a slot of the line, a slot handed over in memory, or a grant
// round of kinds whose whole line it reads (a recheck after a parking, a
// rate window freeing a start, slots given back).
type releaseRequest struct {
	ended  *ledger.Held
	handed *ledger.HandOver
	rounds []string
}

// releaseBatch writes batch in one ledger transaction (ledger.Release),
// and tells the jobs of this worker that its grant rounds gave a slot or a
// start. When it fails, it is written again in the background
// (retryRelease).
func (l *Limiter) releaseBatch(batch []*releaseRequest) {
	r := releaseOf(batch)
	var kinds []string
	for _, k := range append(append([]string{}, r.Rounds...), heldKinds(r)...) {
		if !slices.Contains(kinds, k) {
			kinds = append(kinds, k)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), decideTimeout)
	defer cancel()
	out, err := l.ledger.Release(ctx, r, l.limits.guess(ctx, kinds))
	if err != nil {
		l.logger.Warn("concurrency slots not released; trying again in the background", "kinds", kinds, "error", err)
		l.retryRelease(r, kinds)
		return
	}
	l.granted(out)
}

// releaseOf is the ledger's Release of batch: a slot handed over and
// handed on again within the batch is written as one move, from its row's
// job to its last holder; a job that ended on a slot handed to it in the
// batch frees that slot's row.
func releaseOf(batch []*releaseRequest) ledger.Release {
	var r ledger.Release
	moves := map[int64]ledger.HandOver{} // the row's job → its move
	rowOf := map[int64]int64{}           // a job holding a slot handed in the batch → the row's job
	for _, req := range batch {
		switch {
		case req.handed != nil:
			from := req.handed.From
			if row, ok := rowOf[from.ID]; ok {
				// Handed on by a job it was handed to in this batch: the row
				// moves once, and that job leaves the waiters.
				r.Forgotten = append(r.Forgotten, from)
				from = moves[row].From
				delete(rowOf, req.handed.From.ID)
			}
			moves[from.ID] = ledger.HandOver{From: from, To: req.handed.To}
			rowOf[req.handed.To.ID] = from.ID
		case req.ended != nil:
			h := *req.ended
			if row, ok := rowOf[h.ID]; ok {
				// It ended on a slot handed to it in this batch: the row goes,
				// and it leaves the waiters.
				r.Forgotten = append(r.Forgotten, h)
				h = moves[row].From
				delete(moves, row)
				delete(rowOf, req.ended.ID)
			}
			r.Ended = append(r.Ended, h)
		default:
			r.Rounds = append(r.Rounds, req.rounds...)
		}
	}
	rows := make([]int64, 0, len(moves))
	for row := range moves {
		rows = append(rows, row)
	}
	slices.Sort(rows)
	for _, row := range rows {
		r.Handed = append(r.Handed, moves[row])
	}
	slices.Sort(r.Rounds)
	r.Rounds = slices.Compact(r.Rounds)
	return r
}

// heldKinds are the kinds of the slots r frees or moves.
func heldKinds(r ledger.Release) []string {
	var out []string
	for _, h := range r.Ended {
		out = append(out, h.Kind)
	}
	for _, h := range r.Forgotten {
		out = append(out, h.Kind)
	}
	for _, h := range r.Handed {
		out = append(out, h.From.Kind)
	}
	return out
}

// granted tells this worker's jobs what a ledger transaction's grant
// rounds gave them, counts the jobs it resumed, and sets the timers of the
// rate windows it found full.
func (l *Limiter) granted(g *ledger.Granted) {
	if g == nil {
		return
	}
	gs := make([]jobGrant, 0, len(g.Local))
	for _, id := range g.LocalOrder {
		slot := local.NoSlot
		if g.Local[id] == ledger.Slot {
			slot = local.LineSlot
		}
		gs = append(gs, jobGrant{id: id, slot: slot})
	}
	l.grantJobs(gs)
	for kind, n := range g.Resumed {
		if n > 0 {
			l.metrics.Resumed.WithLabelValues(kind).Add(float64(n))
		}
	}
	for kind, d := range g.Wakes {
		l.wakes.after(kind, d)
	}
}

// retryRelease writes r again in the background, at each of
// releaseRetries until it commits; it stops when the limiter is flushed.
func (l *Limiter) retryRelease(r ledger.Release, kinds []string) {
	if l.isStopped() {
		return
	}
	go func() {
		for _, delay := range releaseRetries {
			select {
			case <-l.stopCh:
				return
			case <-time.After(delay):
			}
			ctx, cancel := context.WithTimeout(context.Background(), decideTimeout)
			out, err := l.ledger.Release(ctx, r, l.limits.guess(ctx, kinds))
			cancel()
			if err == nil {
				l.granted(out)
				l.logger.Info("concurrency slots released after a failed try", "kinds", kinds)
				return
			}
		}
		l.logger.Warn("concurrency slots still not released; concurrency_limit.resume will free them", "kinds", kinds)
	}()
}

// cleanUp is the safety net's work on kind (ledger.CleanUp), its grants
// told to this worker's jobs; who names the caller in the log lines.
func (l *Limiter) cleanUp(ctx context.Context, kind, who string) (resumed int, remaining bool, err error) {
	resumed, remaining, out, err := l.ledger.CleanUp(ctx, kind, ReservedSlotTTL, LeaseTTL, who)
	if err != nil {
		return 0, false, err
	}
	l.granted(out)
	return resumed, remaining, nil
}
