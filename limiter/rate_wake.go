package limiter

import (
	"sync"
	"time"
)

// rateWakes run a grant round for a kind whose line waits for a rate
// window when the window frees a start: after a decision or a grant round
// that left such jobs, the Limiter sets a timer for the moment the oldest
// start in the window leaves it (as the database's clock counts it); when
// it fires, the front of the kind's line gets what the window then allows
// (a grant round of the kind). One timer per kind, set to the earliest
// moment asked for. concurrency_limit.resume, every second while jobs
// wait, is the safety net of a worker that stops before its timer fires.
type rateWakes struct {
	l *Limiter

	mu      sync.Mutex
	timers  map[string]*rateTimer
	stopped bool
}

type rateTimer struct {
	at    time.Time
	timer *time.Timer
}

// after sets kind's wake to d from now, unless it is already set to fire
// sooner.
func (w *rateWakes) after(kind string, d time.Duration) {
	w.at(kind, time.Now().Add(d))
}

// at sets kind's wake to at, unless it is already set to fire sooner.
func (w *rateWakes) at(kind string, at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	if w.timers == nil {
		w.timers = map[string]*rateTimer{}
	}
	if t, ok := w.timers[kind]; ok && !t.at.After(at) {
		return
	}
	if t, ok := w.timers[kind]; ok {
		t.timer.Stop()
	}
	t := &rateTimer{at: at}
	t.timer = time.AfterFunc(time.Until(at), func() { w.fire(kind, t) })
	w.timers[kind] = t
}

func (w *rateWakes) fire(kind string, t *rateTimer) {
	w.mu.Lock()
	if w.stopped || w.timers[kind] != t {
		w.mu.Unlock()
		return
	}
	delete(w.timers, kind)
	w.mu.Unlock()
	w.l.TestSignals.RateWake.Signal(kind)
	w.l.releaser.submitAsync(&releaseRequest{rounds: []string{kind}})
}

// stop cancels every wake (the worker stops).
func (w *rateWakes) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	for kind, t := range w.timers {
		t.timer.Stop()
		delete(w.timers, kind)
	}
}
