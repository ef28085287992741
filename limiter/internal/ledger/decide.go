package ledger

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/sluice-dev/sluice/db"
)

// Decision bounds.
const (
	// maxAhead caps how many waiting jobs of a line a decision counts.
	maxAhead = 256
	// maxSteals caps how many grants of younger jobs of a line, on their
	// way, a decision reads (each older job of the decision held by a full
	// limit may take one: steals).
	maxSteals = 64
	// minWaitCap and maxWaitCap bound Limits.WaitCap.
	minWaitCap = 8
	maxWaitCap = 256
	// WaitSlotShare is the share of a worker's River slots (one in
	// WaitSlotShare) that the jobs of one line may hold waiting at least
	// (Limits.WaitCap): a worker with many River slots lets a busy key's
	// jobs wait rather than park at their fetch (each parking costs a
	// resume and a fetch again), while a small worker keeps most of its
	// slots for the jobs of other keys.
	WaitSlotShare = 8
)

// Job is a job of a limited kind for the ledger to decide: fetched by
// this worker (or, with Reserve, about to be inserted).
type Job struct {
	ID   int64
	Kind string
	// Args are its args as River fetched them (its key, for its lock).
	Args []byte
	// FetchedAt is when its attempt was fetched (attempted_at): a slot or
	// a start taken since is this attempt's.
	FetchedAt time.Time
	// Attempt is its attempt (a late parking leaves a job alone that runs
	// another one).
	Attempt int
	// Dispatched: River's executor has it (the middleware decides it). It
	// parks by being marked, River's completion parking it; a job not
	// dispatched yet (decided at its fetch) parks at once, and River never
	// sees it.
	Dispatched bool
	// TimedOut: its wait in the worker is over: it takes a grant it got, or
	// parks (but a job resumed ahead, whose place is the line's, waits on).
	TimedOut bool
	// Cancelled: JobCancel came while it waited: it parks, and its parking
	// cancels it (it never ran).
	Cancelled bool
	// Reserve: decide for a job not fetched yet, and reserve what it would
	// take (sluice run); never wait, never park.
	Reserve bool
	// NoWait: it may neither wait nor park (sluice run's worker, whose job
	// reserved its slot before it started): it fails instead.
	NoWait bool
	// Recheck: it was decided before a change of its kind's limits that
	// its worker heard, and has not begun: unless it holds what the limits
	// now ask (a slot under a concurrency limit, a start under a rate;
	// nothing will do under a circuit breaker), what it holds goes back and
	// it is decided afresh in the same transaction.
	Recheck bool
	// Slots is its worker's River slots for its queue (the most River asked
	// for in one fetch; 0: not known): a line is long against them
	// (Limits.WaitCap).
	Slots int
	// HeldBehind: a younger job of its key in this worker holds a slot of
	// the line and has not started (held back for it): rather than park
	// (timed out, or its line long), it waits, and its worker gives it
	// that slot (Swap).
	HeldBehind bool
}

// Action is what the ledger decided for a job.
type Action int

const (
	// Run: it runs without a slot (no limit, or only a rate: its start is
	// logged).
	Run Action = iota
	// Slot: it runs, and holds a slot until it ends.
	Slot
	// Wait: it waits in the line, in this worker, for a grant.
	Wait
	// Parked: it parked in place (or, dispatched, will park when River
	// completes it).
	Parked
	// Fail: it cannot start and may not wait (Reserve: nothing reserved).
	Fail
	// StepBack: it came ahead of a free slot, and an older job of its line
	// (or, under a kind-wide limit with every slot taken, a job of another
	// key) holds a grant and waits to be fetched: it goes back to available
	// (or, dispatched, will when River completes it), still in the line,
	// so that its worker's River slot fetches the granted one.
	StepBack
)

// Decision is what the ledger decided for a job.
type Decision struct {
	Job    int64
	Kind   string
	Key    string
	Action Action
	// Reason is what holds it (Wait, Parked, Fail).
	Reason string
	// Ahead: it waits without a deadline: it came ahead of a free slot,
	// and its place in the line is the line's.
	Ahead bool
	// LongLine: it parked at its fetch because its line was long already
	// (the wait cap of jobs ahead of it): the jobs behind it park too, and
	// can before they are fetched (ParkAhead).
	LongLine bool
	// GaveBack: the job held a grant (a slot, a start) that the decision
	// gave back (it was decided afresh): a grant its worker heard of while
	// the job was deciding may be that one, and stands no more.
	GaveBack bool
}

// Decided is what a decision did.
type Decided struct {
	// Decisions are in the order of the jobs.
	Decisions []Decision
	// Recheck are the kinds with room free while jobs wait for their turn,
	// and the keys of those jobs' lines (kind → keys): a grant round is
	// due, of those lines (Release.KeyRounds: under per-key limits alone
	// those lines only, else the kind's whole line).
	Recheck map[string][]string
	// Wakes are the kinds whose rate window frees a start for a waiting
	// job, and when.
	Wakes map[string]time.Duration
	// Limits are the kinds' limits as read under their locks.
	Limits map[string]Limits
}

// Decide decides jobs of limited kinds, in one transaction per call:
// in job-id order within a kind, each takes a grant it holds, starts when
// every limit of its kind has room and no job waits ahead of it (older
// jobs of its key waiting, or jobs waiting for the kind
// itself), or else waits in the line, in this worker, until parkAfter, or
// parks at once: a circuit breaker, a rate window that frees too late, a
// key (a kind without a partition) with its WaitCap of jobs waiting already
// (waiting there would only hold a River slot of this worker that a job
// of another key could start on), or a wait that is over. guess is the
// worker's copy of the kinds' limits (for the locks: read again under
// them). heldBehind, when not nil, tells each job's HeldBehind as the
// decision reads the line under the kinds' locks: a grant that a younger
// job of its key took while the job's decision waited for the locks holds
// that job back in its worker, and it is the job's to take (Swap) rather
// than park behind.
func (l *Ledger) Decide(ctx context.Context, jobs []Job, guess map[string]Limits, parkAfter time.Duration,
	heldBehind func(Job) bool) (*Decided, error) {
	var out *Decided
	err := withRelock(guess, func(guess map[string]Limits) error {
		kinds, keys := decideLocks(jobs, guess)
		locks := locksFor(kinds, guess, keys)
		return l.run(ctx, locks, func(tx *Tx) error {
			var err error
			out, err = tx.decide(locks, guess, kinds, jobs, parkAfter, heldBehind)
			return err
		})
	})
	if err != nil {
		return nil, fmt.Errorf("decide: %w", err)
	}
	return out, nil
}

// decideLocks are the kinds of jobs (sorted), and, for a kind under
// per-key limits alone, the keys of its jobs (from their args, by the
// partition guessed).
func decideLocks(jobs []Job, guess map[string]Limits) ([]string, map[string][]string) {
	var kinds []string
	keys := map[string][]string{}
	for _, j := range jobs {
		if !slices.Contains(kinds, j.Kind) {
			kinds = append(kinds, j.Kind)
		}
		if lim, ok := guess[j.Kind]; ok && lim.Regime() == Keys {
			if key, ok := PartitionKey(j.Args, lim.Fields); ok {
				keys[j.Kind] = append(keys[j.Kind], key)
			}
		}
	}
	sort.Strings(kinds)
	return kinds, keys
}

// decided is a job of a decision, with what the ledger holds for it and
// what it decided.
type decided struct {
	Job
	h        jobHolding
	d        Decision
	giveBack bool // it gives back what it holds (a grant, its place)
	granted  bool // it held a grant (a slot, a start) as the decision read it
	claim    bool // it claims its grant
	restamp  bool // the start it holds is logged again, now
	admit    bool // it takes a slot (or logs a start) now
	// keepsTurn: it gives back a grant (or a slot) that its key's turn
	// gave it, because the limits changed since; decided afresh, it keeps
	// that turn (blocker).
	keepsTurn bool
	// steal: it takes the slot reserved for a younger job of its line on
	// its way (that one waits in the line again, resumed ahead).
	steal int64
}

// decide reads the jobs' state under the locks and decides them.
func (tx *Tx) decide(locks []lock, guess map[string]Limits, kinds []string, jobs []Job, parkAfter time.Duration,
	heldBehind func(Job) bool) (*Decided, error) {
	st, err := tx.readDecideState(guess, kinds, jobs)
	if err != nil {
		return nil, err
	}
	limits := make(map[string]Limits, len(kinds))
	lines := map[string]kindLine{}
	for _, kind := range kinds {
		limits[kind] = Limits{Kind: kind}
	}
	for _, k := range st.Kinds {
		limits[k.Kind] = k.limits()
		lines[k.Kind] = k
	}
	if err := checkLocks(locks, guess, limits); err != nil {
		return nil, err
	}
	holdings := make(map[int64]jobHolding, len(st.Jobs))
	for _, h := range st.Jobs {
		holdings[h.JobID] = h
	}
	if err := keysLocked(locks, jobs, holdings); err != nil {
		return nil, err
	}
	keyLines := map[keyRef]*keyLine{}
	for i := range st.Keys {
		k := &st.Keys[i]
		keyLines[keyRef{k.Kind, k.Key}] = k
	}
	out := &Decided{Recheck: map[string][]string{}, Wakes: map[string]time.Duration{}, Limits: limits}
	byKind := map[string][]*decided{}
	all := make([]*decided, len(jobs))
	for i, j := range jobs {
		h := holdings[j.ID]
		d := &decided{Job: j, h: h, granted: h.granted()}
		if heldBehind != nil {
			d.HeldBehind = heldBehind(j)
		}
		d.d = Decision{Job: j.ID, Kind: j.Kind, Key: d.h.Key}
		all[i] = d
		byKind[j.Kind] = append(byKind[j.Kind], d)
	}
	w := &decideWrites{}
	now := time.Now()
	for _, kind := range kinds {
		ds := byKind[kind]
		sort.Slice(ds, func(i, j int) bool { return ds[i].ID < ds[j].ID })
		c := limits[kind]
		if c.Regime() == Unlimited {
			for _, d := range ds {
				d.d.Action = Run
				d.giveBack = d.h.SlotReserved || d.h.StartReserved || d.h.SlotHeld || d.h.Waiter
			}
		} else {
			kd := kindDecision{c: c, line: lines[kind], keys: keyLines, parkAfter: parkAfter, now: now}
			kd.decide(ds)
			if len(kd.recheck) > 0 {
				out.Recheck[kind] = kd.recheck
			}
			if kd.wakeIn > 0 {
				out.Wakes[kind] = kd.wakeIn
			}
		}
		for _, d := range ds {
			w.add(tx, c, d)
		}
	}
	if err := w.write(tx); err != nil {
		return nil, err
	}
	out.Decisions = make([]Decision, len(all))
	for i, d := range all {
		d.d.GaveBack = d.giveBack && d.granted
		out.Decisions[i] = d.d
	}
	return out, nil
}

// readDecideState reads, under the locks, the state of jobs (their keys
// by the partitions of guess) and of their kinds' lines.
func (tx *Tx) readDecideState(guess map[string]Limits, kinds []string, jobs []Job) (*decideState, error) {
	p := db.LedgerDecideStateParams{MaxAhead: maxAhead, MaxSteals: int32(min(len(jobs), maxSteals)), Kinds: kinds, WorkerID: tx.l.worker}
	for _, j := range jobs {
		key, _ := PartitionKey(j.Args, guess[j.Kind].Fields)
		fetched := j.FetchedAt
		if fetched.IsZero() {
			fetched = time.Now()
		}
		p.JobIds, p.JobKinds, p.JobKeys, p.FetchedAts = append(p.JobIds, j.ID), append(p.JobKinds, j.Kind), append(p.JobKeys, key),
			append(p.FetchedAts, fetched)
	}
	raw, err := tx.q.LedgerDecideState(tx.ctx, p)
	if err != nil {
		return nil, fmt.Errorf("read the line: %w", err)
	}
	return decode[decideState](raw, "the line")
}

// keysLocked checks that every job of a kind locked shared has its key's
// row locked: the key the database computes from its args is the one the
// worker computed (ledger.PartitionKey) and locked.
func keysLocked(locks []lock, jobs []Job, holdings map[int64]jobHolding) error {
	for _, k := range locks {
		if !k.shared {
			continue
		}
		for _, j := range jobs {
			if h, ok := holdings[j.ID]; ok && j.Kind == k.kind && !slices.Contains(k.keys, h.Key) {
				return fmt.Errorf("job %d of %s: its key %q is not the one its args gave the worker", j.ID, j.Kind, h.Key)
			}
		}
	}
	return nil
}

// kindDecision decides the jobs of one limited kind from its limits and
// line, counting what it decides as it goes.
type kindDecision struct {
	c         Limits
	line      kindLine
	keys      map[keyRef]*keyLine
	parkAfter time.Duration
	now       time.Time
	// recheck are the keys of the lines where room was free while jobs
	// wait for their turn only ("": the kind's line; recheckLine).
	recheck []string
	// wakeIn is when a rate window frees a start for a waiting job.
	wakeIn time.Duration
	// batch is the kind's jobs of the decision, in job-id order.
	batch []*decided
	// stolen are the grants the decision's jobs took so far (steals).
	stolen map[int64]bool
}

// recheckLine notes that room is free while jobs of d's line wait for
// their turn only: a grant round of that line is due.
func (k *kindDecision) recheckLine(d *decided) {
	if !slices.Contains(k.recheck, d.h.Key) {
		k.recheck = append(k.recheck, d.h.Key)
	}
}

// keyOf is the line of d's key (of the kind, without a partition).
func (k *kindDecision) keyOf(d *decided) *keyLine {
	if !k.c.Keyed() {
		l := k.keys[keyRef{k.c.Kind, ""}]
		if l == nil {
			l = &keyLine{Kind: k.c.Kind, Front: k.line.Front, Ahead: k.line.Ahead, ReservedSlots: k.line.ReservedSlots,
				ReservedStarts: k.line.ReservedStarts, ReservedBoth: k.line.ReservedBoth, Transit: k.line.Transit, Fetched: k.line.Fetched,
				Waiting: k.line.Waiting}
			k.keys[keyRef{k.c.Kind, ""}] = l
		}
		return l
	}
	r := keyRef{k.c.Kind, d.h.Key}
	l := k.keys[r]
	if l == nil {
		l = &keyLine{Kind: k.c.Kind, Key: d.h.Key}
		k.keys[r] = l
	}
	return l
}

// decide decides ds (in job-id order).
func (k *kindDecision) decide(ds []*decided) {
	k.batch = ds
	for _, d := range ds {
		k.decideOne(d)
	}
}

// decideOne decides d by what it holds: what it was decided or granted
// before, if that still stands, else afresh (decideNew).
func (k *kindDecision) decideOne(d *decided) {
	h, ks := d.h, k.keyOf(d)
	switch {
	case d.Cancelled:
		// Cancelled while it waited: it parks whatever it holds (its
		// parking cancels it; what it holds is given back).
		d.d.Action, d.d.Reason, d.giveBack = Parked, ReasonLimit, true
	case (d.Recheck || h.SlotHeld || h.StartHeld) && !k.holdsAll(d, ks):
		// Decided or granted before the limits now in force, not begun,
		// and not holding what they ask: what it holds goes back and it is
		// decided afresh, in this transaction (no younger job takes its
		// slot between). Under a breaker, that parks it. So is a job
		// decided again for its own reasons (its wait ended as a grant
		// came) that holds a grant made before a change its worker has
		// not heard yet (seed 256556233: a slot granted before a rate was
		// set, and a start it never had).
		d.keepsTurn = h.granted()
		k.giveBack(d, ks)
		k.decideNew(d, ks)
	case h.SlotHeld || h.StartHeld:
		d.d.Action = Run
		if h.SlotHeld {
			d.d.Action = Slot
		}
		// A start reserved with its grant is logged now, as it starts; one
		// logged earlier in this attempt (a grant that crossed its wait,
		// claimed then) is logged again now: a start counts in its window
		// from when its job begins.
		d.claim = h.StartReserved
		d.restamp = h.StartHeld
	case (h.SlotReserved || h.StartReserved) && k.c.Max < 0:
		// Granted before the kind became a circuit breaker: the grant
		// goes back, and the job parks (or, reserving, fails).
		d.d.Action, d.d.Reason, d.giveBack = Parked, ReasonBreaker, true
		if d.Reserve || d.NoWait {
			d.d.Action = Fail
		}
	case (h.SlotReserved || h.StartReserved) && d.Reserve:
		// Reserved already (sluice run asking again): nothing to write.
		d.d.Action = Run
		if h.SlotReserved {
			d.d.Action = Slot
		}
	case (h.SlotReserved || h.StartReserved) && (h.SlotReserved || !k.c.Slotted()) && (h.StartReserved || k.c.RateMax == 0):
		k.claimGrant(d, ks)
	case h.SlotReserved || h.StartReserved:
		// Part of a grant (its slot or its start went: a reaper, the
		// safety net, limits changed since): it goes back, and the job is
		// decided afresh.
		d.giveBack, d.keepsTurn = true, true
		d.h.SlotReserved, d.h.StartReserved = false, false
		k.decideNew(d, ks)
	default:
		k.decideNew(d, ks)
	}
}

// claimGrant decides d, which holds a whole grant (reserved for it by a
// grant round), to start on it.
func (k *kindDecision) claimGrant(d *decided, ks *keyLine) {
	d.claim, d.d.Action = true, Run
	if d.h.SlotReserved {
		d.d.Action = Slot
	}
	if ks.Waiting > d.ID {
		// Younger jobs of its line waiting in workers were held behind its
		// grant on its way: a grant round looks at the room left.
		k.recheckLine(d)
	}
}

// holdsAll reports whether job d (ks: its key's line) holds all the
// kind's limits ask of a job that starts: a slot under a concurrency
// limit, within it, a start under a rate; never under a circuit breaker.
// A limit lowered below the slots taken sends the slots not begun on back
// to the line, the youngest first: the slots that younger jobs of this
// batch hold, decided after d, go back before d's (torture seed
// 601894557: of two jobs of a key holding slots as its limit went from 3
// to 1, the older, decided first, gave its slot back, and the younger
// began).
func (k *kindDecision) holdsAll(d *decided, ks *keyLine) bool {
	c, h := k.c, d.h
	kindYounger, keyYounger := k.youngerHolding(d)
	over := (c.Max > 0 && c.Admitted-kindYounger > c.Max) || (c.KeyMax > 0 && ks.Slots-keyYounger > c.KeyMax)
	return c.Max >= 0 && (!c.Slotted() || ((h.SlotHeld || h.SlotReserved) && !over)) && (c.RateMax == 0 || h.StartHeld || h.StartReserved)
}

// youngerHolding counts the jobs of this batch younger than d (decided
// after it: the batch is in job-id order) that hold a slot taken and not
// begun on, of d's kind and of d's key.
func (k *kindDecision) youngerHolding(d *decided) (kind, key int32) {
	for _, y := range k.batch {
		if y.ID <= d.ID || !y.h.SlotHeld || y.h.SlotStale {
			continue
		}
		kind++
		if y.h.Key == d.h.Key {
			key++
		}
	}
	return kind, key
}

// giveBack gives back, in the decision's counts, what d holds (its slot,
// its start; written by the decision's release of it), so that it is
// decided afresh.
func (k *kindDecision) giveBack(d *decided, ks *keyLine) {
	h := &d.h
	d.giveBack = true
	if (h.SlotHeld && !h.SlotStale) || h.SlotReserved {
		if k.c.Admitted > 0 {
			k.c.Admitted--
		}
		if ks.Slots > 0 {
			ks.Slots--
		}
	}
	if h.StartHeld || h.StartReserved {
		if k.c.KindRate() && k.line.Starts > 0 {
			k.line.Starts--
		}
		if k.c.KeyRate() && ks.Starts > 0 {
			ks.Starts--
		}
	}
	h.SlotHeld, h.SlotReserved, h.StartHeld, h.StartReserved, h.SlotStale = false, false, false, false, false
}

// decideNew decides a job that holds nothing of the line but, maybe, its
// place (it came ahead).
func (k *kindDecision) decideNew(d *decided, ks *keyLine) {
	c := &k.c
	reason, orderOnly := k.blocker(d, ks)
	if k.steals(d, ks, reason, orderOnly) {
		reason = ""
	}
	if reason == "" {
		d.admit = true
		d.d.Action = Run
		if c.Slotted() {
			d.d.Action = Slot
			c.Admitted++
			ks.Slots++
		}
		if c.KindRate() {
			k.line.Starts++
		}
		if c.KeyRate() {
			ks.Starts++
		}
		if ks.Front > d.ID {
			// Younger jobs of its line wait (behind it while it was fetched
			// and not decided): a grant round looks at the room left.
			k.recheckLine(d)
		}
		return
	}
	k.hold(d, ks, reason, orderOnly)
}

// hold decides d, held by reason (orderOnly: only its turn holds it), to
// wait in the line, park, step back or fail, and counts it in its line.
func (k *kindDecision) hold(d *decided, ks *keyLine, reason string, orderOnly bool) {
	c := &k.c
	d.d.Reason = reason
	if orderOnly {
		k.recheckLine(d)
	}
	freesIn := time.Duration(0)
	switch reason {
	case ReasonRate:
		freesIn = ms(k.line.FreesInMs)
	case ReasonKeyRate:
		freesIn = ms(ks.FreesInMs)
	}
	if freesIn > 0 && (k.wakeIn == 0 || freesIn < k.wakeIn) {
		k.wakeIn = freesIn
	}
	switch {
	case d.Reserve || d.NoWait:
		d.d.Action = Fail
		return
	case reason == ReasonBreaker:
		d.d.Action = Parked
	case d.h.Ahead && !d.TimedOut && ks.Transit != 0 && ks.Transit < d.ID:
		// Resumed ahead, behind an older job of its line on its way: its
		// worker's River slot is for that one.
		d.d.Action = StepBack
		return
	case d.h.Ahead && !d.TimedOut && reason == ReasonLimit && c.Keyed() && k.line.Transit != 0:
		// Resumed ahead, held by the kind's limit while a job of another
		// key, granted one of the kind's slots at its key's turn, waits to
		// be fetched: its worker's River slot is for that one. Else the
		// jobs resumed ahead fill the workers' River slots and no grant of
		// the kind is ever fetched (seed 124141674).
		d.d.Action = StepBack
		return
	case d.h.Ahead && !d.TimedOut:
		// Resumed ahead of a free slot: it waits for one, as long as it
		// takes; its place in the line is the line's.
		d.d.Action, d.d.Ahead = Wait, true
	case d.HeldBehind && !d.Cancelled:
		// A younger job of its key in this worker holds a slot it has not
		// started on: it waits, and its worker swaps the two.
		d.d.Action = Wait
	case d.TimedOut:
		d.d.Action = Parked
	case !d.Dispatched && ks.Ahead >= k.c.WaitCap(d.Slots) && ks.Front != 0 && ks.Front < d.ID:
		// Its line is long already, and it is behind it: it parks now
		// rather than hold one of this worker's River slots, which a job of
		// another key could start on, for longer than its park-after time.
		// A job older than every job waiting (back from a retry, say) goes
		// to the front: it waits, and takes the slot of a younger job of its
		// key here granted one meanwhile (seed 375253967).
		d.d.Action, d.d.LongLine = Parked, true
	case freesIn > k.parkAfter:
		d.d.Action = Parked // its window frees after its wait would end
	default:
		d.d.Action = Wait
	}
	// Younger jobs of its key, and of the kind when it waits for the kind,
	// queue behind it.
	if ks.Front == 0 || d.ID < ks.Front {
		ks.Front = d.ID
	}
	ks.Ahead++
	if !KeyReason(reason) {
		c.HasParked = true
	}
}

// steals reports whether job d, held by the capacity of its kind or key
// (reason: its concurrency or rate; not its turn), takes instead what is
// reserved for the newest younger job of its line on its way (resumed, not
// fetched yet, or fetched with it) that no older job of the decision took:
// its slot and its start, as d needs them. Order is by job id within a
// line; the younger one waits in the line again: parked, if it was not
// fetched yet, else resumed ahead (LedgerStealGrants). Never for a
// reservation (sluice run).
func (k *kindDecision) steals(d *decided, ks *keyLine, reason string, orderOnly bool) bool {
	c := &k.c
	if orderOnly || d.Reserve {
		return false
	}
	switch reason {
	case ReasonLimit, ReasonKeyLimit, ReasonRate, ReasonKeyRate, ReasonFIFO, ReasonKeyFIFO:
		// Held by its turn, capacity holds it too (not orderOnly). Whatever
		// waits ahead of it, of other keys or of its own line, granted or
		// not: a steal only moves a grant from a younger job to an older
		// one, so it never passes a job the younger one would not pass
		// (seed 564674972: a retry, held behind an older job granted and
		// not fetched, parked at its fetch while two younger jobs fetched
		// with it began on slots reserved before it came back).
	default:
		return false // a breaker
	}
	var victims []int64
	switch {
	case c.Slotted() && c.RateMax > 0:
		// The newest with both reserved (another may hold a start alone:
		// granted while waiting in a worker, its slot its own).
		victims = ks.ReservedBoth
	case c.Slotted():
		victims = ks.ReservedSlots
	case c.RateMax > 0:
		victims = ks.ReservedStarts
	}
	// The newest not taken yet by an older job of the decision (jobs are
	// decided oldest first: each takes the newest grant left, so that a
	// batch of older jobs, retries come back together say, takes as many
	// grants of younger jobs as it needs, up to maxSteals).
	victim := int64(0)
	for _, v := range victims {
		if !k.stolen[v] {
			victim = v
			break
		}
	}
	if victim <= d.ID {
		return false
	}
	d.steal = victim
	if k.stolen == nil {
		k.stolen = map[int64]bool{}
	}
	k.stolen[victim] = true
	// What it held changes hands: the counts stay.
	if c.Slotted() {
		c.Admitted--
		ks.Slots--
	}
	if c.KindRate() {
		k.line.Starts--
	}
	if c.KeyRate() {
		ks.Starts--
	}
	for _, y := range k.batch {
		if y.ID == d.steal {
			y.h.SlotReserved, y.h.StartReserved, y.h.Waiter, y.h.Ahead = false, false, true, true
		}
	}
	return true
}

// blocker is what holds job d (ks: the line of its key) from starting now
// ("": nothing), and whether only its turn does (every limit has room: a
// grant round gives the room to the front of the line).
func (k *kindDecision) blocker(d *decided, ks *keyLine) (reason string, orderOnly bool) {
	c := &k.c
	if c.Max < 0 {
		return ReasonBreaker, false
	}
	capacity := ""
	switch {
	case c.Max > 0 && c.Admitted >= c.Max:
		capacity = ReasonLimit
	case c.KindRate() && k.line.Starts >= c.RateMax:
		capacity = ReasonRate
	case c.KeyMax > 0 && ks.Slots >= c.KeyMax:
		capacity = ReasonKeyLimit
	case c.KeyRate() && ks.Starts >= c.RateMax:
		capacity = ReasonKeyRate
	}
	keyFIFO := ReasonKeyFIFO
	if !c.Keyed() {
		keyFIFO = ReasonFIFO
	}
	olderOfItsLine := (ks.Front != 0 && ks.Front < d.ID) || (ks.Fetched != 0 && ks.Fetched < d.ID)
	if d.keepsTurn && capacity == "" && !olderOfItsLine {
		// Its grant, given at its key's turn, went back for a change of
		// limits alone, and they have room for it: it takes it again now.
		// Else its key, served, would wait behind every key that waits,
		// while its job waited on (torture seed 339187757: a slot granted
		// as its parking completed, a rate per key set before it began,
		// eleven starts of six other keys ahead of it).
		return "", false
	}
	if d.h.Waiter {
		// In the line already (it came ahead): it starts by a grant, at its
		// turn.
		if capacity != "" {
			return capacity, false
		}
		return keyFIFO, true
	}
	order := ""
	switch {
	case c.HasParked && c.Regime() == KindWide && c.Keyed():
		order = ReasonFIFO // jobs of the kind wait for the kind: the round goes across keys
	case olderOfItsLine:
		// An older job of its line waits, or, fetched by a worker, is being
		// decided there: it goes first (the grant round after its decision
		// gives this one its turn).
		order = keyFIFO
	}
	switch {
	case order == "" && capacity == "":
		return "", false
	case capacity == "":
		return order, true
	case order != "" && !KeyReason(capacity):
		return order, false
	}
	return capacity, false
}

// decideWrites gathers a decision's writes, kind by kind.
type decideWrites struct {
	decided []int64 // fetched jobs decided: their marks go
	restamp []int64 // jobs whose starts are logged again
	slots   db.LedgerInsertSlotsParams
	steals  []int64
	// stealNeeds are what each steal takes (in step with steals): a
	// reserved slot, a reserved start.
	stealNeeds []stealNeed
	claims     []int64
	unwait     []int64
	forget     []int64
	starts     map[string]*db.LedgerStartsParams
	waits      map[string]*db.LedgerWaitParams
	parkNow    db.LedgerParkFetchedParams
	parkDsp    db.LedgerParkDispatchedParams
	backNow    []int64
	backDsp    db.LedgerStepBackDispatchedParams
}

// add gathers what the decision of d writes, and counts it.
func (w *decideWrites) add(tx *Tx, c Limits, d *decided) {
	if !d.Reserve {
		w.decided = append(w.decided, d.ID)
	}
	if d.giveBack {
		w.forget = append(w.forget, d.ID)
	}
	key := d.h.Key
	switch d.d.Action {
	case Run, Slot:
		if d.restamp {
			w.restamp = append(w.restamp, d.ID)
		}
		switch {
		case d.claim:
			w.claims = append(w.claims, d.ID)
			if d.h.Waiter {
				w.unwait = append(w.unwait, d.ID)
			}
		case d.admit:
			w.addAdmitted(tx, c, d)
		}
	case Wait:
		wp := w.waitsOf(d.Kind, tx.l.worker)
		wp.JobIds, wp.Keys, wp.Reasons = append(wp.JobIds, d.ID), append(wp.Keys, key), append(wp.Reasons, d.d.Reason)
		tx.counts.setWaiting(d.Kind, key, true)
		if !KeyReason(d.d.Reason) {
			tx.counts.setHasParked(d.Kind, true)
		}
	case StepBack:
		if d.Dispatched {
			w.backDsp.JobIds, w.backDsp.Attempts = append(w.backDsp.JobIds, d.ID), append(w.backDsp.Attempts, int32(d.Attempt))
		} else {
			w.backNow = append(w.backNow, d.ID)
		}
	case Parked:
		if d.Dispatched {
			p := &w.parkDsp
			p.JobIds, p.Kinds, p.Keys, p.Reasons, p.Attempts = append(p.JobIds, d.ID), append(p.Kinds, d.Kind), append(p.Keys, key),
				append(p.Reasons, d.d.Reason), append(p.Attempts, int32(d.Attempt))
		} else {
			p := &w.parkNow
			p.JobIds, p.Kinds, p.Keys, p.Reasons = append(p.JobIds, d.ID), append(p.Kinds, d.Kind), append(p.Keys, key),
				append(p.Reasons, d.d.Reason)
		}
		if !d.Cancelled {
			tx.counts.setWaiting(d.Kind, key, true)
			if !KeyReason(d.d.Reason) {
				tx.counts.setHasParked(d.Kind, true)
			}
		}
	}
}

// addAdmitted gathers the writes of d, admitted by its decision now: the
// grant it took (a steal), its slot, its start, its turn across keys.
func (w *decideWrites) addAdmitted(tx *Tx, c Limits, d *decided) {
	key := d.h.Key
	if d.steal != 0 {
		w.steals = append(w.steals, d.steal)
		w.stealNeeds = append(w.stealNeeds, stealNeed{slot: c.Slotted(), start: c.RateMax > 0})
		if c.Slotted() {
			tx.counts.addSlots(d.Kind, key, -1)
		}
		// The job it took the grant of waits again, parked or
		// resumed ahead (LedgerStealGrants).
		if key == "" {
			tx.counts.setHasParked(d.Kind, true)
		}
		tx.counts.setWaiting(d.Kind, key, true)
	}
	if d.d.Action == Slot {
		w.slots.JobIds, w.slots.Kinds, w.slots.Keys = append(w.slots.JobIds, d.ID), append(w.slots.Kinds, d.Kind),
			append(w.slots.Keys, key)
		worker := tx.l.worker
		if d.Reserve {
			worker = "" // reserved until the job is fetched
		}
		w.slots.WorkerIds = append(w.slots.WorkerIds, worker)
		if !d.h.SlotStale {
			tx.counts.addSlots(d.Kind, key, 1)
		}
	}
	if c.RateMax > 0 {
		s := w.startsOf(d.Kind, d.Reserve)
		s.JobIds, s.Keys = append(s.JobIds, d.ID), append(s.Keys, key)
	}
	if d.h.Waiter {
		w.unwait = append(w.unwait, d.ID)
	}
	if c.Keyed() && c.Regime() == KindWide {
		// Its key was served now, as by a grant: its turn in the
		// round across keys moves to the end.
		tx.counts.served(d.Kind, key)
	}
}

// stealNeed is what a steal takes from the younger job: its reserved
// slot, its reserved start.
type stealNeed struct{ slot, start bool }

// lockSteals locks the grants the decision takes (LedgerLockSteals) and
// returns errStale when one of them was claimed since the decision read
// it: a start granted to a job waiting in a worker is claimed without the
// kind's lock, and a decision that took it anyway would let one start too
// many (seed 836093428).
func (w *decideWrites) lockSteals(tx *Tx) error {
	got, err := tx.q.LedgerLockSteals(tx.ctx, w.steals)
	if err != nil {
		return fmt.Errorf("lock the grants taken: %w", err)
	}
	for i, id := range w.steals {
		need := w.stealNeeds[i]
		if (need.slot && !slices.Contains(got.Slots, id)) || (need.start && !slices.Contains(got.Starts, id)) {
			return errStale
		}
	}
	return nil
}

func (w *decideWrites) startsOf(kind string, reserved bool) *db.LedgerStartsParams {
	if w.starts == nil {
		w.starts = map[string]*db.LedgerStartsParams{}
	}
	name := kind
	if reserved {
		name += "\x00reserved"
	}
	s := w.starts[name]
	if s == nil {
		s = &db.LedgerStartsParams{Kind: kind, Reserved: reserved}
		w.starts[name] = s
	}
	return s
}

func (w *decideWrites) waitsOf(kind, worker string) *db.LedgerWaitParams {
	if w.waits == nil {
		w.waits = map[string]*db.LedgerWaitParams{}
	}
	p := w.waits[kind]
	if p == nil {
		p = &db.LedgerWaitParams{Kind: kind, WorkerID: worker}
		w.waits[kind] = p
	}
	return p
}

// write queues the decision's writes (they travel with the commit).
func (w *decideWrites) write(tx *Tx) error {
	ctx, q, worker := tx.ctx, tx.q, tx.l.worker
	if len(w.decided) > 0 {
		if err := q.LedgerUnmarkFetched(ctx, w.decided); err != nil {
			return fmt.Errorf("unmark fetched jobs: %w", err)
		}
	}
	if len(w.forget) > 0 {
		if err := q.LedgerRelease(ctx, db.LedgerReleaseParams{JobIds: []int64{}, ForgetIds: w.forget, FromIds: []int64{},
			ToIds: []int64{}, WorkerID: worker}); err != nil {
			return fmt.Errorf("give back what the line held: %w", err)
		}
	}
	if len(w.steals) > 0 {
		if err := w.lockSteals(tx); err != nil {
			return err
		}
		if err := q.LedgerStealGrants(ctx, w.steals); err != nil {
			return fmt.Errorf("take grants for older jobs: %w", err)
		}
	}
	if len(w.restamp) > 0 {
		if _, err := q.LedgerClaimStarts(ctx, w.restamp); err != nil {
			return fmt.Errorf("log starts again: %w", err)
		}
	}
	if len(w.claims) > 0 {
		if err := q.LedgerClaimSlots(ctx, db.LedgerClaimSlotsParams{JobIds: w.claims, WorkerID: worker}); err != nil {
			return fmt.Errorf("claim grants: %w", err)
		}
	}
	if len(w.slots.JobIds) > 0 {
		if err := q.LedgerInsertSlots(ctx, w.slots); err != nil {
			return fmt.Errorf("take slots: %w", err)
		}
	}
	for _, name := range sortedKeys(w.starts) {
		if err := q.LedgerStarts(ctx, *w.starts[name]); err != nil {
			return fmt.Errorf("log starts: %w", err)
		}
	}
	if len(w.unwait) > 0 {
		if err := q.LedgerUnwait(ctx, w.unwait); err != nil {
			return fmt.Errorf("take jobs out of the line: %w", err)
		}
	}
	for _, kind := range sortedKeys(w.waits) {
		if err := q.LedgerWait(ctx, *w.waits[kind]); err != nil {
			return fmt.Errorf("jobs wait: %w", err)
		}
	}
	if len(w.backNow) > 0 {
		if err := q.LedgerStepBackFetched(ctx, w.backNow); err != nil {
			return fmt.Errorf("step back: %w", err)
		}
	}
	if len(w.backDsp.JobIds) > 0 {
		if err := q.LedgerStepBackDispatched(ctx, w.backDsp); err != nil {
			return fmt.Errorf("step back: %w", err)
		}
	}
	if len(w.parkNow.JobIds) > 0 {
		w.parkNow.WorkerID = worker
		if err := q.LedgerParkFetched(ctx, w.parkNow); err != nil {
			return fmt.Errorf("park jobs: %w", err)
		}
	}
	if len(w.parkDsp.JobIds) > 0 {
		w.parkDsp.WorkerID = worker
		if err := q.LedgerParkDispatched(ctx, w.parkDsp); err != nil {
			return fmt.Errorf("park jobs: %w", err)
		}
	}
	return nil
}

// sortedKeys is m's keys, sorted.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
