package limiter

import (
	"slices"
	"sync"
	"time"
)

// parkRechecks are the delays after a job parks in its worker (marked, its
// parking completed by River's completer: within 250 ms, or 50 ms while
// 100 or more completions wait) at which
// the kind's grant round runs again: a parked job can be resumed only once
// its parking is complete, so a slot freed in between would otherwise wait
// for the next release or for concurrency_limit.resume.
var parkRechecks = []time.Duration{75 * time.Millisecond, 250 * time.Millisecond, time.Second}

// rechecks run a grant round of a kind at each of parkRechecks after its
// latest parking in this worker, one chain per kind at a time: of the
// lines of the keys whose jobs parked since the chain began under per-key
// limits alone (each key's room is its own), else of the kind's whole
// line.
type rechecks struct {
	l *Limiter

	mu      sync.Mutex
	latest  map[string]time.Time // kinds with a chain running: their latest parking
	keys    map[string][]string  // kinds with a chain running: the keys of their jobs parked since it began
	stopped bool
}

// parked starts (or restarts) kind's chain, a job of key having parked.
func (r *rechecks) parked(kind, key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return
	}
	if r.latest == nil {
		r.latest, r.keys = map[string]time.Time{}, map[string][]string{}
	}
	_, running := r.latest[kind]
	r.latest[kind] = time.Now()
	if !slices.Contains(r.keys[kind], key) {
		r.keys[kind] = append(r.keys[kind], key)
	}
	if !running {
		go r.chain(kind)
	}
}

// chain runs kind's grant rounds, starting over from its latest parking
// whenever the kind parks again meanwhile.
func (r *rechecks) chain(kind string) {
	var from time.Time
	next := 0
	for {
		r.mu.Lock()
		latest := r.latest[kind]
		if r.stopped || (latest.Equal(from) && next == len(parkRechecks)) {
			delete(r.latest, kind)
			delete(r.keys, kind)
			r.mu.Unlock()
			return
		}
		if !latest.Equal(from) {
			from, next = latest, 0
		}
		r.mu.Unlock()
		time.Sleep(time.Until(from.Add(parkRechecks[next])))
		next++
		r.mu.Lock()
		keys := slices.Clone(r.keys[kind])
		r.mu.Unlock()
		r.l.releaser.submitAsync(&releaseRequest{keyRounds: map[string][]string{kind: keys}})
	}
}

// stop ends every chain (the worker stops).
func (r *rechecks) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopped = true
}
