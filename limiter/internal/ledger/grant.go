package ledger

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/db"
)

// Grant round bounds.
const (
	// maxGrants caps the slots one grant round gives.
	maxGrants = 1000
	// maxTurnKeys caps the keys one grant round reads, in the round's
	// order (the next round starts with those it did not serve).
	maxTurnKeys = 256
	// minTurnKeys is the least a release's grant rounds read first of the
	// keys in the round's order (with twice the slots the release frees
	// more, at most twice the per-kind limit; see turnKeys): a round that
	// needs keys past them reads the order again, up to maxTurnKeys (see
	// round.spilled). Reading all 40-odd keys waiting took a round 2.9 ms
	// of a release's 6.5 (statement log) under 750 jobs a second over
	// 200,000 keys (P14).
	minTurnKeys = 4
	// maxFront caps the jobs a grant round reads per line.
	maxFront = 64
	// Lookahead is how many parked jobs of a kind a grant round keeps
	// resumed ahead of its free slots, under a concurrency limit and no
	// rate: they wait fetched in the workers and take the next slots that
	// free, sparing the resume and the fetch a slot would wait for. Per
	// key, the key's limit, at most Lookahead.
	Lookahead = 32
	// rateRetry is how soon a grant round runs again for a kind whose
	// line waits while its rate window has room.
	rateRetry = 10 * time.Millisecond
	// minRateWake is the least delay of a rate wake: a window that frees
	// a start within it is looked at after it, so that a wake grants
	// several starts at once rather than one per start.
	minRateWake = 2 * time.Millisecond
)

// GrantChannel is the channel a grant round notifies when it gives a slot
// to a job waiting in another worker; the payload is a GrantNote in JSON.
const GrantChannel = "sluice_grants"

// GrantNote is a grant notification's payload: jobs of Kind waiting in
// Worker got their slots (Jobs), or their starts only (Starts, under a
// rate alone), and run; Limits is the Tag of the kind's limits the round
// read under its lock. A note that names no job asks the worker to look
// for every job of its own that got one.
type GrantNote struct {
	Worker string  `json:"worker"`
	Kind   string  `json:"kind,omitempty"`
	Limits string  `json:"limits,omitempty"`
	Jobs   []int64 `json:"jobs,omitempty"`
	Starts []int64 `json:"starts,omitempty"`
}

// maxNotePayload bounds a notification's payload (Postgres takes 8000
// bytes): a note whose jobs do not fit names none (its worker looks for
// every job of its own that got a slot).
const maxNotePayload = 7900

// Granted is what the grant rounds of a transaction did.
type Granted struct {
	// Local are the grants to jobs waiting in this worker: each runs, with
	// a slot (Slot) or without (Run, under a rate alone); LocalOrder is
	// their jobs in the order the rounds picked them (the order they are
	// woken in: a key's turn before the room's rest).
	Local      map[int64]Action
	LocalOrder []int64
	// Resumed counts the parked jobs made available, per kind.
	Resumed map[string]int
	// Wakes are the kinds whose rate window frees a start for a job still
	// waiting, and when.
	Wakes map[string]time.Duration
	// Limits are the kinds' limits as read under their locks.
	Limits map[string]Limits
}

func newGranted() *Granted {
	return &Granted{Local: map[int64]Action{}, Resumed: map[string]int{}, Wakes: map[string]time.Duration{},
		Limits: map[string]Limits{}}
}

// line is a line of a grant round: a key's (or, without a partition, the
// kind's) front and room.
type line struct {
	key   string
	front []front
	// depth is how deep the line was read: a front that long may have
	// more jobs behind it.
	depth int
	// others is how many jobs of the line wait without being parked, in
	// its front or past it.
	others int
	next   int
	room   int
	// transit: an older job of the line holds a grant on its way to its
	// worker (resumed, not fetched yet): no job waiting in a worker is
	// granted past it, so that none starts before it.
	transit int64
	held    bool // a job still completing its parking holds up the rest
	// completing is the job that holds the line up while its parking
	// completes, when a grant may be reserved for it (see pick).
	completing *front
	// since is when the line began waiting for its next turn, served
	// when it last had one (zero: never), in microseconds since the epoch.
	since, served int64
	freesIn       time.Duration
}

// pick is a job given a slot (or a start) by a grant round.
type pick struct {
	front
	key string
}

// round is a grant round of one kind.
type round struct {
	tx    *Tx
	c     Limits
	st    grantKind
	lines []*line
	// lookahead: the kind's slots turned over: parked jobs are resumed
	// ahead of its free slots.
	lookahead bool
	picks     []pick
	ahead     []pick
	picked    map[int64]bool
	lastTurn  map[string]int
	// read is how many lines of the round's order a truncated read holds
	// (those up to its last key read in that order); -1: the read was
	// whole.
	read int
	// spilled: the round needs lines past those read (it gave or resumed
	// past them, or still could): a read of them all decides it, not this
	// one.
	spilled bool
}

// grant runs kind's grant round from st, what the transaction read: front
// (the lines and their room), pick (one job per line per turn, oldest first
// within a line, round-robin across lines, the lines served longest ago
// first, within every limit), write, after (the turns, the flags, the rate
// wake). It reports false, and writes nothing, when st holds only part of
// the kind's keys in the round's order and the round needs more of them
// (round.spilled): the caller reads them all and runs it again.
func (tx *Tx) grant(st grantKind, lookahead bool, out *Granted) (bool, error) {
	r := &round{tx: tx, c: st.limits(), st: st, lookahead: lookahead, picked: map[int64]bool{}, lastTurn: map[string]int{}}
	out.Limits[r.c.Kind] = r.c
	switch r.c.Regime() {
	case Breaker:
		return true, nil
	case Unlimited:
		// A row left without limits (cleared while its jobs held slots, or
		// by any SQL): its line goes, and the row once nothing of it is held.
		n, err := tx.liftLimits(r.c.Kind)
		out.Resumed[r.c.Kind] += n
		return true, err
	}
	capacity := r.front()
	r.pick(capacity)
	r.resumeAhead()
	if r.spilled {
		return false, nil
	}
	if tx.l.logger.Enabled(tx.ctx, slog.LevelDebug) {
		r.trace(capacity)
	}
	if err := r.write(out); err != nil {
		return false, err
	}
	r.after(out)
	return true, nil
}

// front sets up the round's lines and their room, and returns the kind's
// capacity: the slots free under its per-kind limit and the starts left in
// its window, at most maxGrants.
func (r *round) front() int {
	c, st := r.c, r.st
	capacity := maxGrants
	if f := c.kindFree(); f >= 0 {
		capacity = min(capacity, int(f))
	}
	if c.KindRate() {
		capacity = min(capacity, max(int(c.RateMax-st.Starts), 0))
	}
	r.read = -1
	if !c.Keyed() {
		l := &line{front: st.Front, depth: maxFront, room: capacity}
		for _, e := range st.Front {
			if !e.Parked {
				l.others++ // the kind's line is read whole: its front counts them
			}
		}
		if st.OldestReserved != nil {
			l.transit = *st.OldestReserved
		}
		r.lines = []*line{l}
		return capacity
	}
	for _, k := range st.Keys {
		l := &line{key: k.Key, front: k.Front, depth: st.KeyDepth, others: k.Others, room: capacity}
		if c.KeyMax > 0 {
			l.room = min(l.room, int(c.KeyMax-k.Slots))
		}
		if c.KeyRate() {
			l.room = min(l.room, int(c.RateMax-k.Starts))
			if k.FreesInMs != nil {
				l.freesIn = ms(*k.FreesInMs)
			}
		}
		if k.OldestReserved != nil {
			l.transit = *k.OldestReserved
		}
		if k.SinceUs != nil {
			l.since = *k.SinceUs
		}
		if k.ServedUs != nil {
			l.served = *k.ServedUs
		}
		r.lines = append(r.lines, l)
		if st.Short && k.Turn {
			r.read = len(r.lines)
		}
	}
	return capacity
}

// pick gives the kind's capacity to the front of its lines, one job per
// line per turn. Under a kind-wide limit over keys (the fairness
// promise), a line held up by a job still completing its parking is owed
// its turn before any line that began waiting after it (served since it
// began waiting, or arrived since) has one: that job gets the slot,
// reserved until its parking completes and resumes it
// (LedgerGrantParked), rather than the other line a turn ahead of it.
// Owed stays owed from turn to turn: a line ahead of it in the round's
// order that had its turn in this round does not take a second before it.
func (r *round) pick(capacity int) {
	fair := r.c.Keyed() && r.c.Regime() == KindWide
	var owed *line // the first line held up by a completing parking, in the round's order, until it is given its turn
	for turn := 1; capacity > 0; turn++ {
		progress := false
		for i, l := range r.lines {
			if capacity == 0 {
				break
			}
			if r.read >= 0 && (turn > 1 || i >= r.read) {
				// Past the lines read, or round again: a line not read
				// comes first.
				r.spilled = true
				return
			}
			if l.room <= 0 {
				continue
			}
			var e *front
			if !l.held {
				e = r.next(l)
			}
			if e == nil {
				if fair && owed == nil && l.completing != nil && !r.picked[l.completing.JobID] {
					owed = l
				}
				continue
			}
			if owed != nil && r.cameSince(l, owed) {
				r.take(owed, owed.completing)
				owed = nil
				capacity--
				progress = true
				if capacity == 0 {
					l.next-- // e is not taken
					break
				}
			}
			r.take(l, e)
			capacity--
			progress = true
		}
		if !progress {
			// Room left that the lines read cannot take: one not read may.
			r.spilled = r.read >= 0
			break
		}
	}
}

// trace logs the round at debug level, for diagnosis (the torture test's
// TORTURE_WORKER_LOGS with TORTURE_DEBUG): its capacity, its picks, and its
// lines in the round's order, each with when it was served and began
// waiting (ms within the minute), its room left, whether it is held (by a
// parking completing), and its front (job/parked/ready/completing, the
// first 8).
func (r *round) trace(capacity int) {
	var b strings.Builder
	for _, l := range r.lines {
		fmt.Fprintf(&b, "[%s served=%d since=%d room=%d held=%t completing=%t front=", l.key, l.served/1000%60000,
			l.since/1000%60000, l.room, l.held, l.completing != nil)
		for i, e := range l.front {
			if i == 8 {
				b.WriteString("...")
				break
			}
			fmt.Fprintf(&b, "%d/%t/%t/%t,", e.JobID, e.Parked, e.Ready, e.Completing)
		}
		b.WriteString("] ")
	}
	picks := make([]int64, 0, len(r.picks))
	for _, p := range r.picks {
		picks = append(picks, p.JobID)
	}
	r.tx.l.logger.Debug("concurrency limits: round", "kind", r.c.Kind, "capacity", capacity, "picks", fmt.Sprint(picks),
		"lines", b.String())
}

// take gives e, the front job of l, a slot (or a start) in this round.
func (r *round) take(l *line, e *front) {
	r.picks = append(r.picks, pick{front: *e, key: l.key})
	r.picked[e.JobID] = true
	r.lastTurn[l.key] = len(r.picks)
	if (e.Parked || e.worker() == "") && l.transit == 0 {
		l.transit = e.JobID // on its way: the younger ones waiting in workers wait for it to start
	}
	l.room--
}

// cameSince reports whether line l began waiting for its turn after owed
// began waiting for its next: it had a turn in this round, or one since,
// or, never served, it arrived since. A key whose line emptied loses its
// row, and with it when it was served: back with a new job, it counts as
// arrived then (seed 120235358: keys served as a key's job waited came
// back and took their second turns ahead of it while it completed its
// parking).
func (r *round) cameSince(l, owed *line) bool {
	if _, ok := r.lastTurn[l.key]; ok {
		return true
	}
	return l.since != 0 && l.since > owed.since
}

// next is the next job of l a grant may go to (nil: none now): in job-id
// order, past those picked. A parked job still completing its parking (its
// worker committed it; River has not moved it to pending yet) cannot be
// resumed yet and holds up the younger jobs of its line; one late in
// completing it (more than 5 s: its worker is gone, it waits for a rescue)
// is passed over. A job waiting in a worker is not granted past an older
// job of its line on its way to its worker.
func (r *round) next(l *line) *front {
	for ; l.next < len(l.front); l.next++ {
		e := &l.front[l.next]
		switch {
		case r.picked[e.JobID]:
			continue
		case !e.Ready:
			l.held = true
			if e.Parked && e.Completing {
				l.completing = e
			}
			return nil
		case e.Parked && !e.Resumable:
			continue
		case e.worker() != "" && l.transit != 0 && l.transit < e.JobID:
			l.held = true
			return nil
		}
		l.next++
		return e
	}
	return nil
}

// resumeAhead picks parked jobs to resume ahead of a free slot (the
// lookahead), when the kind's slots turned over, under a concurrency limit
// and no rate: up to Lookahead per kind less those ahead already, per key
// its limit.
func (r *round) resumeAhead() {
	c := r.c
	if !r.lookahead || c.RateMax > 0 || (c.Max <= 0 && c.KeyMax <= 0) {
		return
	}
	budget := Lookahead - r.st.Ahead
	for _, p := range r.picks {
		if !p.Parked && p.worker() == "" {
			budget++ // granted now: no longer ahead
		}
	}
	perKey := Lookahead
	if c.Keyed() {
		if c.KeyMax <= 0 {
			return
		}
		perKey = min(int(c.KeyMax), Lookahead)
	}
	for i, l := range r.lines {
		if budget <= 0 {
			break
		}
		if r.read >= 0 && i >= r.read {
			break // a line not read may come first: it resumes on a later round
		}
		// The key's jobs waiting in a worker, or ahead already, take its
		// budget first, wherever they stand in its line (one ahead already
		// may be younger than a job parked since).
		keyBudget := perKey - l.others
		for _, e := range l.front {
			if !e.Parked && r.picked[e.JobID] {
				keyBudget++ // granted now: it waits no more
			}
		}
		for i := range l.front {
			e := &l.front[i]
			if budget <= 0 || keyBudget <= 0 {
				break
			}
			if r.picked[e.JobID] || !e.Parked {
				continue
			}
			if !e.Ready {
				break // still completing its parking: the younger wait
			}
			if e.Resumable && !e.Ahead {
				r.ahead = append(r.ahead, pick{front: *e, key: l.key})
				r.picked[e.JobID] = true
				keyBudget--
				budget--
			}
		}
	}
}

// write writes the round's grants and resumes: a job waiting in a worker
// gets its slot, and its start reserved under a rate (claimed when it
// starts: its worker is notified, or, this worker, told at once);
// a parked job is resumed with a slot reserved for it; a job resumed ahead
// and not fetched yet gets a slot reserved; the jobs resumed ahead wait in
// the line without a worker.
func (r *round) write(out *Granted) error {
	tx, c := r.tx, r.c
	kind := c.Kind
	var slots db.LedgerInsertSlotsParams
	var parked db.LedgerGrantParkedParams
	var reservedStarts db.LedgerStartsParams
	var unwait []int64
	notes := map[string]*GrantNote{}
	for _, p := range r.picks {
		worker := p.worker()
		switch {
		case p.Parked:
			parked.JobIds, parked.Keys = append(parked.JobIds, p.JobID), append(parked.Keys, p.key)
			out.Resumed[kind]++
			continue
		case worker == "":
			// Resumed ahead, not fetched yet: the slot is reserved until it
			// is (its worker claims it then).
			if c.RateMax > 0 {
				reservedStarts.JobIds, reservedStarts.Keys = append(reservedStarts.JobIds, p.JobID), append(reservedStarts.Keys, p.key)
			}
		default:
			unwait = append(unwait, p.JobID)
			if c.RateMax > 0 {
				// Reserved until the job starts (its worker claims it then):
				// counted whatever the time until then.
				reservedStarts.JobIds, reservedStarts.Keys = append(reservedStarts.JobIds, p.JobID), append(reservedStarts.Keys, p.key)
			}
			r.tell(out, notes, p.JobID, worker)
		}
		if c.Slotted() {
			slots.JobIds, slots.Kinds, slots.Keys = append(slots.JobIds, p.JobID), append(slots.Kinds, kind), append(slots.Keys, p.key)
			slots.WorkerIds = append(slots.WorkerIds, worker)
			tx.counts.addSlots(kind, p.key, 1)
		}
	}
	if len(slots.JobIds) > 0 {
		if err := tx.q.LedgerInsertSlots(tx.ctx, slots); err != nil {
			return fmt.Errorf("grant %s slots: %w", kind, err)
		}
	}
	if len(reservedStarts.JobIds) > 0 {
		reservedStarts.Kind, reservedStarts.Reserved = kind, true
		if err := tx.q.LedgerStarts(tx.ctx, reservedStarts); err != nil {
			return fmt.Errorf("grant %s starts: %w", kind, err)
		}
	}
	if len(unwait) > 0 {
		if err := tx.q.LedgerUnwait(tx.ctx, unwait); err != nil {
			return fmt.Errorf("take granted %s jobs out of the line: %w", kind, err)
		}
	}
	if len(parked.JobIds) > 0 {
		parked.Kind, parked.WithSlot, parked.WithStart = kind, c.Slotted(), c.RateMax > 0
		if err := tx.q.LedgerGrantParked(tx.ctx, parked); err != nil {
			return fmt.Errorf("resume parked %s jobs: %w", kind, err)
		}
	}
	if len(r.ahead) > 0 {
		a := db.LedgerResumeAheadParams{Kind: kind}
		for _, p := range r.ahead {
			a.JobIds, a.Keys, a.Reasons = append(a.JobIds, p.JobID), append(a.Keys, p.key), append(a.Reasons, p.Reason)
		}
		if err := tx.q.LedgerResumeAhead(tx.ctx, a); err != nil {
			return fmt.Errorf("resume %s jobs ahead: %w", kind, err)
		}
		out.Resumed[kind] += len(r.ahead)
	}
	if len(notes) > 0 {
		if err := tx.q.NotifyGrants(tx.ctx, notePayloads(notes)); err != nil {
			return fmt.Errorf("notify the workers of %s grants: %w", kind, err)
		}
	}
	return nil
}

// tell has job id, granted while it waits in worker's line, told of its
// grant: at once when it waits in this worker (out.Local), else by a note
// to its worker (notes, sent as the round commits).
func (r *round) tell(out *Granted, notes map[string]*GrantNote, id int64, worker string) {
	c := r.c
	if worker == r.tx.l.worker {
		if _, ok := out.Local[id]; !ok {
			out.LocalOrder = append(out.LocalOrder, id)
		}
		out.Local[id] = Run
		if c.Slotted() {
			out.Local[id] = Slot
		}
		return
	}
	n := notes[worker]
	if n == nil {
		n = &GrantNote{Worker: worker, Kind: c.Kind, Limits: c.Tag()}
		notes[worker] = n
	}
	if c.Slotted() {
		n.Jobs = append(n.Jobs, id)
	} else {
		n.Starts = append(n.Starts, id)
	}
}

// after records the turns of the keys served (their order within the
// round aside: they all go to the end), clears the waiting flags of the
// keys whose line emptied and, when nothing waits for the kind itself any
// more, its flag; and, under a rate, when jobs still wait, when a window
// frees a start next.
func (r *round) after(out *Granted) {
	tx, c, kind := r.tx, r.c, r.c.Kind
	left := false // jobs of the lines read still wait
	for _, l := range r.lines {
		waiting := false
		for _, e := range l.front {
			if !r.picked[e.JobID] || (e.Parked && r.isAhead(e.JobID)) {
				waiting = true
			}
		}
		if len(l.front) >= l.depth {
			waiting = true // read only in part
		}
		left = left || waiting
		if c.Keyed() {
			tx.counts.setWaiting(kind, l.key, waiting)
			if _, ok := r.lastTurn[l.key]; ok && c.Regime() == KindWide {
				tx.counts.served(kind, l.key)
			}
		}
	}
	complete := !c.Keyed() || (!r.st.TurnMore && len(r.st.Keys) < maxTurnKeys)
	// Without a partition the kind's one line, read whole, is all that
	// waits for it (the jobs picked now wait no more); with one, a key not
	// read may hold a job waiting for the kind.
	if c.HasParked && complete && (!c.Keyed() || !r.st.KindWaiting) && !left {
		tx.counts.setHasParked(kind, false)
	}
	if c.RateMax == 0 || !left {
		return
	}
	wake := c.RatePeriod // at the latest a period from now
	if c.KindRate() {
		switch {
		case c.RateMax > r.st.Starts+int32(len(r.picks)) && c.kindFree() != 0:
			wake = rateRetry // room again (the window moved on), or a front still completing its parking
		case r.st.FreesInMs != nil:
			wake = min(wake, ms(*r.st.FreesInMs))
		}
	} else {
		for _, l := range r.lines {
			if l.freesIn > 0 && l.room <= 0 {
				wake = min(wake, l.freesIn)
			}
		}
	}
	out.Wakes[kind] = max(wake, minRateWake)
}

// isAhead reports whether the round resumed job id ahead of a slot (it
// still waits for one).
func (r *round) isAhead(id int64) bool {
	for _, p := range r.ahead {
		if p.JobID == id {
			return true
		}
	}
	return false
}

// notePayloads are the notes of grants to jobs waiting in other workers,
// one per worker, as NotifyGrants sends them.
func notePayloads(notes map[string]*GrantNote) []string {
	out := make([]string, 0, len(notes))
	for worker, n := range notes {
		b, err := json.Marshal(n)
		if err != nil || len(b) > maxNotePayload {
			b, _ = json.Marshal(GrantNote{Worker: worker})
		}
		out = append(out, string(b))
	}
	sort.Strings(out)
	return out
}
