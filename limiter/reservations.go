package limiter

import (
	"context"
	"sync"
)

// ReservationChannel is the channel a job notifies when it is deleted or
// cancelled while it holds a slot or a start granted and not claimed yet
// (a trigger on river_job, sluice_reservation_gone; the payload is the
// kind): every worker LISTENs on it and frees such reservations at once.
const ReservationChannel = "sluice_reservations"

// goneReservations free the reservations of jobs that went before they
// claimed them: when the listener hears a kind on ReservationChannel, the
// safety net's work on the kind (ledger.CleanUp: the reservation freed
// under the kind's lock, and a grant round giving it on) runs in the
// background, one at a time per kind; a kind heard again meanwhile runs
// once more after it. Without it, such a slot would be held for nobody
// until concurrency_limit.resume came by (every second while jobs of the
// kind are parked, else every minute).
type goneReservations struct {
	l *Limiter

	mu      sync.Mutex
	running map[string]bool // a clean-up of the kind is on its way
	again   map[string]bool // heard while it was: once more after it
}

// heard runs a clean-up of kind in the background (ctx: the listener's),
// or once more after the one on its way.
func (g *goneReservations) heard(ctx context.Context, kind string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.running == nil {
		g.running, g.again = map[string]bool{}, map[string]bool{}
	}
	if g.running[kind] {
		g.again[kind] = true
		return
	}
	g.running[kind] = true
	g.l.bg.Add(1)
	go func() {
		defer g.l.bg.Done()
		g.run(ctx, kind)
	}()
}

// run cleans kind up until it was not heard again meanwhile.
func (g *goneReservations) run(ctx context.Context, kind string) {
	for {
		if ctx.Err() == nil && !g.l.isStopped() {
			if _, _, err := g.l.cleanUp(ctx, kind, "a reserved job went"); err != nil && ctx.Err() == nil {
				g.l.logger.Warn("concurrency limits: could not free the reservation of a job that went; concurrency_limit.resume will",
					"kind", kind, "error", err)
			}
			g.l.TestSignals.ReservationFreed.Signal(kind)
		}
		g.mu.Lock()
		if !g.again[kind] {
			delete(g.running, kind)
			g.mu.Unlock()
			return
		}
		delete(g.again, kind)
		g.mu.Unlock()
	}
}
