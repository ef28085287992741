package limiter

import "sync"

// maxBatch caps how many requests one group-commit statement handles.
const maxBatch = 1000

// batcher groups concurrent requests into few statements (group commit): a
// request that arrives while fewer than maxInFlight batches are running
// starts a batch of every request queued so far; requests that arrive while
// maxInFlight batches run wait for the next one, which a goroutine that
// lives only while there is work starts when a batch ends. Under load each
// statement serves many jobs; an idle batcher adds no delay.
type batcher[R any] struct {
	// maxInFlight is how many batches may run at once (default 1).
	maxInFlight int
	// process handles a batch; it must not return before every request in
	// it has its result.
	process func(batch []*R)

	mu      sync.Mutex
	idle    *sync.Cond // broadcast when nothing is pending or running
	pending []*R
	running int
}

// submit queues r and returns once a batch containing r has been processed
// (done is closed by process).
func (b *batcher[R]) submit(r *R, done <-chan struct{}) {
	b.mu.Lock()
	b.pending = append(b.pending, r)
	if b.running >= max(b.maxInFlight, 1) {
		b.mu.Unlock()
		<-done
		return
	}
	b.running++
	b.mu.Unlock()
	b.drain()
	<-done
}

// submitAsync queues r and returns at once; a batch processes it soon.
func (b *batcher[R]) submitAsync(r *R) {
	b.mu.Lock()
	b.pending = append(b.pending, r)
	if b.running >= max(b.maxInFlight, 1) {
		b.mu.Unlock()
		return
	}
	b.running++
	b.mu.Unlock()
	go b.drain()
}

// flush waits until every request submitted so far has been processed.
func (b *batcher[R]) flush() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.idle == nil {
		b.idle = sync.NewCond(&b.mu)
	}
	for b.running > 0 || len(b.pending) > 0 {
		b.idle.Wait()
	}
}

// drain processes one batch, then hands what is left (if anything) to a
// goroutine, which keeps this batch's place among those in flight.
func (b *batcher[R]) drain() {
	b.mu.Lock()
	n := min(len(b.pending), maxBatch)
	batch := b.pending[:n:n]
	b.pending = b.pending[n:]
	b.mu.Unlock()

	if len(batch) > 0 {
		b.process(batch)
	}

	b.mu.Lock()
	if len(b.pending) == 0 {
		b.running--
		if b.running == 0 {
			b.pending = nil
			if b.idle != nil {
				b.idle.Broadcast()
			}
		}
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	go b.drain()
}
