package limiter

import (
	"bytes"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/sluice-dev/sluice/db"
)

// decidedTTL is how long a decision made at a fetch waits for its job to
// reach the middleware; a decision no job claims (River never ran it) is
// undone then: its slot released, its place in the line given up.
const decidedTTL = time.Minute

// Driver returns River's pgx driver d with the limiter watching the
// fetches of the client built on it: the jobs of kinds (the kinds the
// client works) whose decisions belong to the line (a per-key or rate
// limit, or jobs waiting for the kind) are decided together, in job-id
// order, in one transaction right after the fetch, before River hands them
// to its goroutines; the middleware then finds each job's decision made.
// Without it, jobs fetched together would reach the limiter in the order
// Go schedules their goroutines (the newest often first), and a free slot
// could go to a younger job of a key while older ones fetched with it had
// not reached the limiter yet. Every other call of the driver is River's
// own.
func (l *Limiter) Driver(d *riverpgxv5.Driver, kinds []string) riverdriver.Driver[pgx.Tx] {
	return &fetchDriver{Driver: d, l: l, kinds: slices.Clone(kinds)}
}

// fetchDriver is River's pgx driver whose executors report fetches.
type fetchDriver struct {
	*riverpgxv5.Driver
	l     *Limiter
	kinds []string
}

// GetExecutor returns River's executor, watched.
func (d *fetchDriver) GetExecutor() riverdriver.Executor {
	return &fetchExecutor{Executor: d.Driver.GetExecutor(), d: d}
}

// fetchExecutor is River's executor that reports the jobs it fetches.
type fetchExecutor struct {
	riverdriver.Executor
	d *fetchDriver
}

// JobGetAvailable fetches as River does, then has the limiter decide the
// jobs of kinds in their line. While MaxFetchedWaiting jobs of a kind wait
// in this worker for their turn, the fetch waits and takes fewer
// (fetchGate).
func (e *fetchExecutor) JobGetAvailable(ctx context.Context, params *riverdriver.JobGetAvailableParams) (*riverdriver.JobGetAvailableResult, error) {
	params = e.d.l.gate.admit(ctx, params)
	res, err := e.Executor.JobGetAvailable(ctx, params)
	if err == nil && res != nil && len(res.Jobs) > 0 {
		e.d.l.fetched(ctx, res.Jobs, res.DecodeErrors, e.d.kinds)
	}
	return res, err
}

// parkingKey is the key of a job's parking record in its metadata
// (migration 00014_parking_metadata): only a job that parked can hold a
// grant when it is fetched.
var parkingKey = []byte(`"sluice_parking"`)

// decisions holds the decisions made at fetches until their jobs reach the
// middleware.
type decisions struct {
	mu   sync.Mutex
	byID map[int64]*admitRequest
	at   map[int64]time.Time
	// claimed are the decisions to wait that their jobs took and that stay
	// here until the jobs wait in the line (waitList.wait): the leased
	// slots and the hand-over pass no younger job ahead of them meanwhile.
	claimed map[int64]bool
}

// fetched decides, in one line transaction, the fetched jobs of kinds that
// go through the line (not those on leased slots, nor those of kinds
// without limits), and keeps the decisions for the middleware. A job of a
// kind on leased slots that the line holds something for goes through the
// line too.
func (l *Limiter) fetched(ctx context.Context, jobs []*rivertype.JobRow, decodeErrs map[int64]error, kinds []string) {
	if l.ignoreLimits || l.neverPark || l.isStopped() {
		return
	}
	now := time.Now()
	var reqs, leased []*admitRequest
	for _, job := range jobs {
		if job.Kind == ResumeKind || decodeErrs[job.ID] != nil || !slices.Contains(kinds, job.Kind) {
			continue
		}
		st, ok, err := l.stateOf(ctx, job.Kind)
		if err != nil {
			continue
		}
		unlimited := !ok || (st.limit == 0 && !st.keyed)
		if unlimited && !bytes.Contains(job.Metadata, parkingKey) {
			continue // not limited, and never parked: the line holds nothing for it
		}
		if st.fast() && job.Attempt <= 1 && !bytes.Contains(job.Metadata, parkingKey) {
			// A first attempt that never parked: it never waited in the
			// line (a wait is part of an attempt, and ends in a grant, a
			// parking, or a new attempt after its worker died), so the line
			// holds nothing for it. Unchecked: P2's fetches read no line.
			continue
		}
		r := &admitRequest{ctx: context.WithoutCancel(ctx), job: job, deadline: now.Add(l.parkAfter), done: make(chan struct{})}
		if unlimited || st.fast() {
			// Checked below: a job resumed from its parking may hold a grant
			// given under limits this worker's copy does not show yet.
			leased = append(leased, r)
			continue
		}
		reqs = append(reqs, r)
	}
	if len(leased) > 0 {
		// A kind on leased slots, or without limits, as this worker last
		// read it: its jobs take leased slots or run, but those the line
		// holds something for (a job resumed ahead, or granted a slot: the
		// kind's line formed since, or its limits were set since) go
		// through the line, which knows them and the limits in force.
		recs, err := l.lineRecords(ctx, l.q, leased)
		for _, r := range leased {
			// Unread (an error): the line, which reads them under the
			// kind's lock, decides them all (a leased slot taken by a job
			// holding a reserved one would leave that one taken).
			if rec := recs[r.job.ID]; err != nil || (rec != nil && (rec.Waiter || rec.SlotReserved || rec.StartReserved)) {
				reqs = append(reqs, r)
			}
		}
	}
	if len(reqs) == 0 {
		return
	}
	decided := l.takeAhead(ctx, reqs)
	var rest []*admitRequest
	for _, r := range reqs {
		if !slices.Contains(decided, r) {
			rest = append(rest, r)
		}
	}
	if len(rest) > 0 {
		l.lineBatch(rest)
	}
	d := &l.decided
	d.mu.Lock()
	if d.byID == nil {
		d.byID, d.at = map[int64]*admitRequest{}, map[int64]time.Time{}
	}
	var waitKinds []string
	for _, r := range reqs {
		if r.err != nil {
			continue // decided again in the middleware
		}
		d.byID[r.job.ID], d.at[r.job.ID] = r, now
		delete(d.claimed, r.job.ID)
		if r.decision == admitWait && !slices.Contains(waitKinds, r.job.Kind) {
			waitKinds = append(waitKinds, r.job.Kind)
		}
	}
	l.dropUnclaimed(now)
	d.mu.Unlock()
	for _, kind := range waitKinds {
		l.leases.yield(kind) // the line orders the kind's jobs waiting here
	}
}

// takeAhead takes the jobs of reqs that were resumed ahead of a free slot
// (waiters without a worker, holding no grant: one statement,
// TakeAheadWaiters) of a kind that only a
// per-kind limit holds and that has no room, as the line poller read it
// within handOverFresh: they wait in this worker (TakeAheadWaiters), for a
// grant or a slot handed over, without a line transaction. Their place in
// the line is the one the grant round that resumed them gave them; what is
// left to decide (a grant, their parking) is the line's, as for any job
// waiting in a worker. It returns the requests it decided.
func (l *Limiter) takeAhead(ctx context.Context, reqs []*admitRequest) []*admitRequest {
	var cands []*admitRequest
	for _, r := range reqs {
		if st, ok := l.handStates.get(r.job.Kind); ok && !st.keyed && st.limit > 0 && st.admitted >= st.limit {
			cands = append(cands, r)
		}
	}
	if len(cands) == 0 {
		return nil
	}
	ids := make([]int64, len(cands))
	for i, r := range cands {
		ids[i] = r.job.ID
	}
	taken, err := l.pollQ.TakeAheadWaiters(ctx, db.TakeAheadWaitersParams{WorkerID: l.workerID, JobIds: ids})
	if err != nil {
		return nil
	}
	var out []*admitRequest
	for _, r := range cands {
		if slices.Contains(taken, r.job.ID) {
			r.decision, r.reason, r.takenAhead = admitWait, reasonLimit, true
			close(r.done)
			out = append(out, r)
		}
	}
	return out
}

// oldestWaiting returns the oldest job of kind decided at its fetch to wait
// in the line that does not wait there yet (0: none): a job on its way to
// the line, which no younger job overtakes on the leased slots' path
// (lease.go) or by a slot handed over in memory (handover.go).
func (d *decisions) oldestWaiting(kind string) int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	var oldest int64
	for id, r := range d.byID {
		// A claimed one is a decision to wait (its job now changes it).
		if r.job.Kind == kind && (d.claimed[id] || r.decision == admitWait) && (oldest == 0 || id < oldest) {
			oldest = id
		}
	}
	return oldest
}

// takeDecided returns the decision made at the fetch of job id (nil: none),
// for the middleware.
func (l *Limiter) takeDecided(id int64) *admitRequest {
	d := &l.decided
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.byID[id]
	if r == nil || d.claimed[id] {
		return nil
	}
	delete(d.at, id)
	if r.decision == admitWait {
		// It stays known until it waits in the line (arrived).
		if d.claimed == nil {
			d.claimed = map[int64]bool{}
		}
		d.claimed[id] = true
		return r
	}
	delete(d.byID, id)
	return r
}

// inTransit records that r, decided by a line transaction of the
// middleware (its first decision, or a decision again after its wait),
// is on its way to the line: until it waits there (arrived) or its
// decision is followed, no younger job of its kind overtakes it by a slot
// handed over in memory or a leased slot (oldestWaiting), as for a job
// decided at its fetch.
func (d *decisions) inTransit(r *admitRequest) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.byID == nil {
		d.byID, d.at = map[int64]*admitRequest{}, map[int64]time.Time{}
	}
	if d.claimed == nil {
		d.claimed = map[int64]bool{}
	}
	d.byID[r.job.ID], d.claimed[r.job.ID] = r, true
}

// arrived forgets the decision of job id, taken by its job, which now waits
// in the line (or no longer needs to).
func (d *decisions) arrived(id int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.claimed[id] {
		delete(d.claimed, id)
		delete(d.byID, id)
	}
}

// dropUnclaimed undoes the decisions no job claimed within decidedTTL;
// d.mu is held.
func (l *Limiter) dropUnclaimed(now time.Time) {
	d := &l.decided
	for id, at := range d.at {
		if now.Sub(at) < decidedTTL {
			continue
		}
		r := d.byID[id]
		delete(d.byID, id)
		delete(d.at, id)
		switch r.decision {
		case admitSlot:
			l.release(r.ctx, r.job)
		case admitWait:
			l.forget(r)
		}
	}
}
