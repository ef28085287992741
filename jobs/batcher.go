package jobs

import "sync"

// maxBatch caps how many requests one group-commit transaction handles.
const maxBatch = 1000

// batcher groups concurrent requests into one transaction (group commit):
// the first request to arrive while no batch is in flight processes every
// request queued so far; requests that arrive meanwhile wait and are handled
// by the next batch, run by a goroutine that lives only while there is work.
// Under load each transaction serves many jobs; an idle batcher adds no delay.
type batcher[R any] struct {
	mu      sync.Mutex
	pending []*R
	running bool
	// process handles a batch; it must not return before every request in
	// it has its result.
	process func(batch []*R)
}

// submit queues r and returns once a batch containing r has been processed.
func (b *batcher[R]) submit(r *R, done <-chan struct{}) {
	b.mu.Lock()
	b.pending = append(b.pending, r)
	if b.running {
		b.mu.Unlock()
		<-done
		return
	}
	b.running = true
	b.mu.Unlock()
	b.drain()
	<-done
}

// drain processes one batch, then hands the rest (if any) to a goroutine.
func (b *batcher[R]) drain() {
	b.mu.Lock()
	n := min(len(b.pending), maxBatch)
	batch := b.pending[:n:n]
	b.pending = b.pending[n:]
	b.mu.Unlock()

	b.process(batch)

	b.mu.Lock()
	if len(b.pending) == 0 {
		b.running = false
		b.pending = nil
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	go b.drain()
}
