package limiter

import (
	"context"
	"sync"
	"time"

	"github.com/riverqueue/river/riverdriver"
)

// Fetch gate bounds.
const (
	// MaxFetchedWaiting is how many fetched jobs may wait in one worker for
	// their turn: while jobs wait, a fetch takes at most the difference (at
	// least one job), and while that many wait it waits until fewer do. A
	// worker with no job waiting fetches as River asks.
	MaxFetchedWaiting = 256
	// gatePoll is how often a fetch held by the gate looks again.
	gatePoll = 5 * time.Millisecond
)

// fetchGate keeps a worker from fetching more jobs than can start soon
// while jobs of limited kinds wait in it for their turn. River fetches up
// to a queue's free MaxWorkers at a time, and a job waiting for a slot
// holds one of them: a backlog of a kind whose keys have room for 200 would
// have each worker fetch its whole MaxWorkers, most of which would wait
// past their park-after time and park, to be resumed and fetched again.
//
// River's producer fetches again at once only when a fetch filled what it
// asked for, else at its poll interval or on an insert notification; so a
// fetch the gate made smaller owes its queue a notification, sent when
// the jobs waiting in the worker fall to half of MaxFetchedWaiting.
type fetchGate struct {
	l *Limiter

	mu   sync.Mutex
	owed map[string]bool // queues whose last fetch the gate made smaller
	// slots is the most jobs River asked for in one fetch of each queue:
	// its River slots (MaxWorkers) as near as the worker can tell, since
	// River asks for its free slots.
	slots map[string]int
}

// saw notes a fetch of queue that River asked n jobs for.
func (g *fetchGate) saw(queue string, n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.slots == nil {
		g.slots = map[string]int{}
	}
	g.slots[queue] = max(g.slots[queue], n)
}

// slotsOf is queue's River slots as its fetches told them (0: none seen).
func (g *fetchGate) slotsOf(queue string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.slots[queue]
}

// admit notes how many jobs River asked for (saw), waits while
// MaxFetchedWaiting jobs wait in the worker (until fewer do, ctx ends, or
// at the latest the park-after time: they park by then), and returns
// params with MaxToLock cut to the room left while jobs wait.
func (g *fetchGate) admit(ctx context.Context, params *riverdriver.JobGetAvailableParams) *riverdriver.JobGetAvailableParams {
	g.saw(params.Queue, params.MaxToLock)
	qs := &g.l.queues
	if qs.waiting() >= MaxFetchedWaiting {
		deadline := time.NewTimer(g.l.parkAfter + gatePoll)
		defer deadline.Stop()
		tick := time.NewTicker(gatePoll)
		defer tick.Stop()
	wait:
		for qs.waiting() >= MaxFetchedWaiting {
			select {
			case <-ctx.Done():
				return params
			case <-deadline.C:
				break wait
			case <-tick.C:
			}
		}
	}
	waiting := qs.waiting()
	room := max(MaxFetchedWaiting-waiting, 1)
	if waiting == 0 || params.MaxToLock <= room {
		return params
	}
	g.mu.Lock()
	if g.owed == nil {
		g.owed = map[string]bool{}
	}
	g.owed[params.Queue] = true
	g.mu.Unlock()
	p := *params
	p.MaxToLock = room
	return &p
}

// left is told that a job stopped waiting: once at most half of
// MaxFetchedWaiting wait, it wakes the producers of the queues owed a
// fetch.
func (g *fetchGate) left() {
	g.mu.Lock()
	if len(g.owed) == 0 {
		g.mu.Unlock()
		return
	}
	g.mu.Unlock()
	if g.l.queues.waiting() > MaxFetchedWaiting/2 {
		return
	}
	g.mu.Lock()
	queues := make([]string, 0, len(g.owed))
	for q := range g.owed {
		queues = append(queues, q)
	}
	g.owed = nil
	g.mu.Unlock()
	if len(queues) == 0 {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), decideTimeout)
		defer cancel()
		if err := g.l.q.NotifyRiverInsert(ctx, queues); err != nil {
			g.l.logger.Warn("queues not woken after a smaller fetch; River's poll interval will", "queues", queues, "error", err)
		}
	}()
}

// wake sends queue River's insert notification (in the background), so
// that its producer fetches again soon: a fetch returned fewer jobs than
// River asked for because some parked.
func (g *fetchGate) wake(queue string) {
	g.l.bg.Add(1)
	go func() {
		defer g.l.bg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), decideTimeout)
		defer cancel()
		if err := g.l.q.NotifyRiverInsert(ctx, []string{queue}); err != nil {
			g.l.logger.Warn("queue not woken after a fetch that parked jobs; River's poll interval will", "queue", queue, "error", err)
		}
	}()
}
