package limiter

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/db"
)

// Slot lease constants.
const (
	// DefaultParkAfter is how long a job of a limited kind waits in its
	// worker for a slot (one of the worker's leased slots freeing, or a new
	// lease) before it parks.
	DefaultParkAfter = time.Second
	// LeasePoll is how often a worker that holds slots of a kind, or has
	// jobs waiting for one, reads the kind's state (parked jobs, reserved
	// slots, other workers wanting slots) and asks for the slots it lacks.
	LeasePoll = 5 * time.Millisecond
	// LeaseLinger is how long a worker keeps leased slots that none of its
	// jobs uses before it gives them back.
	LeaseLinger = 50 * time.Millisecond
	// LeaseRenew is how often a worker marks the leases it holds alive, and
	// checks that the database still counts them (a lease that expired, or
	// whose limit was removed, is not used any more).
	LeaseRenew = time.Second
	// LeaseIdlePoll is how often a worker holding slots of a kind, but with
	// no job waiting for one, reads the kind's state.
	LeaseIdlePoll = 50 * time.Millisecond
	// LeaseTTL is how long a lease may go unrenewed before
	// concurrency_limit.resume frees it, when its holder is not a live
	// worker (a live worker's leases are the reaper's, once it is dead).
	LeaseTTL = 15 * time.Second
	// leaseWantedWindow is how long a worker that asked for more slots than
	// it got counts as wanting: the other holders keep to a fair share.
	leaseWantedWindow = 50 * time.Millisecond
	// leasePublish is how often, at most, a keeper writes the jobs waiting
	// for its kind's leased slots to its lease row (sluice.waiting_jobs):
	// at once when none waits any more.
	leasePublish = 20 * time.Millisecond
)

// leaser is a worker's side of slot leases: per limited kind, the slots it
// holds, how many its jobs use, and its jobs waiting for one (oldest job
// first). A slot freed by one job goes to the next waiting job of the kind
// in memory; a keeper goroutine per active kind talks to the database every
// LeasePoll: it leases what the waiting jobs lack, gives back what is idle
// or over the worker's fair share, and watches for parked jobs and reserved
// slots, which switch the kind to the per-job path (FIFO behind the parked
// jobs).
type leaser struct {
	l         *Limiter
	parkAfter time.Duration

	mu      sync.Mutex
	kinds   map[string]*kindLease
	stopped bool
	wg      sync.WaitGroup
}

// kindLease is the lease state of one kind in one worker; guarded by
// leaser.mu.
type kindLease struct {
	kind          string
	limit         int32
	fast          bool // positive limit, no parked jobs, no reserved slots (last look)
	overLimit     bool // the kind's slots taken exceed its limit (a lowered limit, last look)
	others        int  // other workers holding or wanting slots of the kind
	leased, inUse int
	toReturn      int // slots given up, to be returned by the keeper
	// minSpare is the fewest leased slots left unused at any moment since
	// windowAt: slots never needed for LeaseLinger go back.
	minSpare int
	windowAt time.Time
	waiters  waiterHeap
	keeper   bool
	wake     chan struct{}
	// published are the waiting jobs last written to the lease row, at
	// publishedAt (the keeper's own).
	published   []int64
	publishedAt time.Time
}

// leaseWaiter is a job waiting in its worker for a slot.
type leaseWaiter struct {
	jobID   int64
	ready   chan struct{} // closed when decided
	granted bool          // decided: a slot (true) or the per-job path (false)
	index   int
}

// waiterHeap orders waiting jobs by job id.
type waiterHeap []*leaseWaiter

func (h waiterHeap) Len() int           { return len(h) }
func (h waiterHeap) Less(i, j int) bool { return h[i].jobID < h[j].jobID }
func (h waiterHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *waiterHeap) Push(x any) {
	w := x.(*leaseWaiter)
	w.index = len(*h)
	*h = append(*h, w)
}
func (h *waiterHeap) Pop() any {
	old := *h
	w := old[len(old)-1]
	*h = old[:len(old)-1]
	w.index = -1
	return w
}

func newLeaser(l *Limiter, parkAfter time.Duration) *leaser {
	if parkAfter <= 0 {
		parkAfter = DefaultParkAfter
	}
	return &leaser{l: l, parkAfter: parkAfter, kinds: map[string]*kindLease{}}
}

// acquire takes a leased slot of kind for job jobID, waiting up to
// parkAfter for one. It returns false when the job must go through per-job
// admission instead: the kind is not on the fast path (jobs parked, slots
// reserved, limit not positive), or no slot came in time.
func (s *leaser) acquire(ctx context.Context, st limitState, jobID int64) bool {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return false
	}
	k := s.kinds[st.kind]
	if k == nil {
		k = &kindLease{kind: st.kind, wake: make(chan struct{}, 1)}
		s.kinds[st.kind] = k
	}
	if !k.keeper {
		// No keeper watches the kind: the limits cache is the freshest
		// word on it.
		k.limit, k.fast = st.limit, st.fast()
	}
	if !k.fast || s.l.waits.has(st.kind) || s.l.decided.oldestWaiting(st.kind) != 0 {
		// Not on leased slots, or jobs of the kind wait in the line in this
		// worker (or were just decided to): it queues behind them.
		s.mu.Unlock()
		return false
	}
	if k.inUse < k.usable() && len(k.waiters) == 0 {
		k.inUse++
		k.minSpare = min(k.minSpare, k.leased-k.inUse)
		s.mu.Unlock()
		return true
	}
	w := &leaseWaiter{jobID: jobID, ready: make(chan struct{})}
	heap.Push(&k.waiters, w)
	s.startKeeper(k)
	s.mu.Unlock()

	timer := time.NewTimer(s.parkAfter)
	defer timer.Stop()
	timedOut := false
	select {
	case <-w.ready:
	case <-timer.C:
		timedOut = true
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-w.ready:
		return w.granted
	default:
	}
	heap.Remove(&k.waiters, w.index)
	if timedOut {
		// It goes to the line (to park, most likely): until the keeper
		// looks again, new jobs of the kind queue behind it rather than
		// take a leased slot ahead of it, and freed slots go back.
		k.fast = false
		s.dismissWaiters(k)
	}
	return false
}

// yield hands the kind over to the line in this worker: a job of kind
// waits in the line here (a resumed job, one that found the kind off the
// fast path), and the line alone orders the jobs of a kind that wait in
// one worker, so that no younger job on the leased slots' path starts
// ahead of an older one in the line. The jobs waiting for a leased slot
// go to the line too, and the spare leased slots go back to the database,
// where the line's grant round gives them out (giveBack).
func (s *leaser) yield(kind string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.kinds[kind]
	if k == nil || s.stopped {
		return
	}
	s.dismissWaiters(k)
	if spare := k.leased - k.inUse; spare > 0 {
		k.leased -= spare
		k.toReturn += spare
		k.minSpare = 0
		s.startKeeper(k)
		signal(k.wake)
	}
}

// oldestWaiting returns the oldest job of kind waiting in this worker for
// a leased slot (0: none).
func (s *leaser) oldestWaiting(kind string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if k := s.kinds[kind]; k != nil && len(k.waiters) > 0 {
		return k.waiters[0].jobID
	}
	return 0
}

// release frees a leased slot of kind: it goes to the oldest waiting job
// of the kind in this worker, unless the kind left the fast path or this
// worker holds more than its fair share, in which case it goes back to the
// database (and to parked jobs, if any).
func (s *leaser) release(kind string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return // close gave every slot back
	}
	k := s.kinds[kind]
	k.inUse--
	switch {
	case k.inUse >= k.leased:
		// The slot was lost (the lease expired, or the limit was removed):
		// it is no longer counted anywhere.
	case !k.fast || k.overLimit || k.overShare() || s.l.waits.has(kind):
		// Jobs of the kind wait in the line here: the slot goes to the
		// line, whose grant round gives it to the oldest (giveBack).
		k.leased--
		k.toReturn++
		s.startKeeper(k)
		signal(k.wake)
	case len(k.waiters) > 0 && k.inUse < k.usable():
		s.grantOldest(k)
	}
}

// grantOldest gives a usable leased slot to the oldest waiting job of k;
// s.mu is held.
func (s *leaser) grantOldest(k *kindLease) {
	w := heap.Pop(&k.waiters).(*leaseWaiter)
	w.granted = true
	k.inUse++
	close(w.ready)
}

// usable is how many of its leased slots the worker may use: no more than
// the kind's limit, which may have been lowered since they were leased, and
// none beyond those in use while the kind's slots taken across all workers
// exceed it (they drain as jobs end).
func (k *kindLease) usable() int {
	if k.overLimit {
		return min(k.leased, k.inUse)
	}
	return min(k.leased, max(int(k.limit), 0))
}

// overShare reports whether the worker holds more slots than its fair
// share while other workers hold or want slots of the kind.
func (k *kindLease) overShare() bool {
	if k.others == 0 {
		return k.leased > int(k.limit)
	}
	share := (int(k.limit) + k.others) / (k.others + 1) // ceil(limit / workers)
	return k.leased > max(share, 1)
}

// startKeeper starts the keeper of k unless it runs; s.mu is held.
func (s *leaser) startKeeper(k *kindLease) {
	if k.keeper || s.stopped {
		return
	}
	k.keeper = true
	s.wg.Add(1)
	go s.keep(k)
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// keep is the keeper of one kind: every LeasePoll (or when woken) it gives
// back returned and idle slots, reads the kind's state, leases what the
// waiting jobs lack, and renews the lease; it ends when the kind is idle.
func (s *leaser) keep(k *kindLease) {
	defer s.wg.Done()
	ticker := time.NewTicker(LeasePoll)
	defer ticker.Stop()
	var renewed, looked, warned time.Time
	// needRenew forces a renewal, which reconciles the worker's count with
	// the database's, before anything else: a grant or give-back whose
	// reply was lost may have committed.
	needRenew := false
	// warn logs at most once per LeaseRenew: while the database is down,
	// every round fails.
	warn := func(msg string, err error) {
		if time.Since(warned) >= LeaseRenew {
			s.l.logger.Warn(msg, "kind", k.kind, "error", err)
			warned = time.Now()
		}
	}
	for first := true; ; first = false {
		if !first {
			select {
			case <-k.wake:
			case <-ticker.C:
			}
		}
		s.mu.Lock()
		stopped := s.stopped
		s.mu.Unlock()
		if !stopped && (needRenew || time.Since(renewed) >= LeaseRenew) {
			if err := s.renew(k); err != nil {
				warn("concurrency lease: not renewed", err)
				needRenew = true
				continue
			}
			renewed, needRenew = time.Now(), false
		}
		s.mu.Lock()
		ret := k.toReturn
		k.toReturn = 0
		if s.stopped || time.Since(k.windowAt) >= LeaseLinger {
			// Slots none of the kind's jobs needed during the window.
			idle := min(k.minSpare, k.leased-k.inUse)
			if s.stopped {
				idle = k.leased - k.inUse
			}
			if idle > 0 && len(k.waiters) == 0 {
				ret += idle
				k.leased -= idle
			}
			k.minSpare, k.windowAt = k.leased-k.inUse, time.Now()
		}
		over := k.leased - max(k.inUse, int(k.limit))
		if k.overLimit {
			over = k.leased - k.inUse
		}
		if over > 0 {
			// The limit was lowered: give back what is not in use at once.
			ret += over
			k.leased -= over
		}
		if s.stopped {
			k.keeper = false
			k.toReturn += ret // close gives everything back
			s.mu.Unlock()
			return
		}
		idle := k.leased == 0 && k.inUse == 0 && len(k.waiters) == 0
		s.mu.Unlock()

		if ret > 0 && s.giveBack(k.kind, ret) != nil {
			s.mu.Lock()
			k.toReturn += ret // next round, after a renewal says what went back
			s.mu.Unlock()
			needRenew = true
			continue
		}
		s.publish(k)
		if idle && !needRenew && len(k.published) == 0 {
			s.mu.Lock()
			if k.leased == 0 && k.inUse == 0 && len(k.waiters) == 0 && k.toReturn == 0 {
				k.keeper = false
				s.mu.Unlock()
				return
			}
			s.mu.Unlock()
		}
		s.mu.Lock()
		waiting := len(k.waiters) > 0
		s.mu.Unlock()
		if !waiting && time.Since(looked) < LeaseIdlePoll {
			continue
		}
		if err := s.look(k); err != nil {
			warn("concurrency lease: kind state not read", err)
			continue
		}
		looked = time.Now()
		if err := s.lease(k); err != nil {
			warn("concurrency lease: slots not leased", err)
			needRenew = true
		}
	}
}

// publish writes the jobs waiting for k's leased slots to the worker's
// lease row when they changed, at most every leasePublish (at once when
// none waits any more): SQL tells them from the jobs that work.
func (s *leaser) publish(k *kindLease) {
	s.mu.Lock()
	ids := make([]int64, len(k.waiters))
	for i, w := range k.waiters {
		ids[i] = w.jobID
	}
	s.mu.Unlock()
	slices.Sort(ids)
	if slices.Equal(ids, k.published) || (len(ids) > 0 && time.Since(k.publishedAt) < leasePublish) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	if err := s.l.q.SetLeaseWaiting(ctx, db.SetLeaseWaitingParams{Kind: k.kind, WorkerID: s.l.workerID, JobIds: ids}); err != nil {
		return // next round
	}
	k.published, k.publishedAt = ids, time.Now()
}

// renew marks the worker's lease of k alive and checks that the database
// still counts every slot the worker believes it holds; slots it does not
// (the lease expired while the worker was paused, or the limit was removed)
// are dropped: the jobs on them finish, and no new job takes them.
func (s *leaser) renew(k *kindLease) error {
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	held, err := s.l.q.RenewLease(ctx, db.RenewLeaseParams{WorkerID: s.l.workerID, Kind: k.kind})
	if err != nil {
		return fmt.Errorf("renew the %s lease: %w", k.kind, err)
	}
	s.mu.Lock()
	s.reconcile(k, int(held))
	s.mu.Unlock()
	s.l.TestSignals.Renewed.Signal(k.kind)
	return nil
}

// reconcile makes the worker's count of k's slots (leased and to return)
// agree with held, what the database counts for it; s.mu is held, and only
// the keeper of k, which does all of k's lease statements one after the
// other, calls it.
func (s *leaser) reconcile(k *kindLease, held int) {
	switch diff := k.leased + k.toReturn - held; {
	case diff > 0:
		s.l.logger.Warn("concurrency lease: slots lost (the lease expired or the limit was removed); not used any more",
			"kind", k.kind, "slots", diff)
		fromReturn := min(diff, k.toReturn)
		k.toReturn -= fromReturn
		k.leased -= diff - fromReturn
		k.minSpare, k.windowAt = 0, time.Now()
	case diff < 0:
		// The database counts slots this worker does not hold (a grant
		// whose reply was lost): give them back.
		s.l.logger.Warn("concurrency lease: the database counts slots this worker does not hold; giving them back",
			"kind", k.kind, "slots", -diff)
		k.toReturn -= diff
	}
}

// look reads the kind's state; a kind off the fast path sends its waiting
// jobs to per-job admission.
func (s *leaser) look(k *kindLease) error {
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	st, err := s.l.q.LeaseState(ctx, db.LeaseStateParams{
		Kind: k.kind, WorkerID: s.l.workerID, WantedWindowMs: leaseWantedWindow.Milliseconds(),
	})
	if errors.Is(err, pgx.ErrNoRows) {
		// The limit was removed, and its leases with it: nothing to hold.
		s.mu.Lock()
		defer s.mu.Unlock()
		k.limit, k.fast, k.others = 0, false, 0
		k.leased, k.toReturn = 0, 0
		s.dismissWaiters(k)
		return nil
	}
	if err != nil {
		return fmt.Errorf("lease state of %s: %w", k.kind, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reconcile(k, int(st.Own))
	k.limit = st.MaxConcurrency
	k.others = int(st.Others)
	k.fast = st.MaxConcurrency > 0 && !st.HasParked && !st.HasReserved && !st.Keyed
	k.overLimit = st.Admitted > st.MaxConcurrency
	if !k.fast {
		s.dismissWaiters(k)
	}
	return nil
}

// dismissWaiters sends every waiting job of k to per-job admission; s.mu is
// held.
func (s *leaser) dismissWaiters(k *kindLease) {
	for len(k.waiters) > 0 {
		w := heap.Pop(&k.waiters).(*leaseWaiter)
		close(w.ready)
	}
}

// lease asks for the slots the waiting jobs of k lack (within the worker's
// fair share) and hands what it gets to them, oldest first.
func (s *leaser) lease(k *kindLease) error {
	s.mu.Lock()
	want := 0
	if k.fast && len(k.waiters) > 0 {
		want = len(k.waiters) - (k.leased - k.inUse)
		if k.others > 0 {
			share := (int(k.limit) + k.others) / (k.others + 1)
			want = min(want, max(share-k.leased, 0))
		}
		want = min(want, int(k.limit))
		if want <= 0 && k.leased == 0 {
			want = 1 // ask, so that the others see this worker wants
		}
	}
	s.mu.Unlock()
	if want <= 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	res, err := retryDeadlock(func() (*db.GrantLeaseRow, error) {
		return s.l.q.GrantLease(ctx, db.GrantLeaseParams{Kind: k.kind, WorkerID: s.l.workerID, Want: int32(want)})
	})
	if err != nil {
		return fmt.Errorf("lease %d %s slots: %w", want, k.kind, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k.leased += int(res.Granted)
	k.limit = res.MaxConcurrency
	if res.HasParked || res.MaxConcurrency <= 0 {
		k.fast = false
		s.dismissWaiters(k)
	}
	for len(k.waiters) > 0 && k.inUse < k.usable() {
		s.grantOldest(k)
	}
	return nil
}

// giveBack returns n leased slots of kind to the database and runs the
// kind's grant round when jobs are parked or wait in the line here (the
// slots go to the front of the line). On an error the caller keeps the slots
// to give back later.
func (s *leaser) giveBack(kind string, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	res, err := retryDeadlock(func() (*db.ReturnLeaseRow, error) {
		return s.l.q.ReturnLease(ctx, db.ReturnLeaseParams{Kind: kind, WorkerID: s.l.workerID, N: int32(n)})
	})
	if err != nil {
		s.l.logger.Warn("concurrency lease: slots not given back yet", "kind", kind, "slots", n, "error", err)
		return err
	}
	if (res.HasParked || s.l.waits.has(kind)) && res.MaxConcurrency >= 0 && (res.MaxConcurrency == 0 || res.Admitted < res.MaxConcurrency) {
		s.l.releaser.submitAsync(&releaseRequest{ctx: context.Background(), kind: kind})
	}
	return nil
}

// close stops the keepers and gives back every leased slot (trying three
// times; what still fails expires after LeaseTTL, or goes with the worker's
// reap); the worker's jobs have ended.
func (s *leaser) close() {
	s.mu.Lock()
	s.stopped = true
	var back []*kindLease
	for _, k := range s.kinds {
		s.dismissWaiters(k)
		signal(k.wake)
		back = append(back, k)
	}
	s.mu.Unlock()
	s.wg.Wait()
	for _, k := range back {
		s.mu.Lock()
		// Slots of jobs still running (a stop that could not wait for
		// them) stay leased until the process is gone: they expire then.
		n := k.leased - k.inUse + k.toReturn
		k.leased, k.toReturn = k.inUse, 0
		s.mu.Unlock()
		for try := 1; n > 0 && try <= 3; try++ {
			if s.giveBack(k.kind, n) == nil {
				break
			}
			time.Sleep(time.Duration(try) * 100 * time.Millisecond)
		}
	}
}
