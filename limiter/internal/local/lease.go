package local

import "time"

// Leased-path bounds.
const (
	// FetchTolerance is how much earlier another worker's job must have
	// been fetched for this worker's younger jobs to let it go first: a
	// freed leased slot goes back (the other worker leases it) rather than
	// to a job fetched after it.
	FetchTolerance = 50 * time.Millisecond
	// ViewFresh is how old the keeper's view of a kind may be for a slot to
	// be handed over in memory.
	ViewFresh = 50 * time.Millisecond
	// TakeFresh is how old it may be for a job to take a spare leased slot
	// as it is fetched: shorter than FetchTolerance by the time a fetch
	// elsewhere may take to commit, for a view read a moment after another
	// worker's fetch began does not show that fetch's jobs until it commits
	// (torture seeds 395970335 and 395970370: a job fetched 50.0 and 54.5 ms
	// after an older one elsewhere took a leased slot ahead of it, when this
	// was ViewFresh). A job handed a slot in memory waited in the line or
	// for a leased slot first: the jobs fetched before it have committed.
	TakeFresh = 30 * time.Millisecond
	// LineFetchTolerance is how much later than a job waiting in another
	// worker's line a job of this worker may have been fetched and still be
	// handed a freed slot of the line in memory ahead of it (GiveLine):
	// FetchTolerance, less a margin for the times compared, which are
	// attempted_at, the start of each fetch's transaction, while the order
	// is that of the fetches' statements (the parking pick runs before
	// River's, in the same transaction).
	LineFetchTolerance = FetchTolerance - 10*time.Millisecond
)

// View is a leased kind as the worker's keeper last read it.
type View struct {
	// At is when it was read.
	At time.Time
	// Limit is the kind's per-kind limit; Admitted its slots taken.
	Limit, Admitted int32
	// OffPath: jobs of the kind's line wait, slots are reserved for
	// resumed jobs, or it has a per-key or rate limit: the leased path is
	// closed.
	OffPath bool
	// Keyed: it has a per-key or rate limit: no slot of the line is handed
	// over in memory.
	Keyed bool
	// Others is how many other workers hold slots of the kind or want some.
	Others int32
	// OldestOther is when the oldest job waiting in another worker for a
	// leased slot, or fetched there and not decided yet, was fetched
	// (zero: none).
	OldestOther time.Time
	// OldestParked, OldestReserved and OldestResumed are the kind's oldest
	// parked job, its oldest job granted a slot not claimed yet and its
	// oldest job resumed ahead and not fetched yet (0: none): no younger
	// job is handed a slot in memory ahead of them.
	OldestParked, OldestReserved, OldestResumed int64
	// OldestOtherLine is when the oldest job of the kind's line in another
	// worker was fetched (zero: none): no job fetched more than
	// LineFetchTolerance after it is handed a slot in memory ahead of it.
	OldestOtherLine time.Time
	// Heard is the count of limit changes the worker had heard when the
	// keeper began to read it (Queue.Heard).
	Heard uint64
}

// fresh reports whether v was read within within of now (ViewFresh,
// TakeFresh), and after the last change of limits the worker heard
// (heard).
func (v View) fresh(now time.Time, heard uint64, within time.Duration) bool {
	return !v.At.IsZero() && now.Sub(v.At) <= within && v.Heard >= heard
}

// overLimit reports whether the kind's slots taken exceed its limit (it was
// lowered): no spare slot is used; they drain as jobs end.
func (v View) overLimit() bool { return v.Admitted > v.Limit }

// Lease is the worker's leased slots of a kind.
type Lease struct {
	// Leased is the slots the worker holds, as it believes the database
	// counts them; InUse those its working jobs use; ToReturn those given
	// up, for the keeper to give back.
	Leased, InUse, ToReturn int
	// minSpare is the fewest leased slots left unused at any moment since
	// windowAt: slots not needed for a whole linger go back.
	minSpare int
	windowAt time.Time
	// heard is the count of limit changes the worker has heard (Heard): a
	// view read before the last is not fresh.
	heard uint64
	view  View
}

// usable is how many leased slots the worker may use: no more than the
// kind's limit (lowered, maybe, since they were leased), and none beyond
// those in use while the kind's slots taken exceed it.
func (l *Lease) usable() int {
	if l.view.overLimit() {
		return min(l.Leased, l.InUse)
	}
	return min(l.Leased, max(int(l.view.Limit), 0))
}

// share is the worker's fair share of the limit while others hold or want
// slots of the kind: the limit over the workers, rounded up, at least one.
func (l *Lease) share() int {
	workers := int(l.view.Others) + 1
	return max((int(l.view.Limit)+workers-1)/workers, 1)
}

// overShare reports whether the worker holds more slots than its share.
func (l *Lease) overShare() bool {
	if l.view.Others == 0 {
		return l.Leased > int(l.view.Limit)
	}
	return l.Leased > l.share()
}

// first reports whether a job of this worker fetched at fetched was
// fetched before every job waiting in another worker for a leased slot:
// the kind's slots go to it first, beyond the worker's share (the share
// only splits the limit between workers whose waiting jobs are as old).
func (l *Lease) first(fetched time.Time) bool {
	return l.view.OldestOther.IsZero() || fetched.Before(l.view.OldestOther)
}

// owed is how many of the worker's spare leased slots are owed to jobs
// waiting in other workers, with front the job Queued at the front of
// the worker's queue (nil: none): every spare one while front may not take
// them (letsGo: a job fetched more than FetchTolerance before it waits
// elsewhere), and those above the worker's share while it holds more than
// its share and front was not fetched first. GiveLeased gives a freed slot
// back by it, and Returning the spare ones at once: held spare for a
// younger job here, they would keep the older jobs elsewhere waiting
// until one side parks.
func (l *Lease) owed(front *Job) int {
	spare := l.Leased - l.InUse
	switch {
	case spare <= 0:
		return 0
	case front != nil && !l.letsGo(front.Fetched):
		return spare
	case l.overShare() && (front == nil || !l.first(front.Fetched)):
		return min(spare, l.Leased-l.share())
	}
	return 0
}

// noticeSpare records the spare leased slots now (for the linger).
func (l *Lease) noticeSpare() { l.minSpare = min(l.minSpare, l.Leased-l.InUse) }

// letsGo reports whether a job of this worker fetched at fetched may take
// a leased slot ahead of the jobs waiting in other workers: none of them
// was fetched more than FetchTolerance before it.
func (l *Lease) letsGo(fetched time.Time) bool {
	return l.view.OldestOther.IsZero() || !fetched.After(l.view.OldestOther.Add(FetchTolerance))
}

// Heard is told that the worker heard a change of limits (gen: its count
// of them since it started): the keeper's view, read before it, is not
// fresh any more, so no slot is handed over in memory by it (GiveLine,
// GiveLeased) nor taken at once (TakeLeased) until the keeper reads the
// kind again.
func (q *Queue) Heard(gen uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.lease.heard = max(q.lease.heard, gen)
}

// SetView stores a view of the kind (the keeper's, or one read at a
// fetch), unless the one it holds was read later. When the leased path
// closed, the jobs Queued for a leased slot go to the ledger (Redecide),
// and the spare slots are given up; it returns the jobs sent.
func (q *Queue) SetView(v View) []int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	if v.At.Before(q.lease.view.At) {
		return nil // a read that began before the one held
	}
	q.lease.view = v
	if !v.OffPath {
		q.serveLocked()
		return nil
	}
	return q.closeLocked()
}

// Close closes the leased path of the kind in this worker (a job of it
// waits in the line here: the line alone orders its jobs): the Queued jobs
// go to the ledger and the spare slots are given up. It returns the jobs
// sent.
func (q *Queue) Close() []int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.closeLocked()
}

func (q *Queue) closeLocked() []int64 {
	var sent []int64
	for _, j := range q.order {
		if j.state == Queued {
			j.state = Deciding
			j.notify(Redecide)
			sent = append(sent, j.ID)
		}
	}
	if spare := q.lease.Leased - q.lease.InUse; spare > 0 {
		q.lease.Leased -= spare
		q.lease.ToReturn += spare
		q.lease.minSpare = 0
	}
	return sent
}

// openLocked reports whether the leased path of the kind is open in this
// worker as far as it knows: its keeper saw it open (or has not looked
// yet: fast is the limits' copy's word), and no job of the kind waits in
// the line here; q.mu is held.
func (q *Queue) openLocked(fast bool) bool {
	if !q.lease.view.At.IsZero() {
		fast = !q.lease.view.OffPath
	}
	if !fast {
		return false
	}
	for _, j := range q.order {
		if j.state == Lined {
			return false
		}
	}
	return true
}

// NoteLeasedMarks records jobs of the queue (in it already) whose fetch
// marked them as waiting for a leased slot: the keeper's next publication
// of what waits takes the marks away (TakeLeasedMarks).
func (q *Queue) NoteLeasedMarks(ids []int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.leasedMarks = append(q.leasedMarks, ids...)
}

// TakeLeasedMarks returns the jobs NoteLeasedMarks recorded, and forgets
// them.
func (q *Queue) TakeLeasedMarks() []int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.leasedMarks
	q.leasedMarks = nil
	return out
}

// HasLeasedMarks reports whether NoteLeasedMarks recorded jobs not taken
// yet.
func (q *Queue) HasLeasedMarks() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.leasedMarks) > 0
}

// LeasedPathOpen reports whether the leased path of the kind is open in
// this worker as far as it knows (see TakeLeased): the fetch marks its
// first attempts as waiting for a leased slot.
func (q *Queue) LeasedPathOpen() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.openLocked(true)
}

// TakeLeased decides Deciding job id on the leased path: it works on a
// leased slot now if one is spare and no job goes before it (here, or,
// fetched earlier, in another worker), or it is Queued for one. It returns
// false, leaving it Deciding, when the leased path is closed here (a job of
// the kind waits in the line here, or the keeper saw the path off: the
// line decides it); fast is the limits' copy's word on the path while the
// keeper has not looked yet, limit the limit it says.
func (q *Queue) TakeLeased(id int64, fast bool, limit int32, now time.Time) (works, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	j := q.jobs[id]
	if j == nil || j.state != Deciding || !q.openLocked(fast) {
		return false, false
	}
	if q.lease.view.At.IsZero() {
		q.lease.view.Limit = limit
	}
	first := len(q.order) > 0 && q.order[0] == j // working jobs are out of the order
	// It takes a slot at once only on a fresh view of the kind (of the
	// jobs waiting in other workers, of its line) read after every job
	// older than it that parked here: else the keeper serves it once it
	// read one.
	known := q.lease.view.fresh(now, q.lease.heard, TakeFresh) && !q.parkedBeforeLocked(j.ID, now)
	if first && known && q.lease.InUse < q.lease.usable() && q.lease.letsGo(j.Fetched) {
		q.workLocked(j, LeasedSlot)
		q.serveLocked()
		q.releaseHeldLocked()
		q.lease.noticeSpare()
		return true, true
	}
	j.state = Queued
	q.releaseHeldLocked()
	return false, true
}

// GiveLeased gives a leased slot that freed (a job that ended on one) at
// now to the job at the front of the queue Queued for one, if the leased
// path is open (in this worker too: no job of the kind waits in the line
// here), the worker keeps within its share and the kind's limit, and no
// job fetched earlier waits in another worker; else the slot is given up
// (the keeper gives it back, for the line or another worker). It is
// handed only on a view younger than TakeFresh, as a job takes a spare
// one at its fetch: an older view may not show a job fetched elsewhere
// before the front one (torture seed 836093454: a job fetched 51 ms after
// an older one elsewhere was handed a slot ahead of it); on an older view
// the slot stays spare, and the keeper's next look serves it. It returns
// the job that got it (nil: none).
func (q *Queue) GiveLeased(now time.Time) *Job {
	q.mu.Lock()
	defer q.mu.Unlock()
	l := &q.lease
	switch {
	case l.InUse >= l.Leased:
		return nil // the slot was lost (the lease expired, or the limit went)
	case l.view.OffPath || l.view.overLimit() || !q.openLocked(true):
		// The path is closed (here: a job of the kind waits in the line,
		// which the database counts the slot against), or the limit was
		// lowered: the slot goes back, for the line's grant round.
		l.Leased--
		l.ToReturn++
		return nil
	case !l.view.fresh(now, l.heard, TakeFresh):
		return nil // read too long ago, or before a change heard since: the keeper serves the slot once it looked again
	}
	j := q.frontLocked(Queued)
	if l.owed(j) > 0 {
		l.Leased--
		l.ToReturn++
		return nil
	}
	if j == nil || l.InUse >= l.usable() || q.parkedBeforeLocked(j.ID, now) {
		return nil // (an older job parked here since the view was read: the keeper serves it once it looked again)
	}
	q.workLocked(j, LeasedSlot)
	j.notify(Granted)
	q.releaseHeldLocked()
	return j
}

// GiveLine hands a slot of the line that freed (a job of the worker that
// ended on one, under a per-kind limit alone) to the job at the front of
// the queue Lined, in memory, when the keeper's view, younger than
// TakeFresh (a job fetched elsewhere shows once its fetch commits), shows
// the limit positive and not exceeded and, ahead of the job:
//   - no older job parked (or parked here since the view), granted and on
//     its way, or resumed and not fetched; the view names only the oldest
//     of each, so none is passed whatever became of it since, for others
//     may wait behind it (TestNoHandOverPastAParkedJobTheViewDoesNotName);
//   - no job waiting in another worker's line fetched more than
//     LineFetchTolerance before it: the order of a per-kind limit is fetch
//     order, not job id (P12: two workers handed every slot over through
//     the ledger, ~13 ms a turn, for the other's front job was a few ids
//     older).
//
// The move is the caller's to write: handed is called with the job and its
// key before the job is told (under the queue's lock), so that the move is
// queued before anything the job does with the slot: a move written after
// the release of the job it went to leaves that ended job holding the
// slot's row (P15 stalled with 8 slots held by completed jobs). It returns
// the job that got the slot (nil: none: the slot is released).
func (q *Queue) GiveLine(now time.Time, handed func(id int64, key string)) *Job {
	q.mu.Lock()
	defer q.mu.Unlock()
	v := q.lease.view
	if !v.fresh(now, q.lease.heard, TakeFresh) || v.Keyed || v.Limit <= 0 || v.overLimit() {
		return nil
	}
	j := q.frontLocked(Lined)
	if j == nil {
		return nil
	}
	for _, older := range []int64{v.OldestParked, v.OldestReserved, v.OldestResumed} {
		if older != 0 && older < j.ID {
			return nil
		}
	}
	if !v.OldestOtherLine.IsZero() && j.Fetched.After(v.OldestOtherLine.Add(LineFetchTolerance)) {
		return nil // a job fetched well before it waits in another worker
	}
	if q.parkedBeforeLocked(j.ID, now) {
		return nil // an older job parked here since the view was read
	}
	q.workLocked(j, LineSlot)
	handed(j.ID, j.Key)
	j.notify(Granted)
	return j
}

// Want is how many more leased slots the worker asks for: those its Queued
// jobs lack, within the limit, and within its share unless its front job
// was fetched before every job waiting in another worker; one when it
// holds none and wants some (so that the others see it wants); none while
// its front job may not take a slot (letsGo: older jobs wait elsewhere,
// and what it leased would be owed to them).
func (q *Queue) Want() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	l := &q.lease
	queued := 0
	var front *Job
	for _, j := range q.order {
		if j.state == Queued {
			queued++
			if front == nil {
				front = j
			}
		}
	}
	if l.view.OffPath || queued == 0 || !l.letsGo(front.Fetched) {
		return 0 // none, or older jobs wait in other workers: theirs first
	}
	want := queued - (l.Leased - l.InUse)
	if l.view.Others > 0 && !l.first(front.Fetched) {
		want = min(want, max(l.share()-l.Leased, 0))
	}
	want = min(want, int(l.view.Limit))
	if want <= 0 && l.Leased == 0 {
		want = 1
	}
	return want
}

// Leased adds n slots leased, and gives them to the Queued jobs, in order.
// It returns the jobs that got one.
func (q *Queue) Leased(n int) []*Job {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.lease.Leased += n
	out := q.serveLocked()
	q.lease.noticeSpare()
	return out
}

// serveLocked gives the spare leased slots to the jobs at the front of the
// queue Queued for one, in order, while the lease lets them go; q.mu is
// held. Every change that can leave a slot spare with a job Queued at the
// front (slots leased, a job ahead decided or gone, a new view) calls it.
func (q *Queue) serveLocked() []*Job {
	l := &q.lease
	var out []*Job
	now := time.Now()
	for l.InUse < l.usable() {
		j := q.frontLocked(Queued)
		if j == nil || !l.letsGo(j.Fetched) || q.parkedBeforeLocked(j.ID, now) {
			break // (an older job parked here since the view was read: its next read closes the path)
		}
		q.workLocked(j, LeasedSlot)
		j.notify(Granted)
		out = append(out, j)
	}
	if len(out) > 0 {
		q.releaseHeldLocked()
	}
	return out
}

// Returning takes the slots to give back: those given up, those spare for a
// whole linger (or, stopping, every spare one), those owed to jobs waiting
// in other workers (owed), and those above the limit.
func (q *Queue) Returning(now time.Time, linger time.Duration, stopping bool) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	l := &q.lease
	ret := l.ToReturn
	l.ToReturn = 0
	if stopping || now.Sub(l.windowAt) >= linger {
		idle := min(l.minSpare, l.Leased-l.InUse)
		if stopping {
			idle = l.Leased - l.InUse
		}
		queued := false
		for _, j := range q.order {
			queued = queued || j.state == Queued
		}
		if idle > 0 && !queued {
			ret += idle
			l.Leased -= idle
		}
		l.minSpare, l.windowAt = l.Leased-l.InUse, now
	}
	if owed := l.owed(q.frontLocked(Queued)); owed > 0 {
		ret += owed
		l.Leased -= owed
		l.minSpare = min(l.minSpare, l.Leased-l.InUse)
	}
	over := l.Leased - max(l.InUse, int(l.view.Limit))
	if l.view.overLimit() {
		over = l.Leased - l.InUse
	}
	if over > 0 {
		ret += over
		l.Leased -= over
	}
	return ret
}

// Unreturned puts back slots the keeper failed to give back (it tries
// again after a renewal says what the database counts).
func (q *Queue) Unreturned(n int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.lease.ToReturn += n
}

// Reconcile makes the worker's count of its leased slots (held and to give
// back) agree with held, what the database counts for it, and returns the
// difference it found (> 0: slots lost, not used any more; < 0: slots the
// database counts and the worker does not hold, to give back).
func (q *Queue) Reconcile(held int) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	l := &q.lease
	diff := l.Leased + l.ToReturn - held
	switch {
	case diff > 0:
		fromReturn := min(diff, l.ToReturn)
		l.ToReturn -= fromReturn
		l.Leased -= diff - fromReturn
		l.minSpare = 0
	case diff < 0:
		l.ToReturn -= diff
	}
	return diff
}

// Lost drops every leased slot (the kind's limit row went, and its leases
// with it) and sends the Queued jobs to the ledger; it returns them.
func (q *Queue) Lost() []int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.lease.Leased, q.lease.ToReturn = 0, 0
	q.lease.view = View{}
	var sent []int64
	for _, j := range q.order {
		if j.state == Queued {
			j.state = Deciding
			j.notify(Redecide)
			sent = append(sent, j.ID)
		}
	}
	return sent
}

// Shared reports whether the worker holds leased slots of the kind that
// other workers hold or want slots of too (its keeper looks often then:
// their waiting jobs go first).
func (q *Queue) Shared() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.lease.Leased > 0 && q.lease.view.Others > 0
}

// LeaseState is the lease's counts, for the keeper.
func (q *Queue) LeaseState() (leased, inUse, toReturn int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.lease.Leased, q.lease.InUse, q.lease.ToReturn
}

// Idle reports whether the queue holds nothing: no job, no leased slot,
// none to give back.
func (q *Queue) Idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.jobs) == 0 && q.lease.Leased == 0 && q.lease.ToReturn == 0
}
