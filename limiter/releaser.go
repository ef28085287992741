package limiter

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/sluice-dev/sluice/limiter/internal/ledger"
	"github.com/sluice-dev/sluice/limiter/internal/local"
)

// releaseRetries are the delays, one after the other, at which a worker
// whose release failed on a database error writes it again (the same
// release: its frees, moves and grant rounds are written once however
// often they run), with whatever came after it; after the last it leaves
// the kinds to concurrency_limit.resume, which frees the slots of jobs no
// longer running.
var releaseRetries = []time.Duration{
	100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second,
}

// unreleased are the requests of the releases that failed, written again
// before anything that came after them: a move of a slot handed over in
// memory written after the release of the job it went to would give that
// ended job the slot for ever. The releaser's own: the batcher runs one
// batch at a time.
type unreleased struct {
	batch []*releaseRequest
	tries int  // the failed writes of batch
	armed bool // a retry is due (a request with retry set, after a delay)
}

// releaseRequest is one thing for the releaser to write: a job that ended
// holding a slot of the line, a slot handed over in memory, or a grant
// round of kinds whose whole line it reads (rounds: a rate window freeing a
// start, a change of limits), or of the lines of keys of kinds (keyRounds,
// kind → keys: a recheck after a decision or a parking, jobs waiting long;
// ledger.Release.KeyRounds).
type releaseRequest struct {
	ended     *ledger.Held
	handed    *ledger.HandOver
	rounds    []string
	keyRounds map[string][]string
	retry     bool // a retry of the releases that failed (unreleased), nothing of its own
}

// releaseBatch writes batch in one ledger transaction (ledger.Release),
// after the releases that failed before it, and tells the jobs of this
// worker that its grant rounds gave a slot or a start. When it fails, it
// is written again, with what comes next, after a delay (retryRelease).
func (l *Limiter) releaseBatch(batch []*releaseRequest) {
	u := &l.unreleased
	retried := len(u.batch) > 0
	for _, req := range batch {
		if req.retry {
			u.armed = false
		}
	}
	batch = append(u.batch[:len(u.batch):len(u.batch)], batch...)
	u.batch = nil
	r := releaseOf(batch)
	var kinds []string
	for _, k := range append(append(slices.Collect(maps.Keys(r.KeyRounds)), r.Rounds...), heldKinds(r)...) {
		if !slices.Contains(kinds, k) {
			kinds = append(kinds, k)
		}
	}
	if len(kinds) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), decideTimeout)
	defer cancel()
	out, err := l.ledger.Release(ctx, r, l.limits.guess(ctx, kinds))
	if err != nil {
		l.retryRelease(batch, kinds, err)
		return
	}
	if retried {
		l.logger.Info("concurrency slots released after a failed try", "kinds", kinds)
	}
	u.tries = 0
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
			for kind, keys := range req.keyRounds {
				if r.KeyRounds == nil {
					r.KeyRounds = map[string][]string{}
				}
				for _, key := range keys {
					if !slices.Contains(r.KeyRounds[kind], key) {
						r.KeyRounds[kind] = append(r.KeyRounds[kind], key)
					}
				}
			}
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
	if len(gs) > 0 {
		// Most transactions grant nothing to this worker's jobs: the tags
		// are made only for those that do.
		tags := make(map[string]string, len(g.Limits))
		for kind, lim := range g.Limits {
			tags[kind] = lim.Tag()
		}
		l.grantJobs(gs, tags)
	}
	for kind, n := range g.Resumed {
		if n > 0 {
			l.metrics.Resumed.WithLabelValues(kind).Add(float64(n))
		}
	}
	for kind, d := range g.Wakes {
		l.wakes.after(kind, d)
	}
}

// retryRelease keeps batch, whose release failed with err, to be written
// before anything newer, and has the releaser try again after the next of
// releaseRetries (unless a retry is due already); after the last, it
// leaves the kinds to the safety net. The retries stop when the limiter
// is flushed.
func (l *Limiter) retryRelease(batch []*releaseRequest, kinds []string, err error) {
	u := &l.unreleased
	if u.tries >= len(releaseRetries) {
		l.logger.Warn("concurrency slots still not released; concurrency_limit.resume will free them", "kinds", kinds, "error", err)
		u.tries = 0
		return
	}
	l.logger.Warn("concurrency slots not released; trying again in the background", "kinds", kinds, "error", err)
	u.batch = batch
	if u.armed || l.isStopped() {
		return
	}
	delay := releaseRetries[u.tries]
	u.tries++
	u.armed = true
	go func() {
		select {
		case <-l.stopCh:
		case <-time.After(delay):
			l.releaser.submitAsync(&releaseRequest{retry: true})
		}
	}()
}

// cleanUp is the safety net's work on kind (ledger.CleanUp), its grants
// told to this worker's jobs; who names the caller in the log lines.
func (l *Limiter) cleanUp(ctx context.Context, kind, who string) (resumed int, remaining bool, err error) {
	resumed, remaining, out, err := l.ledger.CleanUp(ctx, kind, ReservedSlotTTL, StaleSlotGrace, LeaseTTL, who)
	if err != nil {
		return 0, false, err
	}
	l.granted(out)
	return resumed, remaining, nil
}
