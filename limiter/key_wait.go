package limiter

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/db"
)

// Waiting in the worker for a key's slot.
const (
	// keyWaitPoll is how often a job waiting in its worker for a slot of
	// its key is decided again when no job of its key ends in this worker
	// meanwhile (a slot may free in another worker).
	keyWaitPoll = 20 * time.Millisecond
	// maxHandoffs is how many times in a row a slot passes from job to job
	// in one worker before it is released instead: waiters of the key in
	// other workers, which only see it free, get their turn.
	maxHandoffs = 8
)

// kindKey names one key of one kind.
type kindKey struct{ kind, key string }

// keyWaits is the worker's side of per-key limits, as leases are of
// per-kind ones: the jobs of a kind with a per-key limit (and no rate) that
// found every slot of their key taken by running jobs — and no job of the
// key parked — wait in the worker, oldest first, rather than park. When a
// job of the key ends in this worker, its slot goes straight to the oldest
// waiter (handOff: one UPDATE of the slot row, batched with the releases),
// unless jobs of the key or the kind are parked by then (they go first).
// A waiter is decided again every keyWaitPoll (a slot may free in another
// worker), and parks once it has waited the park-after time.
type keyWaits struct {
	mu      sync.Mutex
	waiting map[kindKey][]*admitRequest // oldest job first
	running map[int64]heldSlot          // this worker's jobs holding a slot of a partitioned kind
}

// heldSlot is a slot of a key a job of this worker holds, and how many
// times in a row it was handed from job to job in this worker.
type heldSlot struct {
	k        kindKey
	handoffs int
}

// add queues r (decided to wait) behind the older waiters of its key, and
// arms its poll.
func (l *Limiter) addWaiter(r *admitRequest) {
	w := &l.waits
	w.mu.Lock()
	if w.waiting == nil {
		w.waiting = map[kindKey][]*admitRequest{}
	}
	k := kindKey{r.job.Kind, r.key}
	list := w.waiting[k]
	i, _ := slices.BinarySearchFunc(list, r.job.ID, func(a *admitRequest, id int64) int {
		switch {
		case a.job.ID < id:
			return -1
		case a.job.ID > id:
			return 1
		}
		return 0
	})
	w.waiting[k] = slices.Insert(list, i, r)
	w.mu.Unlock()
	l.armWaiter(r)
}

// armWaiter decides r again after keyWaitPoll if it is then the oldest
// waiter of its key and still waiting (the younger ones cannot start
// before it, and wait on without a statement).
func (l *Limiter) armWaiter(r *admitRequest) {
	time.AfterFunc(keyWaitPoll, func() {
		w := &l.waits
		w.mu.Lock()
		list := w.waiting[kindKey{r.job.Kind, r.key}]
		head := len(list) > 0 && list[0] == r
		waiting := slices.Contains(list, r)
		w.mu.Unlock()
		switch {
		case head || (waiting && !time.Now().Before(r.waitUntil)):
			if l.removeWaiter(r) {
				l.keyed.submitAsync(r) // decided again: admitted, waits on, or parks
			}
		case waiting:
			l.armWaiter(r)
		}
	})
}

// removeWaiter takes r off its key's line; false if it was no longer on it
// (handed a slot meanwhile).
func (l *Limiter) removeWaiter(r *admitRequest) bool {
	w := &l.waits
	w.mu.Lock()
	defer w.mu.Unlock()
	k := kindKey{r.job.Kind, r.key}
	list := w.waiting[k]
	i := slices.Index(list, r)
	if i < 0 {
		return false
	}
	list = slices.Delete(list, i, i+1)
	if len(list) == 0 {
		delete(w.waiting, k)
	} else {
		w.waiting[k] = list
	}
	return true
}

// holding records that job jobID holds a slot of key k in this worker,
// handed to it after handoffs handoffs in a row (0: admitted).
func (l *Limiter) holding(jobID int64, k kindKey, handoffs int) {
	w := &l.waits
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.running == nil {
		w.running = map[int64]heldSlot{}
	}
	w.running[jobID] = heldSlot{k: k, handoffs: handoffs}
}

// nextWaiter forgets that jobID holds a slot and returns the oldest job
// waiting for a slot of the same key (nil: none), taken off its line.
func (l *Limiter) nextWaiter(jobID int64) *admitRequest {
	w := &l.waits
	w.mu.Lock()
	defer w.mu.Unlock()
	held, ok := w.running[jobID]
	if !ok {
		return nil
	}
	delete(w.running, jobID)
	k := held.k
	list := w.waiting[k]
	if len(list) == 0 || held.handoffs >= maxHandoffs {
		return nil
	}
	next := list[0]
	next.handoffs = held.handoffs + 1
	if len(list) == 1 {
		delete(w.waiting, k)
	} else {
		w.waiting[k] = list[1:]
	}
	return next
}

// handOffBatch gives the slots of ended jobs to the jobs waiting for their
// keys (batch: release requests with handTo), in one statement without the
// kind's lock: a slot passes only if it is still the ended job's and no job
// of its key or kind is parked. Those handed a slot are admitted; the
// others are decided again, and the ended jobs' slots released as usual.
func (l *Limiter) handOffBatch(batch []*releaseRequest) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(batch[0].ctx), batchTimeout)
	defer cancel()
	var p db.TransferSlotsParams
	p.WorkerID = l.workerID
	for _, r := range batch {
		p.FromIds = append(p.FromIds, r.job.ID)
		p.ToIds = append(p.ToIds, r.handTo.job.ID)
	}
	moved, err := retryDeadlock(func() ([]int64, error) { return l.q.TransferSlots(ctx, p) })
	if err != nil {
		l.logger.Warn("concurrency slots not handed to waiting jobs; released instead", "error", err)
	}
	for _, r := range batch {
		w := r.handTo
		if err == nil && slices.Contains(moved, r.job.ID) {
			l.holding(w.job.ID, kindKey{w.job.Kind, w.key}, w.handoffs)
			w.decision = admitSlot
			close(w.done)
			continue
		}
		l.keyed.submitAsync(w)
		r.handTo = nil
		l.releaser.submitAsync(r)
	}
}
