package limiter

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/db"
)

// LinePoll is the line poller's tick: while its grant listener is not
// connected, how often a worker with jobs waiting in the line looks for
// the grants another process gave them (a release in another worker, a
// limit raised by the CLI, the safety net); connected, it claims when a
// notification names them (grant_listener.go).
const LinePoll = 5 * time.Millisecond

// handOverReadEvery is every how many polls the poller reads the state of
// the kinds whose freed slots may be handed over (handover.go): every
// 20 ms, well within handOverFresh.
const handOverReadEvery = 4

// claimEvery is every how many polls the poller claims for all its waiting
// jobs whatever it heard or HasGrants saw: every 50 ms, it finds the jobs
// whose place in the line went (their limits were cleared), and any grant
// a notification missed (the listener reconnecting) or the quick look
// cannot see.
const claimEvery = 10

// waitOutcome is how a job's wait in the line ended.
type waitOutcome int

const (
	waitGranted   waitOutcome = iota // it got a grant: it runs (admitRequest.decision)
	waitGone                         // its place in the line went without a grant: decide again
	waitTimedOut                     // its park-after time passed
	waitCancelled                    // its context ended
)

// waitList is the worker's side of the line: its jobs that wait for a
// grant, each in its own goroutine (River's), until a grant comes, their
// place goes, their park-after time passes or their context ends. A grant
// from a transaction of this worker wakes its job at once (grant); while
// any job waits, a poller takes the grants other processes gave, as their
// notifications arrive (ClaimGrants, without the kind's lock: a grant is
// counted already).
type waitList struct {
	l *Limiter

	mu      sync.Mutex
	waiting map[int64]*waiter
	// handed are the jobs handed a slot in memory whose move is not
	// written yet (handover.go): a grant round passes them over.
	handed  map[int64]bool
	polling bool
	stopped bool
	// listener is the running poller's grant listener (nil: none).
	listener *grantListener
}

// waiter is one waiting job.
type waiter struct {
	req  *admitRequest
	wake chan waitOutcome // the poller's or a grant's word, once
}

// wait blocks until the wait of req ends and says how; a granted job's
// decision is set.
func (ws *waitList) wait(req *admitRequest) waitOutcome {
	w := &waiter{req: req, wake: make(chan waitOutcome, 1)}
	ws.mu.Lock()
	if ws.waiting == nil {
		ws.waiting = map[int64]*waiter{}
	}
	ws.waiting[req.job.ID] = w
	if !ws.polling && !ws.stopped {
		ws.polling = true
		go ws.poll()
	}
	gl := ws.listener
	ws.mu.Unlock()
	switch {
	case gl == nil:
	case req.takenAhead:
		// Taken ahead without a line transaction: a grant may have named no
		// worker (notified to all before it was taken); look now.
		gl.notifyAll()
	case gl.heard.has(req.job.ID):
		// Its grant's notification came before it waited here.
		gl.notify()
	}
	ws.l.decided.arrived(req.job.ID) // it waits here now (fetch.go)
	// The line orders the kind's jobs waiting here (lease.go, yield).
	ws.l.leases.yield(req.job.Kind)

	timer := time.NewTimer(time.Until(req.deadline))
	defer timer.Stop()
	out := waitTimedOut
	select {
	case o := <-w.wake:
		return o
	case <-timer.C:
	case <-req.ctx.Done():
		out = waitCancelled
	}
	ws.mu.Lock()
	if ws.waiting[req.job.ID] != w {
		// A grant or the poller took it meanwhile: their word stands.
		ws.mu.Unlock()
		return <-w.wake
	}
	delete(ws.waiting, req.job.ID)
	left := len(ws.waiting)
	ws.mu.Unlock()
	ws.l.gate.left(left)
	return out
}

// has reports whether a job of kind waits in the line in this worker.
func (ws *waitList) has(kind string) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for _, w := range ws.waiting {
		if w.req.job.Kind == kind {
			return true
		}
	}
	return false
}

// count is how many jobs wait in this worker.
func (ws *waitList) count() int {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return len(ws.waiting)
}

// finish ends the wait of job id with o (a granted job runs as decision);
// false if it no longer waits.
func (ws *waitList) finish(id int64, o waitOutcome, decision admission) bool {
	ws.mu.Lock()
	w := ws.waiting[id]
	if w != nil {
		delete(ws.waiting, id)
	}
	left := len(ws.waiting)
	ws.mu.Unlock()
	ws.l.gate.left(left)
	if w == nil {
		return false
	}
	if o == waitGranted {
		w.req.decision = decision
	}
	w.wake <- o
	return true
}

// takeOldest ends the wait of the oldest job of kind waiting here, not
// cancelled and older than before (0: any), granted a slot
// (handover.go), and returns it (nil: none).
func (ws *waitList) takeOldest(kind string, before int64) *admitRequest {
	ws.mu.Lock()
	var best *waiter
	for id, w := range ws.waiting {
		r := w.req
		if r.job.Kind != kind || r.key != "" || r.cancelled || r.ctx.Err() != nil || (before != 0 && id >= before) {
			continue
		}
		if best == nil || id < best.req.job.ID {
			best = w
		}
	}
	if best == nil {
		ws.mu.Unlock()
		return nil
	}
	delete(ws.waiting, best.req.job.ID)
	if ws.handed == nil {
		ws.handed = map[int64]bool{}
	}
	ws.handed[best.req.job.ID] = true
	left := len(ws.waiting)
	ws.mu.Unlock()
	ws.l.gate.left(left)
	best.req.decision = admitSlot
	best.wake <- waitGranted
	return best.req
}

// wasHanded reports whether job id was handed a slot here and the move is
// not written yet.
func (ws *waitList) wasHanded(id int64) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.handed[id]
}

// written forgets the hand-overs to ids, written.
func (ws *waitList) written(ids []int64) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for _, id := range ids {
		delete(ws.handed, id)
	}
}

// kinds returns the kinds of the jobs waiting here.
func (ws *waitList) kinds() []string {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	var kinds []string
	for _, w := range ws.waiting {
		if k := w.req.job.Kind; !slices.Contains(kinds, k) {
			kinds = append(kinds, k)
		}
	}
	return kinds
}

// grant wakes the jobs a transaction of this worker granted a slot (or a
// start) and claimed for them. A job no longer waiting (its wait just
// ended) finds the grant when it is decided again.
func (ws *waitList) grant(granted map[int64]admission) {
	for id, decision := range granted {
		ws.finish(id, waitGranted, decision)
	}
}

// pollLinger is how long the line poller, and its grant listener's
// connection, outlive the last wait in this worker: a worker whose jobs
// wait off and on keeps its connection.
const pollLinger = time.Second

// poll takes the grants that other processes gave the jobs waiting here:
// at once when the grant listener hears of one (grant_listener.go), else
// every LinePoll after a quick look (HasGrants) while the listener is not
// connected; every claimEvery polls it claims for all of them whatever it
// heard, which also sends the jobs whose place went to be decided again.
// It ends pollLinger after the last wait here ends, or when the worker
// stops.
func (ws *waitList) poll() {
	ctx, cancel := context.WithCancel(context.Background())
	gl := newGrantListener(ws.l)
	listened := make(chan struct{})
	go func() {
		defer close(listened)
		gl.run(ctx)
	}()
	defer func() {
		cancel()
		<-listened
	}()
	ws.mu.Lock()
	ws.listener = gl
	ws.mu.Unlock()
	ticker := time.NewTicker(LinePoll)
	defer ticker.Stop()
	var warned, idleSince time.Time
	polls := 0
	for {
		heard := false
		select {
		case <-ticker.C:
			polls++
		case <-gl.wake:
			heard = true
		}
		ws.mu.Lock()
		if len(ws.waiting) == 0 || ws.stopped {
			if idleSince.IsZero() {
				idleSince = time.Now()
			}
			if ws.stopped || time.Since(idleSince) >= pollLinger {
				ws.polling, ws.listener = false, nil
				ws.mu.Unlock()
				return
			}
			ws.mu.Unlock()
			continue
		}
		idleSince = time.Time{}
		// A tick claims for every job every claimEvery polls (and forgets
		// what was heard: the claim covers it); a notification, for the
		// jobs it named.
		all := !heard && polls%claimEvery == 0
		named, heardAll := map[int64]bool(nil), false
		if heard || all {
			named, heardAll = gl.heard.take()
			all = all || heardAll
		}
		ids := make([]int64, 0, len(ws.waiting))
		for id := range ws.waiting {
			if all || !heard || named[id] {
				ids = append(ids, id)
			}
		}
		var notYet []int64
		if heard && !all {
			for id := range named {
				if ws.waiting[id] == nil {
					notYet = append(notYet, id)
				}
			}
		}
		ws.mu.Unlock()
		gl.heard.putBack(notYet)
		if heard && !all && len(ids) == 0 {
			continue
		}
		if heard || all || !gl.listening.Load() {
			claimCtx, claimCancel := context.WithTimeout(ctx, batchTimeout)
			rows, err := ws.claim(claimCtx, ids, heard || all)
			claimCancel()
			if err != nil {
				if time.Since(warned) > time.Second {
					ws.l.logger.Warn("concurrency line: grants not taken; trying again", "error", err)
					warned = time.Now()
				}
				continue
			}
			for _, row := range rows {
				if heard && !row.Gone {
					ws.l.TestSignals.GrantHeard.Signal(row.JobID)
				}
				switch {
				case row.Gone:
					ws.finish(row.JobID, waitGone, admitRun)
				case row.Slot:
					ws.finish(row.JobID, waitGranted, admitSlot)
				default:
					ws.finish(row.JobID, waitGranted, admitRun)
				}
			}
		}
		if !heard && polls%handOverReadEvery == 0 {
			ws.readHandOvers()
		}
	}
}

// claim takes the grants of the waiting jobs ids; unless all, only when a
// quick look (HasGrants) sees one for this worker: the claim itself reads
// every waiting job's rows, a millisecond for a few hundred jobs, which
// every 5 ms was most of what the database spent under P10.
func (ws *waitList) claim(ctx context.Context, ids []int64, all bool) ([]*db.ClaimGrantsRow, error) {
	if !all {
		has, err := ws.l.pollQ.HasGrants(ctx, ws.l.workerID)
		if err != nil {
			return nil, err
		}
		if !has {
			return nil, nil
		}
	}
	return ws.l.pollQ.ClaimGrants(ctx, db.ClaimGrantsParams{WorkerID: ws.l.workerID, JobIds: ids})
}

// readHandOvers reads the state of the kinds of the jobs still waiting
// here, for the hand-over of freed slots in memory (handover.go).
func (ws *waitList) readHandOvers() {
	// A keyed kind hands nothing over: read again once a second (its
	// limits may change).
	kinds := slices.DeleteFunc(ws.kinds(), ws.l.handStates.keyedLately)
	if len(kinds) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	at := time.Now()
	rows, err := ws.l.q.HandOverStates(ctx, db.HandOverStatesParams{Kinds: kinds, WorkerID: ws.l.workerID})
	if err != nil {
		return // no fresh reading: freed slots go back to the line
	}
	ws.l.handStates.set(rows, at)
}

// stop ends the polling (the worker stops; its jobs have ended).
func (ws *waitList) stop() {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.stopped = true
}
