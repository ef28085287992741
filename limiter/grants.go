package limiter

import (
	"context"
	"encoding/json"
	"slices"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/limiter/internal/ledger"
	"github.com/sluice-dev/sluice/limiter/internal/local"
)

// Grant watch defaults.
const (
	// GrantPoll is how often a worker with jobs waiting in the line looks
	// at the ledger for grants its listener did not hear of (a note too
	// long to name its jobs, one sent while it reconnected) and for jobs
	// whose place went.
	GrantPoll = 50 * time.Millisecond
	// GrantPollLost is how often it looks while its listener is not
	// connected.
	GrantPollLost = 5 * time.Millisecond
	// GrantRoundAfter is how long jobs of a kind wait in the line here
	// before the watch runs a grant round of the kind itself (at most that
	// often): a round due when they began to wait may have found their
	// line held (a job that had ended, still running in River's view,
	// looked undecided), and nothing else would run the next one.
	GrantRoundAfter = 250 * time.Millisecond
)

// GrantWatchConfig configures a worker's grant watch.
type GrantWatchConfig struct {
	// Poll is GrantPoll by default; PollLost GrantPollLost; RoundAfter
	// GrantRoundAfter.
	Poll, PollLost, RoundAfter time.Duration
}

func (c GrantWatchConfig) withDefaults() GrantWatchConfig {
	if c.Poll <= 0 {
		c.Poll = GrantPoll
	}
	if c.PollLost <= 0 {
		c.PollLost = GrantPollLost
	}
	if c.RoundAfter <= 0 {
		c.RoundAfter = GrantRoundAfter
	}
	return c
}

// grantWatch wakes the jobs of this worker waiting in the line that other
// processes gave a slot or a start (a release in another worker, a change
// of limits, the safety net): at once when the listener hears the grant's
// note (the grant is written: the job runs), else at its next look at the
// ledger. Grants given by this worker's own transactions wake their jobs
// when they commit (Limiter.granted).
type grantWatch struct {
	l         *Limiter
	cfg       GrantWatchConfig
	look      chan struct{} // buffered 1: look at the ledger now
	listening atomic.Bool

	// The watch goroutine's own: when it first saw each job waiting, and
	// when it last ran a round of each kind.
	seen   map[int64]time.Time
	rounds map[string]time.Time
}

func newGrantWatch(l *Limiter, cfg GrantWatchConfig) *grantWatch {
	return &grantWatch{l: l, cfg: cfg.withDefaults(), look: make(chan struct{}, 1), seen: map[int64]time.Time{},
		rounds: map[string]time.Time{}}
}

// heard applies a grant note (GrantChannel's payload): the jobs it names
// that wait here run; a note for this worker naming none has it look.
func (g *grantWatch) heard(payload string) {
	var note ledger.GrantNote
	if err := json.Unmarshal([]byte(payload), &note); err != nil || note.Worker != g.l.workerID {
		return // another worker's, or not a note of this version: the next look finds it
	}
	if len(note.Jobs) == 0 && len(note.Starts) == 0 {
		g.lookNow()
		return
	}
	gs := make([]jobGrant, 0, len(note.Jobs)+len(note.Starts))
	for _, id := range note.Jobs {
		gs = append(gs, jobGrant{id: id, slot: local.LineSlot})
	}
	for _, id := range note.Starts {
		gs = append(gs, jobGrant{id: id, slot: local.NoSlot})
	}
	var tags map[string]string
	if note.Kind != "" && note.Limits != "" {
		// The limits the round read: when the worker's copy holds them, the
		// jobs begin without being decided again for a change heard before.
		tags = map[string]string{note.Kind: note.Limits}
	}
	for _, id := range g.l.grantJobs(gs, tags) {
		g.l.TestSignals.GrantHeard.Signal(id)
	}
}

// connected is told that the listener LISTENs (again): grants given
// meanwhile were not heard.
func (g *grantWatch) connected() {
	g.listening.Store(true)
	g.lookNow()
}

func (g *grantWatch) disconnected() { g.listening.Store(false) }

func (g *grantWatch) lookNow() {
	select {
	case g.look <- struct{}{}:
	default:
	}
}

// run looks at the ledger for the jobs waiting in the line here, every
// Poll (PollLost while the listener is not connected, at once when asked),
// until ctx ends.
func (g *grantWatch) run(ctx context.Context) {
	timer := time.NewTimer(g.cfg.PollLost)
	defer timer.Stop()
	var warned time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-g.look:
		}
		if err := g.runOnce(ctx); err != nil && time.Since(warned) >= time.Second {
			g.l.logger.Warn("concurrency line: grants not looked for; trying again", "error", err)
			warned = time.Now()
		}
		every := g.cfg.Poll
		if !g.listening.Load() {
			every = g.cfg.PollLost
		}
		timer.Reset(every)
	}
}

// runOnce looks at what the ledger holds for the jobs waiting in the line
// here: a grant runs its job; a place gone, or a job resumed ahead behind
// an older job of its line on its way, sends its job to be decided again;
// a job waiting ahead of a free slot that the line holds as ahead no more
// (a change set a rate) waits on to a deadline (local.Queue.EndAhead);
// and it runs a grant round of a kind whose jobs waited RoundAfter here.
func (g *grantWatch) runOnce(ctx context.Context) error {
	var ids []int64
	ahead := map[int64]*local.Queue{} // those waiting ahead of a free slot, and their queues
	now := time.Now()
	seen := make(map[int64]time.Time, len(g.seen))
	g.l.queues.each(func(q *local.Queue) {
		var late []string // the keys of the jobs waiting RoundAfter here
		for _, j := range q.Lined() {
			ids = append(ids, j.ID)
			if _, a := j.Held(); a {
				ahead[j.ID] = q
			}
			since, ok := g.seen[j.ID]
			if !ok {
				since = now
			}
			seen[j.ID] = since
			if key := j.CurrentKey(); now.Sub(since) >= g.cfg.RoundAfter && !slices.Contains(late, key) {
				late = append(late, key)
			}
		}
		if len(late) > 0 && now.Sub(g.rounds[q.Kind()]) >= g.cfg.RoundAfter {
			// Of those keys' lines under per-key limits alone (each key's
			// room is its own), else of the kind's whole line.
			g.rounds[q.Kind()] = now
			g.l.releaser.submitAsync(&releaseRequest{keyRounds: map[string][]string{q.Kind(): late}})
		}
	})
	g.seen = seen
	if len(ids) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, decideTimeout)
	defer cancel()
	grants, err := g.l.ledger.GrantedTo(ctx, ids)
	if err != nil {
		return err
	}
	var gs []jobGrant
	for _, gr := range grants {
		switch {
		case gr.Slot:
			gs = append(gs, jobGrant{id: gr.Job, slot: local.LineSlot})
		case gr.Start:
			gs = append(gs, jobGrant{id: gr.Job, slot: local.NoSlot})
		case gr.OutOfLine, gr.Behind:
			g.l.queues.redecide(gr.Job)
		case !gr.Ahead && ahead[gr.Job] != nil:
			ahead[gr.Job].EndAhead(gr.Job)
		}
	}
	g.l.grantJobs(gs, nil) // a grant read here may predate a change heard: its job is decided again
	return nil
}
