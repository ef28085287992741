package limiter

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/riverqueue/river/rivertype"

	"github.com/sluice-dev/sluice/limiter/internal/ledger"
	"github.com/sluice-dev/sluice/limiter/internal/local"
)

// Work runs a job within its kind's limits: decided at its fetch (or here,
// when its fetch did not), it waits for its slot in this worker until its
// park-after time (a job resumed ahead of a free slot as long as it
// takes), runs, and gives its slot to the next job when it ends. A job
// that parks returns nil without running: River's completion of it is what
// moves it to pending (trigger sluice_park_in_place).
func (l *Limiter) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	if job.Kind == ResumeKind || l.ignoreLimits {
		return doInner(ctx) // never limited itself; or limits ignored
	}
	if taken, gone, err := l.strays.waitTaken(job.ID); taken && err == nil && gone != nil {
		return l.gone(job, gone)
	}
	q := l.queues.get(job.Kind)
	var j *local.Job
	if q != nil {
		j = q.Get(job.ID)
	}
	if j == nil {
		// Not decided at its fetch: the driver was not watching, or its
		// kind had no limit then (it and the older jobs of its kind that
		// went to River undecided are decided together: strays).
		gone, err := l.admitStray(ctx, job)
		if err != nil {
			return fmt.Errorf("concurrency limit of %s: %w", job.Kind, err)
		}
		if gone != nil {
			return l.gone(job, gone)
		}
		if q = l.queues.get(job.Kind); q != nil {
			j = q.Get(job.ID)
		}
		if j == nil {
			return doInner(ctx) // no limit
		}
	}
	return l.follow(ctx, q, j, job, doInner)
}

// gone is what job's middleware returns when its decision took it out of
// its queue: nil when it parked or stepped back (River's completion parks
// it, or makes it available again), ErrNoSlot when it may not start.
func (l *Limiter) gone(job *rivertype.JobRow, d *ledger.Decision) error {
	switch d.Action {
	case ledger.Parked, ledger.StepBack:
		return nil
	}
	return fmt.Errorf("concurrency limit of %s (%s): %w", job.Kind, d.Reason, ErrNoSlot)
}

// admitStray decides job, not decided at its fetch, in the middleware
// (dispatched), with the older strays of its kind, or waits for the
// decision of a batch that took it; it returns the decision that took it
// out of its queue (it parked, stepped back, or may not start), if any.
func (l *Limiter) admitStray(ctx context.Context, job *rivertype.JobRow) (*ledger.Decision, error) {
	lim, err := l.limits.of(ctx, job.Kind)
	unlimited := err == nil && lim.Regime() == ledger.Unlimited && !everParked(job)
	st, batch := l.strays.claim(job, !unlimited)
	switch {
	case st != nil:
		<-st.decided
		if st.err == nil {
			return st.gone, nil
		}
		// The batch's decision failed: it is decided alone.
	case unlimited:
		return nil, nil // no limit: it runs
	}
	if batch == nil {
		batch = []*rivertype.JobRow{job}
	}
	gone, err := l.admit(ctx, batch, true)
	l.strays.done(batch, gone, err)
	if d, ok := gone[job.ID]; ok {
		return &d, err
	}
	return nil, err
}

// follow takes job (j in q) from its decision to its end: it waits while
// it is Queued or Lined, is decided again while it is Deciding, and runs
// once it is Working.
func (l *Limiter) follow(ctx context.Context, q *local.Queue, j *local.Job, job *rivertype.JobRow,
	doInner func(context.Context) error) error {
	entered := time.Now()
	deadline := entered.Add(l.parkAfter)
	timedOut, cancelled, recheck := false, false, false
	for {
		switch j.State() {
		case local.Working:
			if l.limitCameAfter(ctx, q, j) {
				l.trace("recheck", "job_id", j.ID)
				l.TestSignals.Rechecked.Signal(j.ID)
				recheck = true
				continue // Deciding again
			}
			if j.Granted() && !l.startedAfterGrant(ctx, q, j) && q.Undecide(j.ID) {
				l.trace("grant gone", "job_id", j.ID)
				continue // Deciding again: its start went before it began
			}
			if !q.Begin(j.ID) {
				l.trace("held at begin", "job_id", j.ID)
				continue // Held again behind an older job of its key deciding here
			}
			if !j.Granted() && j.WasHeld() {
				l.restampStart(ctx, q, j)
			}
			l.trace("begins", "job_id", j.ID, "slot", int(j.Slot()))
			return l.run(ctx, q, j, job, entered, doInner)
		case local.Deciding:
			slot := j.Slot()
			d, err := l.decideAgain(q, job, timedOut, cancelled, recheck)
			if err != nil {
				// It does not run: it leaves the queue (a wait of the line or
				// a grant it got is the safety net's to clean up); a slot it
				// held when it was taken back to be decided again is
				// released (retried in the background while the database is
				// away).
				q.Forget(job.ID)
				if recheck && slot == local.LineSlot {
					l.releaser.submitAsync(&releaseRequest{ended: &ledger.Held{ID: job.ID, Kind: job.Kind, Key: j.CurrentKey()}})
				}
				return err
			}
			switch d.Action {
			case ledger.Parked, ledger.StepBack:
				return nil // River's completion parks it, or makes it available again
			case ledger.Fail:
				return fmt.Errorf("concurrency limit of %s (%s): %w", job.Kind, d.Reason, ErrNoSlot)
			}
			// Still Deciding after a decision to wait: a grant crossed it
			// (local.Queue.Line), and the next decision finds it.
			timedOut, cancelled, recheck = false, false, false
		case local.Queued, local.Lined, local.Held:
			timedOut, cancelled = l.wait(ctx, q, j, deadline)
		}
	}
}

// limitCameAfter reports whether j, Working and not begun, was made
// Deciding again because the worker heard a change of its kind's limits
// since j's decision was asked (a change of another kind's leaves it be)
// and its kind has a limit now: its decision again
// checks that it holds what the limits now ask (a slot under a
// concurrency limit, a start under a rate; nothing will do under a circuit
// breaker), or gives back what it holds and decides it afresh, in one
// ledger transaction. Decided to run free, or before a rate or a breaker,
// it would otherwise start uncounted. A job holding a slot of the line
// under a per-kind limit alone (no circuit breaker, no rate, no per-key
// limit) that the worker's copy shows within the limit begins without
// going back (the ledger would keep it as it is). A job on a
// leased slot is the lease keeper's (the kind's leases follow its
// limits). A change heard after it begins leaves it be: it began within
// the change's window.
func (l *Limiter) limitCameAfter(ctx context.Context, q *local.Queue, j *local.Job) bool {
	gen := l.limits.gen.Load()
	if j.Slot() == local.LeasedSlot || gen == j.Stamped() {
		return false
	}
	if !l.limits.changedSince(q.Kind(), j.Stamped()) {
		// The changes heard since were of other kinds': its decision
		// stands.
		j.Restamp(gen)
		return false
	}
	lim, err := l.limits.of(ctx, q.Kind())
	if err != nil || lim.Regime() == ledger.Unlimited {
		return false
	}
	if j.Slot() == local.LineSlot && lim.Max >= 0 && lim.RateMax == 0 && (lim.Max == 0 || lim.Admitted <= lim.Max) && lim.KeyMax == 0 {
		// It holds a slot, and the limits now ask no more (no breaker, no
		// rate, no per-key limit, the kind's slots within its limit as the
		// copy read them: the ledger's recheck would keep it): it begins,
		// without a ledger transaction.
		j.Restamp(gen)
		return false
	}
	return q.Undecide(j.ID)
}

// wait waits until the wait of j ends: a grant or a hand-over (it is
// Working), its place or path gone (Deciding), its deadline (none for a
// job resumed ahead: its place is the line's, until a rate is set; none
// for a job Held: it has its slot; a park-after later, again and again,
// while its line here would start it within one: StartsSoon), an end of
// its wait ahead (it waits
// again, to its deadline) or its context (it leaves the line to be
// decided again: timedOut, or cancelled by JobCancel).
func (l *Limiter) wait(ctx context.Context, q *local.Queue, j *local.Job, deadline time.Time) (timedOut, cancelled bool) {
	var expired <-chan time.Time
	var timer *time.Timer
	if _, ahead := j.Held(); !ahead && j.State() != local.Held {
		timer = time.NewTimer(time.Until(deadline))
		defer timer.Stop()
		expired = timer.C
	}
	for waiting := true; waiting; {
		select {
		case <-j.Wake():
			return false, false
		case <-expired:
			if q.StartsSoon(j.ID, time.Now(), l.parkAfter) {
				// Its line here moves fast enough to start it within another
				// park-after: parked, it would only be fetched again behind
				// the same line.
				timer.Reset(l.parkAfter)
				continue
			}
			timedOut, waiting = true, false
		case <-ctx.Done():
			// A stop or a timeout parks it, its attempt undone; JobCancel
			// parks it too, and its parking cancels it.
			timedOut, waiting = true, false
			cancelled = errors.Is(context.Cause(ctx), rivertype.ErrJobCancelledRemotely)
		}
	}
	if !q.Leave(j.ID) {
		<-j.Wake() // a grant or a hand-over came meanwhile: it stands
		return false, false
	}
	l.gate.left()
	return timedOut, cancelled
}

// startedAfterGrant logs the start of j, which waited in the line and
// starts on a grant whose start was not claimed with it (grantJobs), when
// its kind has a rate: the grant reserved its start, counted until now
// whatever its time, and from now in its window. It is written before the
// job begins (and again if it is held at its begin): a retry of it decided
// meanwhile would otherwise take the reservation for its own. It reports
// false when the start went before the claim (an older job of its line
// took it, a change took it back): j must not begin on it.
func (l *Limiter) startedAfterGrant(ctx context.Context, q *local.Queue, j *local.Job) bool {
	if lim, err := l.limits.of(ctx, q.Kind()); err == nil && lim.RateMax == 0 {
		return true
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), decideTimeout)
	defer cancel()
	claimed, err := l.ledger.ClaimStarts(wctx, []int64{j.ID})
	if err != nil {
		// Its start stays reserved: counted until the safety net drops it.
		l.logger.Warn("concurrency limits: start not logged", "kind", q.Kind(), "job_id", j.ID, "error", err)
		return true
	}
	return len(claimed) > 0
}

// restampStart logs again, as j begins, the start its decision logged,
// when its kind has a rate: j was held back after its decision (an older
// job of its key here was deciding), and its window counts from now. The
// job does not wait for it: a start moved later only makes its window end
// later, and jobs held back together begin in their order.
func (l *Limiter) restampStart(ctx context.Context, q *local.Queue, j *local.Job) {
	if lim, err := l.limits.of(ctx, q.Kind()); err == nil && lim.RateMax == 0 {
		return
	}
	l.bg.Add(1)
	go func() {
		defer l.bg.Done()
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), decideTimeout)
		defer cancel()
		if _, err := l.ledger.ClaimStarts(wctx, []int64{j.ID}); err != nil {
			l.logger.Warn("concurrency limits: start not logged again", "kind", q.Kind(), "job_id", j.ID, "error", err)
		}
	}()
}

// run runs job, Working, and ends it: its slot goes to the next job.
func (l *Limiter) run(ctx context.Context, q *local.Queue, j *local.Job, job *rivertype.JobRow, entered time.Time,
	doInner func(context.Context) error) error {
	defer l.end(q, j)
	reason, _ := j.Held()
	waited := time.Since(entered)
	if reason == "" && j.Slot() == local.LeasedSlot && waited >= leaseWaitShown {
		reason = ledger.ReasonLimit
	}
	a := Admission{}
	switch j.Slot() {
	case local.LeasedSlot:
		a.Slot = SlotLeased
	case local.LineSlot:
		a.Slot = SlotLine
	}
	if reason != "" {
		a.held, a.wasHeld = Held{Since: fetchedAt(job), Reason: reason}, true
	}
	return doInner(withAdmission(ctx, a))
}

// end ends j in q, and gives its slot to the next job: a leased slot to
// the job of this worker at the front of the kind's queue, if it waits
// for one (or back to the lease keeper); a slot of the line to the job at
// the front of the line, if it waits in this worker and the kind has a
// per-kind limit alone (the move written with the next release), or back
// to the ledger, whose grant round gives it to the front of the line.
func (l *Limiter) end(q *local.Queue, j *local.Job) {
	kind := q.Kind()
	switch q.End(j.ID) {
	case local.LeasedSlot:
		if q.GiveLeased(time.Now()) == nil {
			l.keeper.wakeUp()
		}
	case local.LineSlot:
		from := ledger.Held{ID: j.ID, Kind: kind, Key: j.CurrentKey()}
		to := q.GiveLine(time.Now(), func(id int64, key string) {
			l.releaser.submitAsync(&releaseRequest{handed: &ledger.HandOver{From: from, To: ledger.Held{ID: id, Kind: kind, Key: key}}})
		})
		if to != nil {
			l.trace("handed over", "job_id", to.ID, "from_job_id", j.ID)
			l.TestSignals.HandedOver.Signal(to.ID)
			return
		}
		l.releaser.submitAsync(&releaseRequest{ended: &from})
	}
	l.gate.left()
}
