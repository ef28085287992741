package limiter

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/riverqueue/river/rivertype"

	"github.com/sluice-dev/sluice/limiter/internal/ledger"
	"github.com/sluice-dev/sluice/limiter/internal/local"
)

// parkingKey is the key of a job's parking record in its metadata
// (migration 00014_parking_metadata): only a job that parked can hold a
// grant of the line when it is fetched.
var parkingKey = []byte(`"sluice_parking"`)

// everParked reports whether job parked at least once (the line may hold
// something for it: a grant, its place).
func everParked(job *rivertype.JobRow) bool { return bytes.Contains(job.Metadata, parkingKey) }

// decideRequest is jobs for the ledger to decide together: those of one
// fetch, or a job decided again in the middleware. Requests that arrive
// while a decision runs go together in the next one.
type decideRequest struct {
	jobs []ledger.Job
	done chan struct{}
	out  *ledger.Decided
	err  error
}

// decideBatch decides the jobs of batch in one ledger transaction, and
// starts what it leaves to do: a grant round for kinds with room while
// jobs wait for their turn, the timers of rate windows.
func (l *Limiter) decideBatch(batch []*decideRequest) {
	var jobs []ledger.Job
	for _, r := range batch {
		jobs = append(jobs, r.jobs...)
	}
	kinds := make([]string, 0, 2)
	for _, j := range jobs {
		if !slices.Contains(kinds, j.Kind) {
			kinds = append(kinds, j.Kind)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), decideTimeout)
	defer cancel()
	// Whether a younger job of its key here holds a slot (or a start) it
	// has not begun on is looked at as the ledger reads the line under the
	// kind's lock: a grant given while the batch waited for the lock
	// (claimed, and held back behind the job deciding) is the job's to
	// take, not a reason to park it (seed 836093428).
	heldBehind := func(j ledger.Job) bool {
		q := l.queues.get(j.Kind)
		return q != nil && q.HeldBehind(j.ID)
	}
	out, err := l.ledger.Decide(ctx, jobs, l.limits.guess(ctx, kinds), l.parkAfter, heldBehind)
	if err == nil {
		l.restamp(ctx, jobs, out.Limits)
		if len(out.Recheck) > 0 {
			l.releaser.submitAsync(&releaseRequest{keyRounds: out.Recheck})
		}
		for kind, d := range out.Wakes {
			l.wakes.after(kind, d)
		}
	}
	for _, r := range batch {
		r.out, r.err = out, err
		close(r.done)
	}
}

// restamp marks the jobs of a decision as decided under the limits in
// force now, when the changes heard since they were stamped (Job.Stamp)
// left their kinds' settings as the decision read them under the kinds'
// locks (a change of another kind, the listener connecting again, a
// change the decision saw already): they need not be decided again
// before they begin (limitCameAfter).
func (l *Limiter) restamp(ctx context.Context, jobs []ledger.Job, read map[string]ledger.Limits) {
	heard := l.limits.gen.Load()
	same := map[string]bool{}
	for _, j := range jobs {
		q := l.queues.get(j.Kind)
		if q == nil {
			continue
		}
		qj := q.Get(j.ID)
		if qj == nil || qj.Stamped() == heard {
			continue
		}
		ok, seen := same[j.Kind]
		if !seen {
			cur, err := l.limits.of(ctx, j.Kind)
			ok = err == nil && cur.SameSettings(read[j.Kind])
			same[j.Kind] = ok
		}
		if ok {
			qj.Restamp(heard)
		}
	}
}

// decide has the ledger decide jobs and returns their decisions: the jobs
// of each kind in one transaction with whatever else of the kind is
// decided meanwhile (one decider per kind: a kind waiting for its lock
// holds up no other kind's decisions).
func (l *Limiter) decide(jobs []ledger.Job) (map[int64]ledger.Decision, error) {
	byKind := map[string][]ledger.Job{}
	for _, j := range jobs {
		byKind[j.Kind] = append(byKind[j.Kind], j)
	}
	reqs := make([]*decideRequest, 0, len(byKind))
	var wg sync.WaitGroup
	for kind, js := range byKind {
		r := &decideRequest{jobs: js, done: make(chan struct{})}
		reqs = append(reqs, r)
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.deciders.of(kind).submit(r, r.done)
		}()
	}
	wg.Wait()
	out := make(map[int64]ledger.Decision, len(jobs))
	for _, r := range reqs {
		if r.err != nil {
			return nil, r.err
		}
		for _, d := range r.out.Decisions {
			out[d.Job] = d
		}
	}
	return out, nil
}

// deciders are the batchers of decisions, one per kind.
type deciders struct {
	l   *Limiter
	mu  sync.Mutex
	all map[string]*batcher[decideRequest]
}

// of returns kind's batcher, made if missing.
func (d *deciders) of(kind string) *batcher[decideRequest] {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.all == nil {
		d.all = map[string]*batcher[decideRequest]{}
	}
	b := d.all[kind]
	if b == nil {
		b = &batcher[decideRequest]{process: d.l.decideBatch, maxInFlight: 1}
		d.all[kind] = b
	}
	return b
}

// admit puts jobs (one fetch) of limited kinds in their kinds' queues and
// decides them: on the leased path in the worker's memory where it is
// open, the others in one ledger decision. dispatched says whether River's
// executors have them (the middleware admits them) or not yet (their
// fetch does). It returns the decisions that took jobs out of their queues:
// those that parked or stepped back (River's executors never see them when
// decided at their fetch), and those that may not start (Fail); a job it
// leaves out (no limit, and never parked) runs without the limiter. A job
// it could not decide (the ledger failed) stays Deciding: the middleware
// decides it.
func (l *Limiter) admit(ctx context.Context, jobs []*rivertype.JobRow, dispatched bool) (gone map[int64]ledger.Decision, err error) {
	a, err := l.admitLocal(ctx, jobs, dispatched, nil)
	if err != nil {
		return nil, err
	}
	return l.admitLedger(a)
}

// admission is jobs of one fetch put in their kinds' queues by admitLocal:
// those the worker's memory decided, and those left for the ledger.
type admission struct {
	// queues holds every job put in a queue, by id.
	queues map[int64]*local.Queue
	// took are the jobs that took a leased slot at once.
	took map[int64]bool
	// toLedger are the jobs for one ledger decision (admitLedger).
	toLedger []ledger.Job
}

// admitLocal is admit's first part: it puts jobs in their kinds' queues
// and decides those on the leased path in the worker's memory. It reads
// nothing when given the copy of the limits to decide by (snap: within a
// fetch's transaction), else the worker's copy (re-read if expired). It
// returns what it did, even with an error (a kind's limits not read: that
// kind's jobs and those after are left out).
func (l *Limiter) admitLocal(ctx context.Context, jobs []*rivertype.JobRow, dispatched bool, snap *limitsSnapshot) (a *admission, err error) {
	a = &admission{queues: map[int64]*local.Queue{}, took: map[int64]bool{}}
	byKind := map[string][]*rivertype.JobRow{}
	var kinds []string
	for _, job := range jobs {
		if _, ok := byKind[job.Kind]; !ok {
			kinds = append(kinds, job.Kind)
		}
		byKind[job.Kind] = append(byKind[job.Kind], job)
	}
	for _, kind := range kinds {
		var lim ledger.Limits
		heard := l.limits.gen.Load()
		if snap != nil {
			lim, heard = snap.of(kind), snap.gen
		} else if lim, err = l.limits.of(ctx, kind); err != nil {
			return a, err
		}
		var fetched []local.Fetched
		var kept []*rivertype.JobRow
		for _, job := range byKind[kind] {
			if lim.Regime() == ledger.Unlimited && !everParked(job) {
				continue // not limited, and the line holds nothing for it
			}
			key, _ := ledger.PartitionKey(job.EncodedArgs, lim.Fields)
			fetched = append(fetched, local.Fetched{ID: job.ID, Key: key, Fetched: fetchedAt(job), Args: job.EncodedArgs})
			kept = append(kept, job)
		}
		if len(kept) == 0 {
			continue
		}
		q := l.queues.of(kind)
		q.SetByFetch(lim.Regime() == ledger.Leased)
		for _, j := range q.Fetch(fetched) {
			j.Stamp(heard)
		}
		for _, job := range kept {
			a.queues[job.ID] = q
			// A first attempt that never parked never waited in the line (a
			// wait is part of an attempt): on the leased path it asks only
			// the worker's memory.
			if lim.Regime() == ledger.Leased && !l.neverPark && job.Attempt <= 1 && !everParked(job) {
				if works, ok := q.TakeLeased(job.ID, true, lim.Max, time.Now()); ok {
					if works {
						a.took[job.ID] = true
					} else {
						l.keeper.wakeUp() // it waits for a leased slot
					}
					continue
				}
			}
			a.toLedger = append(a.toLedger, l.ledgerJob(job, dispatched))
		}
	}
	return a, nil
}

// admitLedger is admit's second part: one ledger decision of the jobs
// admitLocal left for it.
func (l *Limiter) admitLedger(a *admission) (gone map[int64]ledger.Decision, err error) {
	if len(a.toLedger) == 0 {
		return nil, nil
	}
	decisions, err := l.decide(a.toLedger)
	if err != nil {
		return nil, err
	}
	gone = map[int64]ledger.Decision{}
	for _, j := range a.toLedger {
		d := decisions[j.ID]
		switch l.apply(a.queues[j.ID], d) {
		case ledger.Parked, ledger.StepBack, ledger.Fail:
			gone[j.ID] = d
		}
	}
	return gone, nil
}

// unadmit takes back what admitLocal did for jobs whose fetch did not
// commit (they are available again): each leaves its queue, and a leased
// slot one took goes to the next job (or back), as at a job's end.
func (l *Limiter) unadmit(a *admission) {
	var working []int64
	for id, q := range a.queues {
		if j := q.Get(id); j != nil && j.State() == local.Working {
			working = append(working, id)
			continue
		}
		q.Forget(id)
	}
	// The jobs that wait are gone first: no slot freed here goes to them.
	for _, id := range working {
		q := a.queues[id]
		if j := q.Get(id); j != nil {
			l.end(q, j)
		}
	}
}

// ledgerJob is job as the ledger decides it.
func (l *Limiter) ledgerJob(job *rivertype.JobRow, dispatched bool) ledger.Job {
	return ledger.Job{ID: job.ID, Kind: job.Kind, Args: job.EncodedArgs, FetchedAt: fetchedAt(job), Attempt: job.Attempt,
		Dispatched: dispatched, NoWait: l.neverPark, Slots: l.gate.slotsOf(job.Queue)}
}

// fetchedAt is when job's attempt was fetched (its attempted_at).
func fetchedAt(job *rivertype.JobRow) time.Time {
	if job.AttemptedAt != nil {
		return *job.AttemptedAt
	}
	return time.Now()
}

// apply tells q what the ledger decided for a job of it (its key first,
// as the ledger read it), and returns the action. A job that waits in the line here closes the kind's leased path
// in this worker (local.Queue.Line): the line alone orders its jobs then.
func (l *Limiter) apply(q *local.Queue, d ledger.Decision) ledger.Action {
	l.trace("decided", "kind", d.Kind, "job_id", d.Job, "action", int(d.Action), "reason", d.Reason, "ahead", d.Ahead)
	q.SetKey(d.Job, d.Key) // by the partition the ledger decided it under
	switch d.Action {
	case ledger.Run:
		q.Work(d.Job, local.NoSlot)
	case ledger.Slot:
		q.Work(d.Job, local.LineSlot)
	case ledger.Wait:
		if d.GaveBack {
			q.ForgetEarly(d.Job) // a grant heard while it decided may be the one given back
		}
		if y := q.SwapFor(d.Job); y != nil {
			// A younger job of its key here holds a slot and has not started:
			// it takes that slot, and the younger one waits in its place.
			ctx, cancel := context.WithTimeout(context.Background(), decideTimeout)
			out, err := l.ledger.Swap(ctx, d.Kind, y.ID, d.Job, d.Reason)
			cancel()
			l.trace("swap", "job_id", d.Job, "held_job_id", y.ID, "outcome", int(out))
			if err != nil {
				l.logger.Warn("concurrency limits: a held slot not handed to an older job; it waits in the line", "kind", d.Kind,
					"job_id", d.Job, "held_job_id", y.ID, "error", err)
			}
			if q.Swapped(d.Job, y.ID, out == ledger.SwapMoved, out == ledger.SwapGaveBack, d.Ahead, d.Reason) {
				l.keeper.wakeUp()
			}
			if out == ledger.SwapMoved {
				l.TestSignals.Swapped.Signal(d.Job)
			}
			if out != ledger.SwapNone {
				// The younger job waits in the line now (and the slot it gave
				// back, if it did, is free): a grant round of its key's line
				// (of the kind's whole line, unless under per-key limits alone)
				// gives the front any room there is.
				l.releaser.submitAsync(&releaseRequest{keyRounds: map[string][]string{d.Kind: {d.Key}}})
			}
			break
		}
		if q.Line(d.Job, d.Ahead, d.Reason) {
			l.keeper.wakeUp() // the kind's spare leased slots go back
		}
	case ledger.Parked:
		q.Park(d.Job, time.Now())
		l.parkedTotal.Add(1)
		l.metrics.Parked.WithLabelValues(d.Kind).Inc()
		if ledger.RateReason(d.Reason) {
			l.metrics.RateDelayed.WithLabelValues(d.Kind).Inc()
		}
	case ledger.Fail, ledger.StepBack:
		q.Forget(d.Job)
	}
	return d.Action
}

// decideAgain decides job (in the middleware, in q Deciding) again: its
// wait ended (timedOut), JobCancel came (cancelled), its place or path
// went, or its kind's limits changed before it began (recheck).
func (l *Limiter) decideAgain(q *local.Queue, job *rivertype.JobRow, timedOut, cancelled, recheck bool) (ledger.Decision, error) {
	if qj := q.Get(job.ID); qj != nil {
		qj.Stamp(l.limits.gen.Load())
	}
	j := l.ledgerJob(job, true)
	j.TimedOut, j.Cancelled, j.Recheck = timedOut, cancelled, recheck
	decisions, err := l.decide([]ledger.Job{j})
	if err != nil {
		return ledger.Decision{}, fmt.Errorf("concurrency limit of %s: %w", job.Kind, err)
	}
	d := decisions[job.ID]
	if l.apply(q, d) == ledger.Parked {
		l.rechecks.parked(job.Kind, d.Key) // River's completer completes the parking
	}
	return d, nil
}
