package limiter

import (
	"context"
	"encoding/json"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sluice-dev/sluice/db"
)

// GrantChannel is the channel a grant round notifies (NotifyGrants) when it
// gives a slot or a start to a job waiting in another worker, and on which
// a worker's line poller LISTENs while jobs wait in it. The payload is a
// grantNote in JSON: the worker and its jobs granted ("*": a job resumed
// ahead, which any worker may have taken).
const GrantChannel = "sluice_grants"

// anyWorker is the worker of a grantNote for every worker.
const anyWorker = "*"

// maxNotePayload bounds a notification's payload (Postgres takes 8000
// bytes): a note whose jobs do not fit names none (claim for all).
const maxNotePayload = 7900

// grantNote is a notification's payload: jobs waiting in worker got
// grants (Jobs empty: any of its jobs may have).
type grantNote struct {
	Worker string  `json:"worker"`
	Jobs   []int64 `json:"jobs,omitempty"`
}

// grantNotes gathers a grant round's notes, one per worker.
type grantNotes map[string][]int64

// add notes that job, waiting in worker, got a grant.
func (n grantNotes) add(worker string, job int64) { n[worker] = append(n[worker], job) }

// payloads are the notes as NotifyGrants sends them.
func (n grantNotes) payloads() []string {
	out := make([]string, 0, len(n))
	for worker, jobs := range n {
		b, err := json.Marshal(grantNote{Worker: worker, Jobs: jobs})
		if err != nil || len(b) > maxNotePayload {
			b, _ = json.Marshal(grantNote{Worker: worker})
		}
		out = append(out, string(b))
	}
	sort.Strings(out)
	return out
}

// heardGrants are the jobs the notifications named since the poller last
// claimed (all: claim for every waiting job).
type heardGrants struct {
	mu   sync.Mutex
	jobs map[int64]bool
	all  bool
}

// add records a note for this worker.
func (h *heardGrants) add(n grantNote) {
	if len(n.Jobs) == 0 || n.Worker == anyWorker {
		h.mu.Lock()
		h.all = true
		h.mu.Unlock()
		return
	}
	h.putBack(n.Jobs)
}

// has reports whether job was named and not claimed yet.
func (h *heardGrants) has(job int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.jobs[job]
}

// putBack records jobs named, or keeps those not waiting here yet (a grant
// can reach a job between its decision's commit and its wait): the wait
// claims them when it starts (waitList.wait), or the next claim for all
// forgets them.
func (h *heardGrants) putBack(jobs []int64) {
	if len(jobs) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.jobs == nil {
		h.jobs = map[int64]bool{}
	}
	for _, id := range jobs {
		h.jobs[id] = true
	}
}

// take returns what was heard since the last take, and forgets it.
func (h *heardGrants) take() (jobs map[int64]bool, all bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	jobs, all = h.jobs, h.all
	h.jobs, h.all = nil, false
	return jobs, all
}

// Reconnect backoff of the grant listener's connection.
const (
	grantListenRetryMin = 100 * time.Millisecond
	grantListenRetryMax = 5 * time.Second
)

// grantListener holds, while the line poller runs, a dedicated connection
// that LISTENs on GrantChannel, and wakes the poller (wake) when a
// notification names this worker or every worker. Until it is connected,
// and whenever it loses its connection, the poller looks for grants every
// LinePoll itself (HasGrants), as it did before notifications.
type grantListener struct {
	l         *Limiter
	wake      chan struct{} // buffered 1: a claim is due
	heard     heardGrants
	listening atomic.Bool
}

// newGrantListener returns a listener for l, not started.
func newGrantListener(l *Limiter) *grantListener {
	return &grantListener{l: l, wake: make(chan struct{}, 1)}
}

// notifyAll asks the poller for a claim for every waiting job.
func (g *grantListener) notifyAll() {
	g.heard.add(grantNote{Worker: anyWorker})
	g.notify()
}

// notify asks the poller for a claim of what was heard (coalesced with one
// already asked).
func (g *grantListener) notify() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// run listens until ctx is done, reconnecting with backoff (db.Listener).
// Once connected it asks for a claim for all the waiting jobs (grants
// given before the LISTEN took effect); a notification for this worker or
// every worker asks for a claim of the jobs it names.
func (g *grantListener) run(ctx context.Context) {
	db.Listener{
		Pool:     g.l.pool,
		Channel:  GrantChannel,
		Listen:   func(ctx context.Context, q *db.Queries) error { return q.ListenGrants(ctx) },
		Logger:   g.l.logger,
		Lost:     "concurrency line: grant listener lost its connection; polling until it reconnects",
		RetryMin: grantListenRetryMin,
		RetryMax: grantListenRetryMax,
		Connected: func() {
			g.listening.Store(true)
			g.l.TestSignals.GrantListening.Signal(struct{}{})
			g.notifyAll()
		},
		Disconnected: func() { g.listening.Store(false) },
		Notified: func(n *pgconn.Notification) {
			var note grantNote
			if err := json.Unmarshal([]byte(n.Payload), &note); err != nil {
				return // not a note of this version: the periodic claim finds it
			}
			if note.Worker == g.l.workerID || note.Worker == anyWorker {
				g.heard.add(note)
				g.notify()
			}
		},
	}.Run(ctx)
}
