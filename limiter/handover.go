package limiter

import (
	"sync"
	"time"

	"github.com/riverqueue/river/rivertype"

	"github.com/sluice-dev/sluice/db"
)

// handOverFresh is how old the line poller's reading of a kind may be for a
// worker to hand a freed slot over in memory: older (no job of the kind
// waited here lately), the slot goes back to the line's grant round.
const handOverFresh = 50 * time.Millisecond

// handOverState is what the line poller last read of a kind with jobs
// waiting in this worker (HandOverStates).
type handOverState struct {
	limit, admitted int32
	keyed           bool
	oldestParked    int64 // 0: none
	otherWorkers    int32 // other workers with jobs of the kind waiting in them
	at              time.Time
}

// handOvers holds the poller's readings, per kind, and the slots of each
// kind this worker's jobs hold through the line.
type handOvers struct {
	mu     sync.Mutex
	states map[string]handOverState
	held   map[string]int
}

// hold counts a slot of kind taken (n 1) or given up (n -1) by a job of
// this worker.
func (h *handOvers) hold(kind string, n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held == nil {
		h.held = map[string]int{}
	}
	h.held[kind] += n
	if h.held[kind] <= 0 {
		delete(h.held, kind)
	}
}

// overShare reports whether this worker holds more slots of kind than its
// share of st's limit while jobs of the kind wait in other workers: the
// share is the limit over the workers with jobs waiting (this one too),
// rounded up, as leased slots are shared (lease.go).
func (h *handOvers) overShare(kind string, st handOverState) bool {
	if st.otherWorkers == 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	workers := st.otherWorkers + 1
	share := (st.limit + workers - 1) / workers
	// The slot to hand over is no longer counted (endSlot): handed over,
	// it would make one more.
	return int32(h.held[kind])+1 > share
}

// set stores the readings of rows, read at at.
func (h *handOvers) set(rows []*db.HandOverStatesRow, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.states == nil {
		h.states = map[string]handOverState{}
	}
	for _, r := range rows {
		h.states[r.Kind] = handOverState{limit: r.MaxConcurrency, admitted: r.Admitted, keyed: r.Keyed, oldestParked: r.OldestParked,
			otherWorkers: r.OtherWorkers, at: at}
	}
}

// keyedLately reports whether the last reading of kind, within
// LimitCacheTTL, found it keyed: no slot of it is handed over in memory,
// and the poller need not read it again so soon.
func (h *handOvers) keyedLately(kind string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.states[kind]
	return ok && s.keyed && time.Since(s.at) <= LimitCacheTTL
}

// get returns the reading of kind, if fresh.
func (h *handOvers) get(kind string) (handOverState, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.states[kind]
	return s, ok && time.Since(s.at) <= handOverFresh
}

// handOver gives the slot of job, which just ended, to the oldest job of
// its kind waiting in this worker, in memory, as leased slots are handed
// on: the waiting job starts at once, and the move is written after
// (release.go, HandOverSlots), the kind's count unchanged. Only under a
// per-kind limit alone (a per-key or rate limit decides every start in the
// line, strictly in order), while the limit is positive and not exceeded
// (it was not lowered), and to a job older than every parked job of the
// kind (a parked job goes first, as the line poller read them within
// handOverFresh), than every job waiting here for a leased slot, and than
// every job decided at its fetch to wait here that has not reached the
// middleware yet; and not while this worker holds more than its share of
// the limit and jobs of the kind wait in other workers (the slot goes to
// the line, whose front may be there). It returns the job handed the
// slot (nil: none; the slot is released).
func (l *Limiter) handOver(job *rivertype.JobRow) *admitRequest {
	if l.isStopped() {
		return nil
	}
	st, ok := l.handStates.get(job.Kind)
	if !ok || st.keyed || st.limit <= 0 || st.admitted > st.limit || l.handStates.overShare(job.Kind, st) {
		return nil
	}
	before := st.oldestParked
	if w := l.leases.oldestWaiting(job.Kind); w != 0 && (before == 0 || w < before) {
		// An older job waits here for a leased slot, on its way to the
		// line: no younger job takes the slot ahead of it.
		before = w
	}
	if d := l.decided.oldestWaiting(job.Kind); d != 0 && (before == 0 || d < before) {
		// An older job decided at its fetch to wait here has not reached
		// the middleware yet (its goroutine starts late on a loaded
		// machine): the slot goes to the line, which knows it.
		before = d
	}
	to := l.waits.takeOldest(job.Kind, before)
	if to != nil {
		l.TestSignals.HandedOver.Signal(to.job.ID)
	}
	return to
}

// handOverChain follows the hand-overs of one release batch: a job handed
// a slot may itself end, and hand it on, before the first move is written.
type handOverChain struct {
	holder   map[int64]int64 // origin (the job whose slot row it is) → the job holding it now
	originOf map[int64]int64 // holder → origin
	ended    []int64         // holders that ended within the batch: they leave the waiters
}

// add records that from handed its slot to to.
func (c *handOverChain) add(from, to int64) {
	if c.holder == nil {
		c.holder, c.originOf = map[int64]int64{}, map[int64]int64{}
	}
	origin := from
	if o, ok := c.originOf[from]; ok {
		origin = o
		delete(c.originOf, from)
		c.ended = append(c.ended, from)
	}
	c.holder[origin] = to
	c.originOf[to] = origin
}

// release returns the job whose slot row a release of id frees: id's
// origin when id holds a slot handed over in this batch, else id; handed
// reports the former (id then leaves the waiters).
func (c *handOverChain) release(id int64) (slotOf int64, handed bool) {
	o, ok := c.originOf[id]
	if !ok {
		return id, false
	}
	delete(c.originOf, id)
	delete(c.holder, o)
	return o, true
}
