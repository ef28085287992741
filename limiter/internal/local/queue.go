// Package local is one worker's memory of the limiter: per limited kind,
// its jobs in the order the kind's line serves them, each in exactly one
// state, and the slots the worker leases. Every way a job of the worker
// gets a slot without the ledger (a leased slot, a slot handed over in
// memory) asks its kind's queue for its front. It has no SQL and no
// pointer to the limiter: the limiter tells it what the ledger decided,
// and asks it who goes next.
package local

import (
	"slices"
	"sync"
	"time"
)

// State is where a job of a queue stands.
type State int

const (
	// Deciding: fetched, and its decision (at its fetch, or again in the
	// middleware) is under way. No younger job of its kind gets a slot in
	// memory ahead of it: it may be the one the slot is for.
	Deciding State = iota
	// Queued: it waits in this worker for one of its leased slots.
	Queued
	// Lined: it waits in the kind's line (the ledger's), in this worker,
	// for a grant.
	Lined
	// Held: it got what it needs (a decision to run, a grant), but a job
	// of its key ahead of it here (older, or fetched earlier) is deciding
	// or waits for a leased slot: it starts once none is, so that no job
	// of a worker starts ahead of the one its slot may be for.
	Held
	// Working: it holds what it needs (Slot) and runs.
	Working
)

func (s State) String() string {
	return [...]string{"deciding", "queued", "lined", "held", "working"}[s]
}

// Slot is what a working job holds.
type Slot int

const (
	// NoSlot: it runs without one (no limit, or only a rate).
	NoSlot Slot = iota
	// LeasedSlot: one of the worker's leased slots.
	LeasedSlot
	// LineSlot: a slot of the line's: taken at its decision, granted, or
	// handed over in memory.
	LineSlot
)

// Outcome is how a job's wait (Queued or Lined) ended, when something
// other than the job itself ended it.
type Outcome int

const (
	// Granted: it got what it needs (its Slot): it runs.
	Granted Outcome = iota
	// Redecide: it goes to the ledger to be decided again: its place in the
	// line went (its kind's limits were cleared), or the leased path closed
	// while it waited for a leased slot.
	Redecide
	// Relined: held with a slot, it gave the slot to an older job of its
	// key here that was put in the line, and waits in the line in its
	// place (Swapped).
	Relined
	// Rewait: it waits on in the line, to a deadline now (EndAhead).
	Rewait
)

// Job is a job of a queue.
type Job struct {
	// ID is its River job id; Key its partition key ("": none).
	ID  int64
	Key string
	// Fetched is when it was fetched (its attempt's attempted_at).
	Fetched time.Time

	args  []byte      // its encoded args (Rekey; nil: not known)
	mu    *sync.Mutex // its queue's
	seq   uint64      // its fetch, in fetch order
	state State
	slot  Slot
	ahead bool
	// resumed: its wait without a deadline is the line's (it came ahead of
	// a free slot, as the ledger decided it), not a swap's; a change of
	// limits may end it (EndAhead). It implies ahead.
	resumed bool
	reason  string
	// early: a grant came while it was deciding (its decision to wait and
	// the grant crossed), holding earlySlot (earlyClaimed: its start was
	// logged already): a decision to wait lets it start with that grant
	// (Line); any other decision finds the grant in the ledger.
	early        bool
	earlySlot    Slot
	earlyClaimed bool
	earlyHeard   uint64
	// heldSlot is what a Held job holds; swapping: it is to give it to an
	// older job of its key (SwapFor), and stays Held until Swapped.
	heldSlot Slot
	swapping bool
	// granted: it got what it needs by a grant of the ledger (Grant);
	// held: it was Held before it worked.
	granted bool
	held    bool
	// heard is the count of limit changes the limiter had heard when the
	// job's latest decision was asked (Stamp).
	heard uint64
	// begun: its work began (Begin); it is never held back again.
	begun bool
	wake  chan Outcome
}

// Stamp records n, the count of limit changes the limiter had heard when
// it asked for the job's decision: a job decided to run without a slot
// that has not begun when a later change comes is decided again
// (Undecide).
func (j *Job) Stamp(n uint64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.heard = n
}

// Restamp raises the count Stamp recorded to n (never lowers it): the
// changes heard up to n left the job's kind as its decision read it.
func (j *Job) Restamp(n uint64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.heard = max(j.heard, n)
}

// Stamped is the count Stamp recorded.
func (j *Job) Stamped() uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.heard
}

// CurrentKey is the job's key as it is now: Key, read under its queue's
// lock (SetKey and Rekey change it while the job is in its queue).
func (j *Job) CurrentKey() string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.Key
}

// State is the job's state.
func (j *Job) State() State {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.state
}

// Slot is what the job holds while it works.
func (j *Job) Slot() Slot {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.slot
}

// Granted reports whether the job got what it needs by a grant of the
// ledger while it waited in the line (not by its decision, nor a leased or
// handed-over slot).
func (j *Job) Granted() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.granted
}

// WasHeld reports whether the job was Held (given what it needs, and held
// back behind an older job of its key here) before it worked: a start
// logged at its decision is logged again when it begins.
func (j *Job) WasHeld() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.held
}

// Held is what held the job in the line (its reason: "" when it never
// waited there), and whether it came ahead of a free slot (resumed by the
// lookahead: it waits in the line as long as it takes).
func (j *Job) Held() (reason string, ahead bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.reason, j.ahead
}

// notify ends the job's wait with o (its queue's lock is held). The wake
// holds one outcome; one not read yet is replaced (the job looks at its
// state once woken, whatever the outcome), so that a send never blocks
// while the lock is held: a job whose wait ended by its deadline takes the
// lock to leave before it reads its wake.
func (j *Job) notify(o Outcome) {
	select {
	case <-j.wake:
	default:
	}
	j.wake <- o
}

// Wake delivers the outcome of the job's wait when something other than
// the job ends it (a grant, a slot handed over, its place gone).
func (j *Job) Wake() <-chan Outcome { return j.wake }

// before reports whether j goes before o in its kind's line: fetched
// earlier, or, in the same fetch, older.
func (j *Job) before(o *Job) bool {
	if j.seq != o.seq {
		return j.seq < o.seq
	}
	return j.ID < o.ID
}

// Queue is one worker's jobs of one limited kind, each in exactly one
// state, those not working in the order the kind's line serves them (by
// fetch, a fetch's jobs by job id); and the kind's slots the worker leases.
// Its methods are safe for concurrent use.
type Queue struct {
	mu    sync.Mutex
	kind  string
	seq   uint64
	jobs  map[int64]*Job
	order []*Job // the jobs not working, in line order
	lease Lease
	// leasedMarks are jobs whose fetch marked them waiting for a leased
	// slot, not published since (NoteLeasedMarks).
	leasedMarks []int64
	// byFetch: the kind's jobs start in fetch order (a per-kind limit
	// alone), not in job-id order within a key (SetByFetch).
	byFetch bool
	// parked are the jobs this worker parked within the last ViewFresh
	// (Park), and when: a view read before a parking does not show it.
	parked map[int64]time.Time
	// keys are the keys with jobs here: how many, and the pace of the
	// key's line here (StartsSoon). A key's record goes with its last job.
	keys map[string]*keyLine
	// mayHold: a job was Held since releaseHeldLocked last found none in
	// the order (it looks only then: a fetch's jobs taking leased slots
	// one by one would each scan the whole order for none).
	mayHold bool
}

// keyLine is what a queue keeps of a key while jobs of it are here.
type keyLine struct {
	jobs int
	// begun is when the key's last jobs here began (at most
	// recentBegins, the newest last).
	begun []time.Time
}

// recentBegins is how many begins of a key a queue remembers.
const recentBegins = 16

// NewQueue returns the queue of kind, empty, its jobs of a key starting
// in job-id order.
func NewQueue(kind string) *Queue {
	return &Queue{kind: kind, jobs: map[int64]*Job{}, keys: map[string]*keyLine{}}
}

// SetByFetch says whether the kind's jobs start in fetch order (a per-kind
// limit alone: an older job fetched later holds no job back) or in job-id
// order within a key (a per-key limit or a rate).
func (q *Queue) SetByFetch(byFetch bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.byFetch != byFetch {
		q.byFetch = byFetch
		q.releaseHeldLocked()
	}
}

// aheadLocked reports whether o, of j's key, is to be waited for by j
// while it decides: in fetch order (a per-kind limit alone), fetched
// before it and older (the ledger's line is in job-id order: a younger job
// fetched first waits there behind j, and must not hold j back here); in
// job-id order, fetched before it or older; q.mu is held.
func (q *Queue) aheadLocked(o, j *Job) bool {
	if q.byFetch {
		return q.precedesLocked(o, j)
	}
	return o.Key == j.Key && (o.before(j) || o.ID < j.ID)
}

// precedesLocked reports whether o, of j's key, begins before j: in fetch
// order (a per-kind limit alone: fetched before it, or in the same fetch,
// and older; a job older but fetched later, a retry, or younger but
// fetched first, goes in either order) or in job-id order. Unlike
// aheadLocked it is a strict order (no two jobs precede each other), so
// that jobs held for the jobs that precede them never wait for each other;
// q.mu is held.
func (q *Queue) precedesLocked(o, j *Job) bool {
	if o.Key != j.Key {
		return false
	}
	if q.byFetch {
		return o.before(j) && o.ID < j.ID
	}
	return o.ID < j.ID
}

// laterLocked reports whether o starts after y, of its key, in the order
// the kind's jobs start in: in fetch order under a per-kind limit alone,
// else in job-id order (a retry fetched again after a younger job is still
// the older); q.mu is held.
func (q *Queue) laterLocked(o, y *Job) bool {
	if q.byFetch {
		return y.before(o)
	}
	return y.ID < o.ID
}

// Kind is the queue's kind.
func (q *Queue) Kind() string { return q.kind }

// Fetched is a job as a fetch brings it: Args are its encoded args, by
// which Rekey keys it again (nil: it keeps Key).
type Fetched struct {
	ID      int64
	Key     string
	Fetched time.Time
	Args    []byte
}

// Fetch adds the jobs of one fetch (together: one place in fetch order,
// job-id order within it), each Deciding, and returns them. A job already
// in the queue (fetched again for a new attempt before its last one was
// forgotten) is replaced.
func (q *Queue) Fetch(fetched []Fetched) []*Job {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.seq++
	out := make([]*Job, len(fetched))
	for i, f := range fetched {
		if old := q.jobs[f.ID]; old != nil {
			q.removeLocked(old)
		}
		j := &Job{ID: f.ID, Key: f.Key, Fetched: f.Fetched, args: f.Args, mu: &q.mu, seq: q.seq, state: Deciding, wake: make(chan Outcome, 1)}
		q.jobs[f.ID] = j
		q.joinKeyLocked(j.Key)
		q.insertLocked(j)
		out[i] = j
	}
	return out
}

// insertLocked puts j in line order; q.mu is held.
func (q *Queue) insertLocked(j *Job) {
	i, _ := slices.BinarySearchFunc(q.order, j, func(a, b *Job) int {
		switch {
		case a.before(b):
			return -1
		case b.before(a):
			return 1
		}
		return 0
	})
	q.order = slices.Insert(q.order, i, j)
}

// dropLocked takes j out of the order, if it is in it; q.mu is held. The
// front, where jobs mostly leave (a fetch's jobs taking leased slots one
// after the other), goes without moving the rest.
func (q *Queue) dropLocked(j *Job) {
	switch i := slices.Index(q.order, j); {
	case i == 0:
		q.order[0] = nil
		q.order = q.order[1:]
	case i > 0:
		q.order = slices.Delete(q.order, i, i+1)
	}
}

// removeLocked takes j out of the queue; q.mu is held.
func (q *Queue) removeLocked(j *Job) {
	delete(q.jobs, j.ID)
	q.dropLocked(j)
	q.leaveKeyLocked(j.Key)
	q.releaseHeldLocked()
}

// joinKeyLocked counts a job of key here; q.mu is held.
func (q *Queue) joinKeyLocked(key string) {
	k := q.keys[key]
	if k == nil {
		k = &keyLine{}
		q.keys[key] = k
	}
	k.jobs++
}

// leaveKeyLocked counts a job of key gone from here; the key's record
// (its pace) goes with its last job. q.mu is held.
func (q *Queue) leaveKeyLocked(key string) {
	if k := q.keys[key]; k.jobs > 1 {
		k.jobs--
		return
	}
	delete(q.keys, key)
}

// rekeyLocked gives j key; q.mu is held.
func (q *Queue) rekeyLocked(j *Job, key string) {
	q.leaveKeyLocked(j.Key)
	j.Key = key
	q.joinKeyLocked(key)
}

// blockedLocked reports whether a job of j's key ahead of it here (older,
// or fetched earlier) is deciding, or waits for a leased slot: j, given a
// slot, is Held until none is; q.mu is held.
func (q *Queue) blockedLocked(j *Job) bool {
	for _, o := range q.jobs {
		if o != j && (o.state == Deciding || o.state == Queued) && q.aheadLocked(o, j) {
			return true
		}
	}
	return false
}

// startLocked starts j with slot, or holds it while it is blocked; q.mu is
// held. It reports whether j works now.
func (q *Queue) startLocked(j *Job, slot Slot) bool {
	if q.blockedLocked(j) {
		j.state, j.heldSlot, j.held, q.mayHold = Held, slot, true, true
		return false
	}
	q.workLocked(j, slot)
	return true
}

// releaseHeldLocked starts the Held jobs no longer blocked, waking them;
// q.mu is held. Every change that can unblock one calls it.
func (q *Queue) releaseHeldLocked() {
	for again := q.mayHold; again; {
		again = false
		held := false
		for _, j := range q.order {
			if j.state != Held {
				continue
			}
			if !j.swapping && !q.blockedLocked(j) && !q.olderNotBegunLocked(j) {
				q.workLocked(j, j.heldSlot)
				j.notify(Granted)
				again = true // the order changed
				break
			}
			held = true
		}
		if !again && !held {
			q.mayHold = false
		}
	}
}

// SetKey sets job id's key to key, its key by the kind's partition as the
// ledger read it for its decision: a job's key is its args' by the limits
// its worker had at its fetch, and a change of the kind's partition since
// leaves it stale (jobs of different keys now held behind each other, or
// asked to swap slots the ledger will not move). Held jobs no longer
// blocked by it start.
func (q *Queue) SetKey(id int64, key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	j := q.jobs[id]
	if j == nil || j.Key == key {
		return
	}
	q.rekeyLocked(j, key)
	q.releaseHeldLocked()
}

// Rekey keys every job of the queue again by key (of its args; a job
// whose args are not known keeps its key), as its worker hears that the
// kind's partition changed: a job decided or granted under the kind's
// old partition (a kind-wide rate: no key) keeps the key it had then, and
// a job of its key now fetched since (older: a retry) would not hold it
// back at its begin. Held jobs no longer blocked start; a job given its
// slot and not begun is held at its begin behind an older one of its new
// key (Begin).
func (q *Queue) Rekey(key func(args []byte) string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	changed := false
	for _, j := range q.jobs {
		if j.args == nil {
			continue
		}
		if k := key(j.args); k != j.Key {
			q.rekeyLocked(j, k)
			changed = true
		}
	}
	if changed {
		q.releaseHeldLocked()
	}
}

// Get returns job id (nil: not in the queue).
func (q *Queue) Get(id int64) *Job {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.jobs[id]
}

// Work makes a Deciding job Working, holding slot (its decision: it runs),
// or Held while a job of its key ahead of it here decides or waits for a
// leased slot. It returns false when the job is not Deciding.
func (q *Queue) Work(id int64, slot Slot) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	j := q.jobs[id]
	if j == nil || j.state != Deciding {
		return false
	}
	q.startLocked(j, slot)
	q.releaseHeldLocked()
	q.serveLocked() // jobs behind it may take the spare leased slots now
	return true
}

// workLocked makes j Working with slot; q.mu is held.
func (q *Queue) workLocked(j *Job, slot Slot) {
	q.dropLocked(j)
	j.state, j.slot, j.early = Working, slot, false
	if slot == LeasedSlot {
		q.lease.InUse++
	}
}

// Begin is asked as a Working job is about to begin its work: it begins
// (true), or it is Held again (holding its slot, not a leased one; false:
// it waits for its wake): while an older job of its key fetched since it
// was given its slot is deciding here, so that the older job's decision
// may take the slot (SwapFor) rather than park behind it; and while an
// older job of its key here holds its slot and has not begun (on its way
// to River's executor), so that the two begin in their order.
func (q *Queue) Begin(id int64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	j := q.jobs[id]
	switch {
	case j == nil:
		return true
	case j.state != Working:
		return false // held back meanwhile (a swap took its slot): it waits
	}
	if !j.begun && j.slot != LeasedSlot && len(j.wake) == 0 && (q.blockedLocked(j) || q.olderNotBegunLocked(j)) {
		j.state, j.heldSlot, j.held, q.mayHold = Held, j.slot, true, true
		q.insertLocked(j)
		return false
	}
	j.begun = true
	q.keys[j.Key].noteBegin(time.Now())
	q.releaseHeldLocked() // a younger job of its key held for it begins now
	return true
}

// noteBegin records that a job of the key began here at now (its queue's
// mu is held).
func (k *keyLine) noteBegin(now time.Time) {
	k.begun = append(k.begun, now)
	if len(k.begun) > recentBegins {
		k.begun = slices.Delete(k.begun, 0, len(k.begun)-recentBegins)
	}
}

// StartsSoon reports whether job id, waiting in the line here (Lined),
// would start within window at the pace its line keeps here: fewer jobs
// of its key wait ahead of it here than began here within the last
// window. Its worker then waits on past its park-after rather than park
// it, which would only send it back to be fetched again behind the same
// line (P10: the jobs of a key under a per-key limit parked and were
// fetched again, each, once the line's pace fell below one park-after's
// worth of jobs waiting ahead).
func (q *Queue) StartsSoon(id int64, now time.Time, window time.Duration) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	j := q.jobs[id]
	if j == nil || j.state != Lined {
		return false
	}
	recent := 0
	for _, t := range q.keys[j.Key].begun {
		if t.After(now.Add(-window)) {
			recent++
		}
	}
	if recent == 0 {
		return false
	}
	ahead := 0
	for _, o := range q.order {
		if o.state == Lined && q.precedesLocked(o, j) {
			ahead++
		}
	}
	return ahead < recent
}

// olderNotBegunLocked reports whether an older job of j's key here holds
// its slot (Working, or Held) and has not begun; q.mu is held.
func (q *Queue) olderNotBegunLocked(j *Job) bool {
	for _, o := range q.jobs {
		if o != j && (o.state == Working || o.state == Held) && !o.begun && q.precedesLocked(o, j) {
			return true
		}
	}
	return false
}

// Undecide makes a Working job that has not begun, and holds no slot or a
// slot of the line, Deciding again, in its place in the line order: its
// kind's limits changed before it began (it was decided to run free and a
// limit came, or the kind became a circuit breaker). While a job of its
// key ahead of it decides (or waits to be decided) here, it is Held
// instead, with what it holds, as at Begin: the older job's decision may
// take its slot (a swap) rather than give its own back for a limit
// lowered below the slots the two hold (torture seed 601894557: of two
// jobs of a key holding slots as the key's limit went from 3 to 1, the
// older, deciding again, gave its slot back and parked, and the younger,
// deciding again after it, began). It returns false when the job is not
// Working, holds a leased slot, or is Held so.
func (q *Queue) Undecide(id int64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	j := q.jobs[id]
	if j == nil || j.state != Working || j.begun || j.slot == LeasedSlot {
		return false
	}
	if len(j.wake) == 0 && q.blockedLocked(j) {
		j.state, j.heldSlot, j.held, q.mayHold = Held, j.slot, true, true
		q.insertLocked(j)
		return false
	}
	j.state = Deciding
	q.insertLocked(j)
	return true
}

// ForgetEarly drops the grant that Deciding job id was given while it
// decided (Grant), when its decision gave back a grant the job held: the
// grant heard may be that one, and a job that started with it would start
// on what the ledger no longer holds for it (torture seed 797934157: a
// start granted and claimed, then taken back by a recheck under a new
// limit, and the job, decided to wait, began with it uncounted). A grant
// given after the decision is found by the grant watch's next look at the
// ledger.
func (q *Queue) ForgetEarly(id int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if j := q.jobs[id]; j != nil && j.state == Deciding {
		j.early = false
	}
}

// Line makes a Deciding job Lined (its decision: it waits in the line, held
// for reason; ahead: it came ahead of a free slot), and closes the leased
// path (Close). It returns false when the job is not Deciding, or was
// granted while deciding (it starts with that grant instead).
func (q *Queue) Line(id int64, ahead bool, reason string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	j := q.jobs[id]
	if j == nil || j.state != Deciding {
		return false
	}
	if j.early {
		// Granted while deciding: the grant came after its decision to wait
		// (the decision would have found one given before), so it is this
		// wait's: the job starts with it.
		j.early = false
		j.granted = !j.earlyClaimed
		j.heard = max(j.heard, j.earlyHeard)
		if q.startLocked(j, j.earlySlot) {
			j.notify(Granted)
		}
		q.serveLocked()
		return false
	}
	j.state, j.ahead, j.resumed, j.reason = Lined, j.ahead || ahead, j.resumed || ahead, reason
	// The line alone orders the kind's jobs in this worker now: the leased
	// path closes (its Queued jobs go to the ledger, its spare slots back).
	q.closeLocked()
	q.releaseHeldLocked()
	return true
}

// HeldBehind reports whether a job younger than job id, of its key, holds
// a slot of the line here it has not begun on (SwapFor would find one
// now).
func (q *Queue) HeldBehind(id int64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	x := q.jobs[id]
	if x == nil {
		return false
	}
	for _, o := range q.jobs {
		if q.swappableLocked(o, x) {
			return true
		}
	}
	return false
}

// swappableLocked reports whether o, a job of x's key that x precedes
// (precedesLocked), holds a slot of the line (or, under a rate alone, a
// start) it has not begun on (Held, or Working and not begun) that x may
// take (SwapFor); q.mu is held.
func (q *Queue) swappableLocked(o, x *Job) bool {
	if o == x || o.swapping || !q.precedesLocked(x, o) {
		return false
	}
	// A Working job with a wake not read yet (a grant, just given) has not
	// begun either: a wake sent next replaces the one not read (notify).
	// One that holds no slot may hold a start (under a rate alone): the
	// ledger moves it if it does.
	return (o.state == Held && o.heldSlot != LeasedSlot) || (o.state == Working && !o.begun && o.slot != LeasedSlot)
}

// SwapFor is asked before a Deciding job is put in the line (its decision:
// it waits): it returns the youngest job of its key here, younger than it,
// that holds a slot of the line (or a start) it has not begun on (Held, or
// Working and not begun: it is Held from now), which is to give that to it
// (Swapped), so that no job starts while an older one of its key waits in
// the line; nil when there is none, or the job is not Deciding, or a grant
// crossed its decision. The job returned stays Held until Swapped.
func (q *Queue) SwapFor(id int64) *Job {
	q.mu.Lock()
	defer q.mu.Unlock()
	x := q.jobs[id]
	if x == nil || x.state != Deciding || x.early {
		return nil
	}
	var y *Job
	for _, o := range q.jobs {
		if q.swappableLocked(o, x) && (y == nil || q.laterLocked(o, y)) {
			y = o // the last in the order its key starts in: the youngest
		}
	}
	if y == nil {
		return nil
	}
	if y.state == Working {
		y.state, y.heldSlot, y.held, q.mayHold = Held, y.slot, true, true
		q.insertLocked(y)
	}
	y.swapping = true
	return y
}

// Swapped ends a swap that SwapFor began between job to (Deciding, to wait
// in the line, held for reason; ahead: it came ahead of a free slot) and
// from (Held): when the ledger moved the slot (moved), to works with it
// (or is Held while a job of its key ahead of it decides) and from waits
// in the line in its place without a deadline (as a job resumed ahead),
// woken (Relined); when from gave the slot back (gaveBack: an older job of
// the line waits elsewhere), from waits so and to is put in the line (as
// Line); else to is put in the line and from is Held as before. It reports
// whether to was put in the line and the leased path closed (as Line).
func (q *Queue) Swapped(to, from int64, moved, gaveBack, ahead bool, reason string) (lined bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	x, y := q.jobs[to], q.jobs[from]
	if y != nil {
		y.swapping = false
		if gaveBack && y.state == Held {
			y.state, y.heldSlot, y.reason, y.granted, y.ahead, y.resumed = Lined, NoSlot, reason, false, true, false
			y.notify(Relined)
		}
	}
	switch {
	case moved && x != nil && y != nil:
		x.granted = true
		q.startLocked(x, y.heldSlot) // a slot of the line, or none (a start)
		// It waits as a job resumed ahead does, as long as it takes: it is
		// next of its key once the older one is through, and parking it
		// would undo the grant or resume that brought it here.
		y.state, y.heldSlot, y.reason, y.granted, y.ahead, y.resumed = Lined, NoSlot, reason, false, true, false
		y.notify(Relined)
	case x != nil && x.state == Deciding && !x.early:
		x.state, x.ahead, x.resumed, x.reason = Lined, x.ahead || ahead, x.resumed || ahead, reason
		q.closeLocked()
		lined = true
	}
	q.releaseHeldLocked()
	q.serveLocked()
	return lined
}

// Forget takes a job out of the queue (it parked, failed, or ran without
// a limit); a Working job's slot is its release's.
func (q *Queue) Forget(id int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.forgetLocked(id)
}

// forgetLocked takes job id out of the queue, if it is there.
func (q *Queue) forgetLocked(id int64) {
	if j := q.jobs[id]; j != nil {
		q.removeLocked(j)
		q.serveLocked()
	}
}

// Park takes a job that parked out of the queue, as Forget does, and
// remembers it until every view that may be used was read after now
// (ViewFresh): no slot is handed over in memory past it (GiveLine,
// GiveLeased) nor taken past it (TakeLeased, and the spare leased slots
// served as it leaves the queue) on a view that does not show it parked.
func (q *Queue) Park(id int64, now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.parked == nil {
		q.parked = map[int64]time.Time{}
	}
	q.forgetParkedLocked(now)
	// Remembered before it leaves: leaving serves the spare leased slots
	// to the jobs behind it.
	q.parked[id] = now
	q.forgetLocked(id)
}

// forgetParkedLocked forgets the jobs parked here more than ViewFresh
// before now: every view that may be used was read after them.
func (q *Queue) forgetParkedLocked(now time.Time) {
	for p, at := range q.parked {
		if now.Sub(at) > ViewFresh {
			delete(q.parked, p)
		}
	}
}

// parkedBeforeLocked reports whether a job older than id parked here after
// the view was read.
func (q *Queue) parkedBeforeLocked(id int64, now time.Time) bool {
	q.forgetParkedLocked(now)
	for p, at := range q.parked {
		if p < id && !at.Before(q.lease.view.At) {
			return true
		}
	}
	return false
}

// Leave ends the wait of a Queued or Lined job that the job ended itself
// (its park-after time, its context): it is Deciding again. It returns
// false when it no longer waits (a grant or a hand-over took it meanwhile:
// that outcome, on its Wake, stands).
func (q *Queue) Leave(id int64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	j := q.jobs[id]
	if j == nil || (j.state != Queued && j.state != Lined) {
		return false
	}
	j.state = Deciding
	return true
}

// Grant ends the wait of a Lined job with a grant of the ledger: it works,
// holding slot, or is Held while a job of its key ahead of it here
// decides. It returns false when the job is not Lined: one Deciding (its
// wait ended meanwhile, or its decision to wait is not applied yet) keeps
// the grant: a decision to wait lets it start with it (Line), any other
// finds it in the ledger. startClaimed: a start reserved with the grant
// was logged already (Granted is false: nothing is left to claim). heard:
// the grant was made under the limits that every change of them the
// limiter heard up to that count left (Restamp; 0: not known).
func (q *Queue) Grant(id int64, slot Slot, startClaimed bool, heard uint64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	j := q.jobs[id]
	if j != nil && j.state == Deciding {
		j.early, j.earlySlot, j.earlyClaimed, j.earlyHeard = true, slot, startClaimed, heard
	}
	if j == nil || j.state != Lined {
		return false
	}
	j.granted = !startClaimed
	j.heard = max(j.heard, heard)
	if q.startLocked(j, slot) {
		j.notify(Granted)
	}
	q.serveLocked()
	return true
}

// Redecide ends the wait of a Queued or Lined job: it goes to the ledger
// to be decided again (its place went, or the leased path closed). It
// returns false when it no longer waits.
func (q *Queue) Redecide(id int64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	j := q.jobs[id]
	if j == nil || (j.state != Queued && j.state != Lined) {
		return false
	}
	j.state = Deciding
	j.notify(Redecide)
	return true
}

// EndAhead ends the wait without a deadline of Lined job id, which came
// ahead of a free slot (as the ledger decided it: not a job that gave its
// slot to an older one in a swap, which waits on) and that the line no
// longer holds as ahead (a change set a rate): it stays in the line, and
// its wait is woken (Rewait) to wait again as any job does, to its
// deadline. It returns false when the job is not Lined ahead so.
func (q *Queue) EndAhead(id int64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	j := q.jobs[id]
	if j == nil || j.state != Lined || !j.resumed {
		return false
	}
	j.ahead, j.resumed = false, false
	j.notify(Rewait)
	return true
}

// End takes a Working job out of the queue and returns the slot it held:
// its release's, or its hand-over's (GiveLeased, GiveLine).
func (q *Queue) End(id int64) Slot {
	q.mu.Lock()
	defer q.mu.Unlock()
	j := q.jobs[id]
	if j == nil || j.state != Working {
		return NoSlot
	}
	q.removeLocked(j)
	if j.slot == LeasedSlot {
		q.lease.InUse--
	}
	return j.slot
}

// frontLocked returns the first job of the line order if it is in state
// (nil otherwise: a job waiting otherwise, or deciding, goes first); q.mu
// is held.
func (q *Queue) frontLocked(state State) *Job {
	if len(q.order) == 0 || q.order[0].state != state {
		return nil
	}
	return q.order[0]
}

// Front returns the job that a slot of this worker would go to next in
// state (Queued: a leased slot; Lined: a slot handed over): the first of
// the line order, if it waits so (nil otherwise: a job deciding, or
// waiting the other way, goes before every other).
func (q *Queue) Front(state State) *Job {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.frontLocked(state)
}

// Waiting counts the jobs Queued or Lined, and Lined.
func (q *Queue) Waiting() (queued, lined int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, j := range q.order {
		switch j.state {
		case Queued:
			queued++
		case Lined:
			lined++
		}
	}
	return queued, lined
}

// Unplaced are the jobs neither working nor waiting in the line, in line
// order: those Queued for a leased slot, and those Deciding (fetched, or on
// their way to the line after their wait for a leased slot ended). The
// other workers' younger jobs let them go first: a job is not forgotten
// between its leased wait and its place in the line.
func (q *Queue) Unplaced() []*Job {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []*Job
	for _, j := range q.order {
		if j.state == Queued || j.state == Deciding {
			out = append(out, j)
		}
	}
	return out
}

// Lined are the jobs Lined, in line order.
func (q *Queue) Lined() []*Job { return q.inState(Lined) }

func (q *Queue) inState(s State) []*Job {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []*Job
	for _, j := range q.order {
		if j.state == s {
			out = append(out, j)
		}
	}
	return out
}

// Len is how many jobs the queue holds, in every state.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.jobs)
}
