package local

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// The queue's state machine, checked exhaustively over every sequence of
// up to maxSteps events on three jobs (two fetches): after every event,
// every job is in exactly one state, the jobs not working are in line
// order, the leased slots in use are the working jobs' leased slots, no
// leased slot is spare while the front job waits for one on a fresh view, a job given a
// slot is held only while a job of its key ahead of it decides or waits
// for a leased slot, and every slot given in
// memory went to the job at the front of the line, with no job deciding
// ahead of it, within the view's rules.

const maxSteps = 5

// event is one thing that can happen to a queue.
type event struct {
	name string
	do   func(m *model) string // what broke, or ""
}

// model is a queue under test, with the record of what it was told.
type model struct {
	q   *Queue
	now time.Time
	// early are the jobs granted while deciding, not decided since.
	early map[int64]bool
	// gen counts the changes of limits heard (the views read since carry
	// it).
	gen uint64
}

// events are the alphabet: jobs 1 and 2 come in one fetch, job 3 in a
// later one (fetched 100 ms later), each decided to work, to wait in the
// line, or for a leased slot; waits end by the job (Leave), by a grant, by
// a hand-over, or are sent back to the ledger; jobs end; the keeper's view
// changes (the leased path closes, a parked job older than all appears),
// and slots are leased.
func events() []event {
	var out []event
	out = append(out, event{"fetch 1,2", func(m *model) string {
		if m.q.Get(1) != nil {
			return ""
		}
		m.q.Fetch([]Fetched{{ID: 1, Fetched: m.now}, {ID: 2, Fetched: m.now}})
		return ""
	}})
	out = append(out, event{"fetch 3", func(m *model) string {
		if m.q.Get(3) != nil || m.q.Get(1) == nil {
			return ""
		}
		m.q.Fetch([]Fetched{{ID: 3, Fetched: m.now.Add(100 * time.Millisecond)}})
		return ""
	}})
	for id := int64(1); id <= 3; id++ {
		out = append(out,
			event{fmt.Sprintf("work %d", id), func(m *model) string {
				if m.q.Work(id, LineSlot) {
					delete(m.early, id)
					return m.checkUnblocked(id)
				}
				return ""
			}},
			event{fmt.Sprintf("run free %d", id), func(m *model) string {
				if m.q.Work(id, NoSlot) {
					delete(m.early, id)
					return m.checkUnblocked(id)
				}
				return ""
			}},
			event{fmt.Sprintf("begin %d", id), func(m *model) string {
				j := m.q.Get(id)
				if j == nil || j.State() != Working {
					return ""
				}
				m.q.mu.Lock()
				blocked := !j.begun && j.slot != LeasedSlot && len(j.wake) == 0 && (m.q.blockedLocked(j) || m.q.olderNotBegunLocked(j))
				m.q.mu.Unlock()
				if began := m.q.Begin(id); began == blocked {
					return fmt.Sprintf("job %d: Begin answered %v with an older job of its key deciding, or not begun: %v", id, began, blocked)
				}
				if blocked && j.State() != Held {
					return fmt.Sprintf("job %d held back as it began is %s", id, j.State())
				}
				return ""
			}},
			event{fmt.Sprintf("undecide %d", id), func(m *model) string {
				j := m.q.Get(id)
				free := j != nil && j.State() == Working && j.Slot() != LeasedSlot && !j.begun
				blocked := false
				if free {
					m.q.mu.Lock()
					blocked = len(j.wake) == 0 && m.q.blockedLocked(j)
					m.q.mu.Unlock()
				}
				if m.q.Undecide(id) != (free && !blocked) {
					return fmt.Sprintf("job %d: Undecide answered %v for a job working without a leased slot: %v, held behind a job of its key deciding: %v", id, !free, free, blocked)
				}
				if free && !blocked && j.State() != Deciding {
					return fmt.Sprintf("job %d undecided is %s", id, j.State())
				}
				if blocked && j.State() != Held {
					return fmt.Sprintf("job %d, undecided behind a job of its key deciding, is %s", id, j.State())
				}
				return ""
			}},
			event{fmt.Sprintf("line %d", id), func(m *model) string {
				deciding := m.deciding(id)
				lined := m.q.Line(id, false, "limit")
				if msg := m.checkEarly(id, deciding, lined); msg != "" {
					return msg
				}
				delete(m.early, id)
				return ""
			}},
			event{fmt.Sprintf("line or swap %d", id), func(m *model) string { return m.lineOrSwap(id, swapMoved) }},
			event{fmt.Sprintf("line or swap (ledger refuses) %d", id), func(m *model) string { return m.lineOrSwap(id, swapRefused) }},
			event{fmt.Sprintf("line or swap (slot given back) %d", id), func(m *model) string { return m.lineOrSwap(id, swapGaveBack) }},
			event{fmt.Sprintf("take leased %d", id), func(m *model) string {
				before := m.front()
				works, _ := m.q.TakeLeased(id, true, 2, m.now)
				if works && before != id {
					return fmt.Sprintf("job %d took a leased slot while job %d was ahead", id, before)
				}
				if works && m.q.lease.view.Heard < m.q.lease.heard {
					return fmt.Sprintf("job %d took a leased slot at once on a view read before a change of limits heard", id)
				}
				return ""
			}},
			event{fmt.Sprintf("leave %d", id), func(m *model) string { m.q.Leave(id); return "" }},
			event{fmt.Sprintf("grant %d", id), func(m *model) string {
				if j := m.q.Get(id); j != nil && j.state == Deciding {
					m.early[id] = true
				}
				if m.q.Grant(id, LineSlot, false, 0) {
					return m.checkUnblocked(id)
				}
				return ""
			}},
			event{fmt.Sprintf("end %d", id), func(m *model) string {
				slot := m.q.End(id)
				switch slot {
				case LeasedSlot:
					return m.checkGiven(m.q.GiveLeased(m.now), Queued)
				case LineSlot:
					return m.checkGiven(m.q.GiveLine(m.now, func(int64, string) {}), Lined)
				}
				return ""
			}},
		)
	}
	out = append(out,
		event{"view open", func(m *model) string {
			m.q.SetView(View{At: m.now, Heard: m.gen, Limit: 2, Admitted: 1})
			return ""
		}},
		event{"view parked 1", func(m *model) string {
			m.q.SetView(View{At: m.now, Heard: m.gen, Limit: 2, Admitted: 1, OldestParked: 1})
			return ""
		}},
		event{"view other line long before", func(m *model) string {
			m.q.SetView(View{At: m.now, Heard: m.gen, Limit: 2, Admitted: 1, OldestOtherLine: m.now.Add(-2 * FetchTolerance)})
			return ""
		}},
		event{"view off path", func(m *model) string {
			for _, id := range m.q.SetView(View{At: m.now, Heard: m.gen, Limit: 2, OffPath: true}) {
				if j := m.q.Get(id); j == nil || j.state != Deciding {
					return fmt.Sprintf("job %d sent to the ledger is not deciding", id)
				}
			}
			return ""
		}},
		event{"hear a change of limits", func(m *model) string {
			m.gen++
			m.q.Heard(m.gen)
			return ""
		}},
		event{"lease 1", func(m *model) string {
			m.q.mu.Lock()
			var order []int64
			for _, j := range m.q.order {
				order = append(order, j.ID)
			}
			m.q.mu.Unlock()
			for i, j := range m.q.Leased(1) {
				if i >= len(order) || j.ID != order[i] {
					return fmt.Sprintf("leased slots went to jobs out of line order (job %d, the line %v)", j.ID, order)
				}
			}
			return ""
		}},
	)
	return out
}

// deciding reports whether job id is Deciding.
func (m *model) deciding(id int64) bool {
	j := m.q.Get(id)
	return j != nil && j.State() == Deciding
}

// checkEarly checks a decision to wait of job id applied (Line; deciding:
// the job was Deciding; lined: it waits in the line): a job granted while
// deciding never waits, it starts with its grant (Working, or Held behind
// a job of its key ahead of it).
func (m *model) checkEarly(id int64, deciding, lined bool) string {
	if !m.early[id] || !deciding {
		return ""
	}
	if lined {
		return fmt.Sprintf("job %d, granted while deciding, waits in the line", id)
	}
	if j := m.q.Get(id); j != nil && j.State() != Working && j.State() != Held {
		return fmt.Sprintf("job %d, granted while deciding, is %s after its decision to wait", id, j.State())
	}
	return ""
}

// The ledger's answers to a swap (lineOrSwap).
const (
	swapMoved = iota
	swapRefused
	swapGaveBack
)

// lineOrSwap puts job id in the line as the limiter does (SwapFor first;
// the ledger's answer: moved, refused, or gave back) and checks the
// outcome: a swap leaves the held job waiting in the line, told so, and
// the older one with its slot; a slot given back (an older job waits
// elsewhere) leaves both waiting in the line, the held one told so;
// without one (or refused), the job waits in the line as Line has it; and,
// the swap done, no job held with a slot of the line goes after it.
func (m *model) lineOrSwap(id int64, answer int) string {
	y := m.q.SwapFor(id)
	if y == nil {
		deciding := m.deciding(id)
		lined := m.q.Line(id, false, "limit")
		if msg := m.checkEarly(id, deciding, lined); msg != "" {
			return msg
		}
		delete(m.early, id)
		return ""
	}
	if m.early[id] {
		return fmt.Sprintf("job %d, granted while deciding, takes job %d's slot", id, y.ID)
	}
	m.q.Swapped(id, y.ID, answer == swapMoved, answer == swapGaveBack, false, "limit")
	x := m.q.Get(id)
	if answer == swapGaveBack {
		if y.State() != Lined || x.State() != Lined {
			return fmt.Sprintf("job %d gave its slot back for an older job elsewhere: it is %s, and job %d is %s, not both in the line",
				y.ID, y.State(), id, x.State())
		}
		select {
		case o := <-y.wake:
			if o != Relined {
				return fmt.Sprintf("job %d gave its slot back and was told %d", y.ID, o)
			}
		default:
			return fmt.Sprintf("job %d gave its slot back and was not told", y.ID)
		}
		return ""
	}
	if answer == swapRefused {
		if y.State() != Held && y.State() != Working {
			return fmt.Sprintf("job %d, its slot kept (the ledger refused the swap), is %s", y.ID, y.State())
		}
		if x.State() != Lined {
			return fmt.Sprintf("job %d, the swap refused, is %s, not in the line", id, x.State())
		}
		return ""
	}
	if y.State() != Lined {
		return fmt.Sprintf("job %d gave its slot to job %d and is %s, not in the line", y.ID, id, y.State())
	}
	select {
	case o := <-y.wake:
		if o != Relined {
			return fmt.Sprintf("job %d gave its slot and was told %d", y.ID, o)
		}
	default:
		return fmt.Sprintf("job %d gave its slot and was not told", y.ID)
	}
	if s := x.State(); s != Working && s != Held {
		return fmt.Sprintf("job %d took job %d's slot and is %s", id, y.ID, s)
	}
	return m.checkUnblocked(id)
}

// front is the first job not working in line order (0: none).
func (m *model) front() int64 {
	m.q.mu.Lock()
	defer m.q.mu.Unlock()
	if len(m.q.order) == 0 {
		return 0
	}
	return m.q.order[0].ID
}

// checkGiven checks a slot given in memory: to a job that was waiting in
// state, now working, and first of the line (its wake holding Granted).
func (m *model) checkGiven(j *Job, state State) string {
	if j == nil {
		return ""
	}
	if j.state != Working {
		return fmt.Sprintf("job %d was given a slot and is %s", j.ID, j.state)
	}
	select {
	case o := <-j.wake:
		if o != Granted {
			return fmt.Sprintf("job %d was given a slot and told %d", j.ID, o)
		}
	default:
		return fmt.Sprintf("job %d was given a slot and not told", j.ID)
	}
	m.q.mu.Lock()
	defer m.q.mu.Unlock()
	if v := m.q.lease.view; v.Heard < m.q.lease.heard {
		return fmt.Sprintf("job %d was given a slot in memory on a view read before a change of limits heard", j.ID)
	}
	for _, o := range m.q.order {
		if o.before(j) && (o.state == Deciding || o.state == state) {
			return fmt.Sprintf("job %d was given a slot while job %d (%s) went before it", j.ID, o.ID, o.state)
		}
	}
	if state == Lined {
		v := m.q.lease.view
		for _, older := range []int64{v.OldestParked, v.OldestReserved, v.OldestResumed} {
			if older != 0 && older < j.ID {
				return fmt.Sprintf("job %d was handed a slot while job %d, older, waited elsewhere", j.ID, older)
			}
		}
		if !v.OldestOtherLine.IsZero() && j.Fetched.Sub(v.OldestOtherLine) > LineFetchTolerance {
			return fmt.Sprintf("job %d, fetched at %s, was handed a slot while a job fetched at %s waited elsewhere", j.ID, j.Fetched, v.OldestOtherLine)
		}
	}
	return ""
}

// checkUnblocked checks that job id, if it works, has no job of its key
// ahead of it deciding or waiting for a leased slot.
func (m *model) checkUnblocked(id int64) string {
	m.q.mu.Lock()
	defer m.q.mu.Unlock()
	if j := m.q.jobs[id]; j != nil && j.state == Working && m.q.blockedLocked(j) {
		return fmt.Sprintf("job %d works while a job of its key ahead of it decides or waits for a leased slot", id)
	}
	return ""
}

// invariants checks the queue's shape.
func (m *model) invariants() string {
	q := m.q
	q.mu.Lock()
	defer q.mu.Unlock()
	inUse := 0
	for id, j := range q.jobs {
		if j.ID != id {
			return fmt.Sprintf("job %d filed as %d", j.ID, id)
		}
		n := 0
		for _, o := range q.order {
			if o == j {
				n++
			}
		}
		switch {
		case j.state == Working && n != 0:
			return fmt.Sprintf("job %d works and is in the line order", id)
		case j.state != Working && n != 1:
			return fmt.Sprintf("job %d (%s) is in the line order %d times", id, j.state, n)
		}
		if j.state == Working && j.slot == LeasedSlot {
			inUse++
		}
		if j.state == Held && !q.blockedLocked(j) && !q.olderNotBegunLocked(j) {
			return fmt.Sprintf("job %d is held with no job of its key ahead of it deciding or queued, nor older and not begun", id)
		}
	}
	for i := 1; i < len(q.order); i++ {
		if !q.order[i-1].before(q.order[i]) {
			return fmt.Sprintf("line order %d before %d", q.order[i-1].ID, q.order[i].ID)
		}
	}
	for _, o := range q.order {
		if q.jobs[o.ID] != o {
			return fmt.Sprintf("job %d in the order but not in the queue", o.ID)
		}
	}
	if inUse != q.lease.InUse {
		return fmt.Sprintf("%d leased slots in use, %d jobs work on one", q.lease.InUse, inUse)
	}
	perKey := map[string]int{}
	for _, j := range q.jobs {
		perKey[j.Key]++
	}
	if len(perKey) != len(q.keys) {
		return fmt.Sprintf("%d keys have jobs here, %d are kept", len(perKey), len(q.keys))
	}
	for key, n := range perKey {
		if k := q.keys[key]; k == nil || k.jobs != n {
			return fmt.Sprintf("key %q: %d jobs here, the queue counts %v", key, n, k)
		}
	}
	if len(q.order) > 0 && q.order[0].state == Queued && q.lease.InUse < q.lease.usable() && q.lease.letsGo(q.order[0].Fetched) &&
		q.lease.view.fresh(m.now, q.lease.heard, TakeFresh) {
		return fmt.Sprintf("a leased slot is spare while job %d waits for one at the front", q.order[0].ID)
	}
	return ""
}

// TestQueueStateMachine runs every sequence of up to maxSteps events.
func TestQueueStateMachine(t *testing.T) {
	alphabet := events()
	seqs := 0
	var run func(prefix []int)
	run = func(prefix []int) {
		seqs++
		m := &model{q: NewQueue("k"), now: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), early: map[int64]bool{}}
		for step, e := range prefix {
			if msg := alphabet[e].do(m); msg != "" {
				t.Fatalf("after %s: %s", describe(alphabet, prefix[:step+1]), msg)
			}
			// A wake not read by the job it was sent to is read now, as the
			// job's goroutine would (a second send would block).
			for _, j := range m.q.jobs {
				select {
				case <-j.wake:
				default:
				}
			}
			if msg := m.invariants(); msg != "" {
				t.Fatalf("after %s: %s", describe(alphabet, prefix[:step+1]), msg)
			}
		}
		if len(prefix) == maxSteps {
			return
		}
		for e := range alphabet {
			run(append(slices.Clone(prefix), e))
			if t.Failed() {
				return
			}
		}
	}
	run(nil)
	t.Logf("%d sequences of up to %d events", seqs, maxSteps)
}

func describe(alphabet []event, seq []int) string {
	names := make([]string, len(seq))
	for i, e := range seq {
		names[i] = alphabet[e].name
	}
	return strings.Join(names, ", ")
}

// TestOlderJobBeginsFirst: two jobs of a key given slots of the line begin
// in job-id order, whichever of their goroutines gets there first: the
// younger one is held until the older one begins (or leaves), then
// begins. A job of another key is not held.
func TestOlderJobBeginsFirst(t *testing.T) {
	now := time.Now()
	for _, leaves := range []bool{false, true} {
		q := NewQueue("k")
		q.Fetch([]Fetched{{ID: 1, Key: "a", Fetched: now}, {ID: 2, Key: "a", Fetched: now}, {ID: 3, Key: "b", Fetched: now}})
		for id := int64(1); id <= 3; id++ {
			if !q.Work(id, LineSlot) {
				t.Fatalf("job %d not given its slot", id)
			}
		}
		if q.Begin(2) {
			t.Fatal("job 2 began before job 1 of its key, which holds its slot and has not begun")
		}
		if !q.Begin(3) {
			t.Fatal("job 3 held back behind a job of another key")
		}
		if leaves {
			if q.End(1) != LineSlot {
				t.Fatal("job 1 did not end holding its slot")
			}
		} else if !q.Begin(1) {
			t.Fatal("job 1 held back")
		}
		j := q.Get(2)
		select {
		case <-j.Wake():
		default:
			t.Fatal("job 2 not woken once job 1 began or left")
		}
		if j.State() != Working || !q.Begin(2) {
			t.Fatalf("job 2 did not begin after job 1 (%s)", j.State())
		}
	}
}

// TestAJobDecidedAgainBehindAnOlderOneIsHeld: two jobs of a key hold
// their slots, not begun, when a change of limits sends them back to the
// ledger. The older goes first (Deciding); the younger, sent back while
// the older decides, is Held with its slot instead, so the older's
// decision may take that slot (HeldBehind, a swap) rather than give its
// own back (torture seed 601894557). Once the older has its answer, the
// younger is released and goes back to the ledger in its turn.
func TestAJobDecidedAgainBehindAnOlderOneIsHeld(t *testing.T) {
	now := time.Now()
	q := NewQueue("k")
	q.Fetch([]Fetched{{ID: 1, Key: "a", Fetched: now}, {ID: 2, Key: "a", Fetched: now}})
	q.Work(1, LineSlot)
	q.Work(2, LineSlot)
	if !q.Undecide(1) {
		t.Fatal("job 1, working and not begun, not sent back to the ledger")
	}
	if q.Undecide(2) {
		t.Fatal("job 2 sent back to the ledger while job 1 of its key decides")
	}
	if j := q.Get(2); j.State() != Held || j.heldSlot != LineSlot {
		t.Fatalf("job 2 is %s (held slot %v), want Held with its slot of the line", j.State(), j.heldSlot)
	}
	if !q.HeldBehind(1) {
		t.Fatal("job 1's decision does not see the slot job 2 holds for it")
	}
	if !q.Work(1, LineSlot) {
		t.Fatal("job 1 not given its slot back")
	}
	j := q.Get(2)
	if j.State() != Held {
		t.Fatalf("job 2 released before job 1 began: %s", j.State())
	}
	if !q.Begin(1) {
		t.Fatal("job 1 held back")
	}
	if j.State() != Working || !q.Undecide(2) {
		t.Fatalf("job 2 not sent back to the ledger once job 1 began (%s)", j.State())
	}
}

// TestJobsFetchedOutOfOrderNeverWaitForEachOther: a job fetched first with
// the higher id and one fetched after with the lower id, both given their
// slots and about to begin, never wait for each other: in job-id order
// (a per-key limit or a rate) the older one begins first; in fetch order
// (a per-kind limit alone) neither waits for the other (a job waits there
// only for one fetched before it and older, as the ledger's line, in
// job-id order, never has the older one wait for the younger).
func TestJobsFetchedOutOfOrderNeverWaitForEachOther(t *testing.T) {
	now := time.Now()
	for _, byFetch := range []bool{false, true} {
		q := NewQueue("k")
		q.SetByFetch(byFetch)
		q.Fetch([]Fetched{{ID: 2, Key: "a", Fetched: now}})
		q.Fetch([]Fetched{{ID: 1, Key: "a", Fetched: now.Add(time.Millisecond)}})
		q.Work(2, NoSlot)
		q.Work(1, NoSlot)
		if byFetch {
			if !q.Begin(1) || !q.Begin(2) {
				t.Fatal("byFetch: a job held back behind one fetched before it but younger, or after it but older")
			}
			continue
		}
		if q.Begin(2) {
			t.Fatal("job 2 began before job 1")
		}
		if !q.Begin(1) {
			t.Fatal("job 1 held back: the two wait for each other")
		}
		if j := q.Get(2); j.State() != Working || !q.Begin(2) {
			t.Fatal("job 2 did not begin after job 1")
		}
	}
}

// TestAYoungerJobDecidingFirstHoldsNoOlderOne: in fetch order (a per-kind
// limit alone), a younger job fetched first and deciding (the ledger has
// it wait behind the older one) does not hold back the older job, fetched
// after it and given its slot; an older job fetched first does.
func TestAYoungerJobDecidingFirstHoldsNoOlderOne(t *testing.T) {
	now := time.Now()
	for _, olderFirst := range []bool{false, true} {
		q := NewQueue("k")
		q.SetByFetch(true)
		first, second := int64(9), int64(3)
		if olderFirst {
			first, second = 3, 9
		}
		q.Fetch([]Fetched{{ID: first, Key: "", Fetched: now}})
		q.Fetch([]Fetched{{ID: second, Key: "", Fetched: now.Add(time.Millisecond)}})
		q.Work(second, LineSlot)
		began := q.Begin(second)
		if began == olderFirst {
			t.Fatalf("job %d (fetched after job %d, which is deciding) began: %v", second, first, began)
		}
	}
}

// TestAJobRekeyedHoldsNoJobOfItsOldKey: jobs fetched before their kind
// was partitioned share a key (none); once the ledger decides the older
// one under its key now, a younger one of another key given a slot is no
// longer held behind it, and is not asked to give it its slot (torture
// seed 682034841: an older job of k0 decided again and again, asking for
// the slot of a held job of k3).
func TestAJobRekeyedHoldsNoJobOfItsOldKey(t *testing.T) {
	now := time.Now()
	q := NewQueue("k")
	q.Fetch([]Fetched{{ID: 1, Key: "", Fetched: now}, {ID: 2, Key: "", Fetched: now}})
	q.Work(2, LineSlot)
	if q.Begin(2) {
		t.Fatal("job 2 began while job 1, of its key then, was deciding")
	}
	q.SetKey(1, `"k0"`)
	if j := q.Get(2); j.State() != Working {
		t.Fatalf("job 2 (key none) is %s behind job 1 of another key", j.State())
	}
	q.SetKey(2, `"k3"`)
	if y := q.SwapFor(1); y != nil {
		t.Fatalf("job 1 of k0 was offered the slot of job %d of k3", y.ID)
	}
	if !q.Begin(2) {
		t.Fatal("job 2 of k3 was held at its begin behind job 1 of k0")
	}
}

// TestARekeyedJobIsHeldByAnOlderOneOfItsNewKey: a job granted a slot of
// the line under a kind-wide rate (no key) and not begun when the rate is
// made per key takes its key by its args as its worker hears the change
// (Rekey), and an older job of that key fetched since holds it back at its
// begin (torture seed 585348485: job 8, key none in its worker's queue,
// began 14 ms after job 2 of its key, older, was fetched). Jobs whose args
// are not known keep their keys.
func TestARekeyedJobIsHeldByAnOlderOneOfItsNewKey(t *testing.T) {
	now := time.Now()
	q := NewQueue("k")
	q.Fetch([]Fetched{{ID: 8, Key: "", Fetched: now, Args: []byte(`{"t":"k1"}`)}, {ID: 9, Key: "", Fetched: now}})
	if !q.Line(8, false, "rate") || !q.Grant(8, LineSlot, false, 0) {
		t.Fatal("job 8 not lined and granted")
	}
	if o := <-q.Get(8).Wake(); o != Granted {
		t.Fatalf("job 8 woken %v, want Granted", o)
	}
	q.Rekey(func(args []byte) string { return string(args[5:9]) })
	if k := q.Get(8).Key; k != `"k1"` {
		t.Fatalf("job 8 keyed %q after Rekey, want \"k1\"", k)
	}
	if k := q.Get(9).Key; k != "" {
		t.Fatalf("job 9 (args not known) keyed %q after Rekey, want none", k)
	}
	q.Fetch([]Fetched{{ID: 2, Key: `"k1"`, Fetched: now.Add(time.Millisecond)}})
	if q.Begin(8) {
		t.Fatal("job 8 began while job 2, older and of its key, was deciding")
	}
	q.Work(2, LineSlot)
	if !q.Begin(2) {
		t.Fatal("job 2 was held at its begin")
	}
	if j := q.Get(8); j.State() != Working {
		t.Fatalf("job 8 is %s after job 2 began", j.State())
	}
}

// TestAGrantNotReadYetIsSwapped: a job of a key granted a slot of the
// line whose goroutine has not read the grant yet has not begun: an older
// job of its key deciding here (a retry fetched since, say) is held behind
// it and takes its slot (SwapFor), and the younger one is told it waits in
// the line again, the grant it had not read replaced.
func TestAGrantNotReadYetIsSwapped(t *testing.T) {
	now := time.Now()
	q := NewQueue("k")
	q.Fetch([]Fetched{{ID: 9, Key: "a", Fetched: now}})
	if !q.Line(9, false, "limit") || !q.Grant(9, LineSlot, false, 0) {
		t.Fatal("job 9 was not lined and granted")
	}
	y := q.Get(9)
	if len(y.wake) != 1 || y.State() != Working {
		t.Fatalf("job 9 granted is %s with %d wakes, not Working with its grant not read", y.State(), len(y.wake))
	}
	q.Fetch([]Fetched{{ID: 3, Key: "a", Fetched: now.Add(time.Millisecond)}})
	if !q.HeldBehind(3) {
		t.Fatal("job 3 is not held behind job 9, which was granted and has not begun")
	}
	if got := q.SwapFor(3); got == nil || got.ID != 9 {
		t.Fatalf("SwapFor(3) = %v, not job 9", got)
	}
	q.Swapped(3, 9, true, false, false, "limit")
	if x := q.Get(3); x.State() != Working || x.Slot() != LineSlot {
		t.Fatalf("job 3 took job 9's slot and is %s with slot %d", x.State(), x.Slot())
	}
	if y.State() != Lined {
		t.Fatalf("job 9 gave its slot and is %s, not in the line", y.State())
	}
	if o := <-y.wake; o != Relined || len(y.wake) != 0 {
		t.Fatalf("job 9 was told %d (and %d more), not Relined alone", o, len(y.wake))
	}
}

// TestNoSlotHandedOverOnAViewBeforeAChange: after the worker hears a change
// of limits, a slot that frees is not handed over in memory on the view the
// keeper read before it (the change may be a rate, a breaker, a partition):
// not a leased slot to a job waiting for one, nor a slot of the line to a
// job waiting in the line. Once the keeper has read the kind again, the
// spare leased slot goes to the waiting job.
func TestNoSlotHandedOverOnAViewBeforeAChange(t *testing.T) {
	now := time.Now()
	q := NewQueue("k")
	q.SetByFetch(true)
	q.SetView(View{At: now, Limit: 2, Heard: 0})
	q.Fetch([]Fetched{{ID: 1, Fetched: now}, {ID: 2, Fetched: now}})
	q.Leased(1)
	if works, ok := q.TakeLeased(1, true, 2, now); !works || !ok {
		t.Fatal("job 1 did not take the leased slot")
	}
	if works, ok := q.TakeLeased(2, true, 2, now); works || !ok {
		t.Fatal("job 2 is not waiting for a leased slot")
	}
	q.Heard(1)
	if q.End(1) != LeasedSlot {
		t.Fatal("job 1 did not end on its leased slot")
	}
	if j := q.GiveLeased(now); j != nil {
		t.Fatalf("job %d was handed a leased slot on a view read before the change", j.ID)
	}
	q.SetView(View{At: now, Limit: 2, Heard: 1})
	if j := q.Get(2); j.State() != Working || j.Slot() != LeasedSlot {
		t.Fatalf("job 2, once the kind was read again, is %s", j.State())
	}

	line := NewQueue("k")
	line.SetByFetch(true)
	line.SetView(View{At: now, Limit: 2, Heard: 0})
	line.Fetch([]Fetched{{ID: 3, Fetched: now}, {ID: 4, Fetched: now}})
	line.Work(3, LineSlot)
	line.Line(4, false, "limit")
	line.Heard(1)
	if line.End(3) != LineSlot {
		t.Fatal("job 3 did not end on its slot of the line")
	}
	if j := line.GiveLine(now, func(int64, string) {}); j != nil {
		t.Fatalf("job %d was handed a slot of the line on a view read before the change", j.ID)
	}
}

// oneLeasedSlotTaken is a queue of a kind under a per-kind limit of 2
// read at now, with jobs 1 and 2 fetched at now and one slot leased, which
// job 1 took.
func oneLeasedSlotTaken(t *testing.T, now time.Time) *Queue {
	t.Helper()
	q := NewQueue("k")
	q.SetByFetch(true)
	q.SetView(View{At: now, Limit: 2})
	q.Fetch([]Fetched{{ID: 1, Fetched: now}, {ID: 2, Fetched: now}})
	q.Leased(1)
	if works, _ := q.TakeLeased(1, true, 2, now); !works {
		t.Fatal("job 1 did not take the leased slot")
	}
	return q
}

// TestALeasedSlotIsHandedOnlyOnAFreshView: a leased slot that frees goes
// to the job Queued here only while the keeper's view is younger than
// TakeFresh (a view read earlier may not show an older job fetched in
// another worker since, which goes first); on an older view it stays
// spare, and the keeper's next look gives it to the job.
func TestALeasedSlotIsHandedOnlyOnAFreshView(t *testing.T) {
	now := time.Now()
	for _, c := range []struct {
		after  time.Duration
		handed bool
	}{{TakeFresh / 2, true}, {TakeFresh + time.Millisecond, false}} {
		q := oneLeasedSlotTaken(t, now)
		if works, _ := q.TakeLeased(2, true, 2, now); works {
			t.Fatal("job 2 took a second slot of one leased")
		}
		if q.End(1) != LeasedSlot {
			t.Fatal("job 1 did not end on its leased slot")
		}
		at := now.Add(c.after)
		j := q.GiveLeased(at)
		if handed := j != nil; handed != c.handed {
			t.Fatalf("a slot freed %s after the view was read: handed %t, want %t", c.after, handed, c.handed)
		}
		if c.handed {
			continue
		}
		if leased, inUse, toReturn := q.LeaseState(); leased != 1 || inUse != 0 || toReturn != 0 {
			t.Fatalf("the slot not handed is leased %d, in use %d, to return %d: want it spare", leased, inUse, toReturn)
		}
		q.SetView(View{At: at, Limit: 2})
		if j := q.Get(2); j.State() != Working || j.Slot() != LeasedSlot {
			t.Fatalf("job 2, once the kind was read again, is %s", j.State())
		}
	}
}

// TestALeasedSlotGoesBackWhileAJobWaitsInTheLine: a leased slot that frees
// while a job of the kind waits in the line in this worker goes back (the
// database counts it taken, and the line's grant round is what gives it
// to the waiting job), rather than stay spare for the next job fetched.
func TestALeasedSlotGoesBackWhileAJobWaitsInTheLine(t *testing.T) {
	now := time.Now()
	q := oneLeasedSlotTaken(t, now)
	q.Line(2, false, "limit")
	if q.End(1) != LeasedSlot {
		t.Fatal("job 1 did not end on its leased slot")
	}
	if j := q.GiveLeased(now); j != nil {
		t.Fatalf("job %d was given the leased slot", j.ID)
	}
	if n := q.Returning(now, time.Hour, false); n != 1 {
		t.Fatalf("%d leased slots go back while job 2 waits in the line, want 1", n)
	}
}

// TestSpareLeasedSlotsGoBackToOlderJobsElsewhere: leased slots that no job
// here uses go back at once, not after a linger, while the job Queued at
// the front may not take them (a job fetched more than FetchTolerance
// before it waits in another worker), and those above the worker's share
// while another worker wants slots and the front job was not fetched
// first: they are the other workers' jobs'. P9 found two workers
// deadlocked for a second, until their jobs parked: one held every slot,
// spare, for a young job; the other waited with older ones and could
// lease none. With no job waiting elsewhere, or the front job fetched
// first, the slots stay and serve the jobs here.
func TestSpareLeasedSlotsGoBackToOlderJobsElsewhere(t *testing.T) {
	now := time.Now()
	// Eight slots leased, one job that ran on one and ended, and job 2
	// fetched now, deciding with the view v.
	setup := func(v View) *Queue {
		q := NewQueue("k")
		q.SetByFetch(true)
		q.SetView(View{At: now, Limit: 8})
		q.Fetch([]Fetched{{ID: 1, Fetched: now}})
		q.Leased(8)
		if works, _ := q.TakeLeased(1, true, 8, now); !works {
			t.Fatal("job 1 did not take a leased slot")
		}
		if q.End(1) != LeasedSlot {
			t.Fatal("job 1 did not end on its leased slot")
		}
		q.GiveLeased(now)
		v.At, v.Limit, v.Admitted = now, 8, 8
		q.SetView(v)
		q.Fetch([]Fetched{{ID: 2, Fetched: now}})
		q.TakeLeased(2, true, 8, now)
		return q
	}
	for _, c := range []struct {
		name string
		view View
		back int
	}{
		{"a job fetched 2×FetchTolerance before the front one waits elsewhere: every spare slot", View{Others: 1, OldestOther: now.Add(-2 * FetchTolerance)}, 8},
		{"one fetched within the tolerance before it: the front job takes a slot, and the slots above the share go", View{Others: 1, OldestOther: now.Add(-FetchTolerance / 2)}, 4},
		{"the front job fetched first takes a slot, nothing waits here: the slots above the share", View{Others: 1, OldestOther: now.Add(time.Millisecond)}, 4},
		{"no other worker: none", View{}, 0},
	} {
		q := setup(c.view)
		if n := q.Returning(now, time.Hour, false); n != c.back {
			t.Errorf("%s: %d slots go back, want %d", c.name, n, c.back)
		}
		if c.back == 8 {
			if n := q.Want(); n != 0 {
				t.Errorf("%s: the worker asks for %d slots back", c.name, n)
			}
		}
	}
}

// TestNoHandOverPastAJobParkedHere: under a per-kind limit alone, job 2
// waited in the line here, its park-after time ran out and it parked;
// job 3, younger, waits. When job 1 ends, its slot is not handed to job 3
// on a view read before job 2 parked (the view does not show it): it goes
// back to the ledger, whose grant round serves job 2 first. On a view read
// after the parking (job 2 resumed since: not parked), job 3 gets it.
func TestNoHandOverPastAJobParkedHere(t *testing.T) {
	now := time.Now()
	q := NewQueue("k")
	q.SetByFetch(true)
	q.SetView(View{At: now, Limit: 1, Admitted: 1})
	q.Fetch([]Fetched{{ID: 1, Fetched: now}, {ID: 2, Fetched: now}, {ID: 3, Fetched: now}})
	q.Work(1, LineSlot)
	q.Line(2, false, "limit")
	q.Line(3, false, "limit")
	if !q.Leave(2) {
		t.Fatal("job 2 did not leave its wait")
	}
	q.Park(2, now.Add(time.Millisecond))
	if q.End(1) != LineSlot {
		t.Fatal("job 1 did not end on its slot of the line")
	}
	if j := q.GiveLine(now.Add(2*time.Millisecond), func(int64, string) {}); j != nil {
		t.Fatalf("job %d was handed the slot past job 2, parked here after the view was read", j.ID)
	}

	q.Fetch([]Fetched{{ID: 5, Fetched: now}})
	q.Work(5, LineSlot)
	q.SetView(View{At: now.Add(3 * time.Millisecond), Limit: 1, Admitted: 1})
	if q.End(5) != LineSlot {
		t.Fatal("job 5 did not end on its slot of the line")
	}
	if j := q.GiveLine(now.Add(4*time.Millisecond), func(int64, string) {}); j == nil || j.ID != 3 {
		t.Fatalf("on a view read after the parking, the slot went to %v, want job 3", j)
	}
}

// TestLineHandOverFollowsFetchOrderAcrossWorkers: under a per-kind limit
// alone, a slot of the line freed here goes in memory to the front job
// here when the oldest job of the line in another worker was fetched no
// more than LineFetchTolerance before it (or after it), whatever their ids; not
// when it was fetched longer before, nor past an older job resumed and not
// fetched yet, nor on a view older than TakeFresh.
func TestLineHandOverFollowsFetchOrderAcrossWorkers(t *testing.T) {
	now := time.Now()
	for _, c := range []struct {
		name   string
		view   View
		at     time.Time
		handed bool
	}{
		{"nothing elsewhere", View{}, now, true},
		{"an older job fetched elsewhere within the tolerance before", View{OldestOtherLine: now.Add(-LineFetchTolerance)}, now, true},
		{"one fetched elsewhere after it", View{OldestOtherLine: now.Add(time.Millisecond)}, now, true},
		{"one fetched elsewhere more than the tolerance before", View{OldestOtherLine: now.Add(-LineFetchTolerance - time.Millisecond)}, now, false},
		{"an older job resumed and not fetched", View{OldestResumed: 1}, now, false},
		{"a view older than TakeFresh", View{}, now.Add(TakeFresh + time.Millisecond), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			q := NewQueue("k")
			q.SetByFetch(true)
			v := c.view
			v.At, v.Limit, v.Admitted = now, 1, 1
			q.SetView(v)
			q.Fetch([]Fetched{{ID: 5, Fetched: now}, {ID: 6, Fetched: now}})
			q.Work(5, LineSlot)
			q.Line(6, false, "limit")
			if q.End(5) != LineSlot {
				t.Fatal("job 5 did not end on its slot of the line")
			}
			var told []int64
			j := q.GiveLine(c.at, func(id int64, key string) {
				// The move is queued before the job can do anything with the
				// slot: it has not been told yet.
				if jj := q.jobs[id]; jj == nil || len(jj.wake) > 0 || jj.state != Working {
					t.Errorf("job %d was told of its slot (or is not working) before the move was handed to the caller", id)
				}
				told = append(told, id)
			})
			if j != nil && (len(told) != 1 || told[0] != j.ID) {
				t.Fatalf("the move of the slot to job %d was told as %v", j.ID, told)
			}
			if j == nil && len(told) > 0 {
				t.Fatalf("no job got the slot, and moves %v were told", told)
			}
			switch {
			case c.handed && (j == nil || j.ID != 6):
				t.Fatalf("the slot went to %v, want job 6", j)
			case !c.handed && j != nil:
				t.Fatalf("job %d was handed the slot", j.ID)
			}
		})
	}
}

// TestAnOlderViewDoesNotReplaceAYoungerOne: a read of a kind that began
// before the view a queue holds (the keeper's slow read, landing after a
// fetch's) does not replace it: the view's age counts from its read's
// start, and an older one would be trusted on what it shows as if newer.
func TestAnOlderViewDoesNotReplaceAYoungerOne(t *testing.T) {
	now := time.Now()
	q := NewQueue("k")
	q.SetView(View{At: now, Limit: 1, OffPath: true, OldestParked: 3})
	q.SetView(View{At: now.Add(-time.Millisecond), Limit: 1})
	q.mu.Lock()
	v := q.lease.view
	q.mu.Unlock()
	if !v.At.Equal(now) || !v.OffPath || v.OldestParked != 3 {
		t.Fatalf("the view read later was replaced by one read before it: %+v", v)
	}
}

// TestNoHandOverPastAParkedJobTheViewDoesNotName: the keeper's view
// names only the oldest parked job of the kind. When that one has begun
// here since the view was read, other parked jobs older than the front
// job here may still wait (torture seed 219519086: a slot went in memory
// to job 385 while 383 and 384 were parked, because 326, the view's
// oldest, had begun here since): no slot is handed past the view's
// oldest parked job, whatever became of it.
func TestNoHandOverPastAParkedJobTheViewDoesNotName(t *testing.T) {
	now := time.Now()
	q := NewQueue("k")
	q.SetByFetch(true)
	q.SetView(View{At: now, Limit: 3, Admitted: 2, OldestParked: 1})
	q.Fetch([]Fetched{{ID: 1, Fetched: now}})
	q.Work(1, LineSlot)
	if !q.Begin(1) {
		t.Fatal("job 1 did not begin")
	}
	q.Fetch([]Fetched{{ID: 5, Fetched: now}, {ID: 6, Fetched: now}})
	q.Work(5, LineSlot)
	q.Line(6, false, "limit")
	if q.End(5) != LineSlot {
		t.Fatal("job 5 did not end on its slot of the line")
	}
	if j := q.GiveLine(now, func(int64, string) {}); j != nil {
		t.Fatalf("job %d was handed the slot past the view's oldest parked job (job 3, parked too, may wait)", j.ID)
	}
}

// TestNoLeasedSlotPastAJobParkedHere: under a per-kind limit alone, job 1
// waited in the line here and parked (its park-after time ran out). Job
// 2, younger, fetched since, takes no spare leased slot on a view read
// before the parking (it does not show job 1 parked, which closes the
// leased path): it waits for the keeper's next view (torture seeds
// 991982367 and 806688236: a job took a leased slot 2 ms after an older
// one of its worker parked, before River completed the parking). On a
// view read after the parking (job 1 resumed since: not parked), it gets
// the slot.
func TestNoLeasedSlotPastAJobParkedHere(t *testing.T) {
	now := time.Now()
	q := NewQueue("k")
	q.SetByFetch(true)
	q.SetView(View{At: now, Limit: 2})
	q.Fetch([]Fetched{{ID: 1, Fetched: now}})
	q.Line(1, false, "limit")
	if !q.Leave(1) {
		t.Fatal("job 1 did not leave its wait")
	}
	q.Park(1, now.Add(time.Millisecond))
	q.Leased(1)
	q.Fetch([]Fetched{{ID: 2, Fetched: now.Add(time.Millisecond)}})
	if works, ok := q.TakeLeased(2, true, 2, now.Add(2*time.Millisecond)); !ok || works {
		t.Fatalf("job 2 on the leased path: works %v, decided %v; want it waiting for a leased slot", works, ok)
	}
	q.SetView(View{At: now.Add(3 * time.Millisecond), Limit: 2})
	if st := q.Get(2).State(); st != Working {
		t.Fatalf("on a view read after the parking, job 2 is %s", st)
	}
}

// TestNoSpareLeasedSlotServedAsAnOlderJobParks: under a per-kind limit
// alone, job 1 waited here for a leased slot, its park-after time ran out
// and it went to the ledger; job 2, younger, fetched meanwhile, waits for
// one behind it. The keeper's lease (asked for job 1) lands while job 1 is
// decided, and the ledger, counting that slot, parks job 1. As job 1
// leaves the queue the spare slot is not served to job 2 on a view read
// before the parking (make test, TestReleaseRetriedAfterFailure under
// load: job 2 began on it while job 1, older, stayed parked behind it
// until job 2 ended): the keeper's next view, which shows job 1 parked,
// decides.
func TestNoSpareLeasedSlotServedAsAnOlderJobParks(t *testing.T) {
	now := time.Now()
	q := NewQueue("k")
	q.SetByFetch(true)
	q.SetView(View{At: now, Limit: 1})
	q.Fetch([]Fetched{{ID: 1, Fetched: now}})
	if works, ok := q.TakeLeased(1, true, 1, now); !ok || works {
		t.Fatalf("job 1 on the leased path: works %v, decided %v; want it waiting for a leased slot", works, ok)
	}
	if !q.Leave(1) {
		t.Fatal("job 1 did not leave its wait")
	}
	q.Fetch([]Fetched{{ID: 2, Fetched: now.Add(time.Millisecond)}})
	if works, ok := q.TakeLeased(2, true, 1, now.Add(time.Millisecond)); !ok || works {
		t.Fatalf("job 2 on the leased path: works %v, decided %v; want it waiting for a leased slot", works, ok)
	}
	if got := q.Leased(1); len(got) != 0 {
		t.Fatalf("job %d was served a leased slot while job 1, ahead of it, was being decided", got[0].ID)
	}
	q.Park(1, now.Add(2*time.Millisecond))
	if st := q.Get(2).State(); st != Queued {
		t.Fatalf("job 2 is %s after job 1 parked, on a view read before; want it Queued", st)
	}
	q.SetView(View{At: now.Add(3 * time.Millisecond), Limit: 1, Admitted: 1})
	if st := q.Get(2).State(); st != Working {
		t.Fatalf("on a view read after the parking (job 1 resumed since: not parked), job 2 is %s", st)
	}
}

// TestParkedJobsAreForgottenAfterViewFresh: the jobs a worker parked are
// remembered only while a usable view may have been read before them, so
// that a worker parking jobs all day (of a keyed kind, say, which never
// hands a slot over) keeps none of them.
func TestParkedJobsAreForgottenAfterViewFresh(t *testing.T) {
	now := time.Now()
	q := NewQueue("k")
	for i := range int64(100) {
		q.Park(i+1, now.Add(time.Duration(i)*time.Millisecond))
	}
	q.mu.Lock()
	n := len(q.parked)
	q.mu.Unlock()
	if n > int(ViewFresh/time.Millisecond)+1 {
		t.Fatalf("%d parked jobs remembered after 100 ms of parkings, want at most %d", n, int(ViewFresh/time.Millisecond)+1)
	}
}

// TestEndAheadGivesTheWaitADeadline: a job waiting in the line ahead of
// a free slot whose wait without a deadline ends (a change set a rate)
// stays in the line, no longer ahead, and its wait is woken to wait again
// to its deadline; a job waiting in the line with a deadline, or working,
// is left as it is.
func TestEndAheadGivesTheWaitADeadline(t *testing.T) {
	now := time.Now()
	q := NewQueue("k")
	q.Fetch([]Fetched{{ID: 1, Fetched: now}, {ID: 2, Fetched: now}, {ID: 3, Fetched: now}})
	q.Work(1, LineSlot)
	q.Line(2, true, "limit")
	q.Line(3, false, "limit")
	for _, id := range []int64{1, 3} {
		if q.EndAhead(id) {
			t.Fatalf("job %d, not waiting ahead, had its wait ended", id)
		}
	}
	if !q.EndAhead(2) {
		t.Fatal("job 2, waiting ahead, did not have its wait ended")
	}
	j := q.Get(2)
	if j.State() != Lined {
		t.Fatalf("job 2 is %s, want lined", j.State())
	}
	if _, ahead := j.Held(); ahead {
		t.Fatal("job 2 is still ahead: its next wait has no deadline")
	}
	select {
	case o := <-j.Wake():
		if o != Rewait {
			t.Fatalf("job 2 woke with %v, want Rewait", o)
		}
	default:
		t.Fatal("job 2's wait was not woken")
	}
	if q.EndAhead(2) {
		t.Fatal("job 2, no longer ahead, had its wait ended again")
	}
}

// TestEndAheadLeavesASwappedJobWaiting: a job that gave its slot to an
// older job of its key in a swap waits in the line without a deadline
// too, but that wait is not the line's ahead mark (the swap wrote none):
// a change of limits does not end it (seed 947871550: it parked at once,
// and the herd check caught a resumed job parked before it ran).
func TestEndAheadLeavesASwappedJobWaiting(t *testing.T) {
	now := time.Now()
	q := NewQueue("k")
	q.Fetch([]Fetched{{ID: 1, Fetched: now}, {ID: 2, Fetched: now}})
	if !q.Work(2, LineSlot) {
		t.Fatal("job 2 did not work")
	}
	y := q.SwapFor(1)
	if y == nil || y.ID != 2 {
		t.Fatalf("SwapFor(1) = %v, want job 2", y)
	}
	q.Swapped(1, 2, true, false, false, "limit")
	if j := q.Get(2); j.State() != Lined {
		t.Fatalf("job 2 is %s after the swap, want lined", j.State())
	} else if _, ahead := j.Held(); !ahead {
		t.Fatal("job 2 waits to a deadline after the swap")
	}
	if q.EndAhead(2) {
		t.Fatal("a swapped job's wait was ended as a job resumed ahead")
	}
}

// TestSwapForTakesTheYoungestByJobID: under a per-key limit or a rate a
// key's jobs start in job-id order, so the slot an older job deciding to
// wait takes (SwapFor) is that of the youngest job by id holding one, not
// of the one fetched last: a retry fetched again after a younger job of
// its key would otherwise give its slot away and wait while the younger
// one starts (torture seed 675751568: job 217, fetched again after 221,
// gave its slot to an older job and 221 began before it).
func TestSwapForTakesTheYoungestByJobID(t *testing.T) {
	now := time.Now()
	q := NewQueue("k")
	q.Fetch([]Fetched{{ID: 20, Key: "a", Fetched: now}})
	q.Fetch([]Fetched{{ID: 10, Key: "a", Fetched: now.Add(time.Millisecond)}})
	for _, id := range []int64{20, 10} {
		if !q.Work(id, LineSlot) {
			t.Fatalf("job %d did not work", id)
		}
	}
	q.Fetch([]Fetched{{ID: 5, Key: "a", Fetched: now.Add(2 * time.Millisecond)}})
	if y := q.SwapFor(5); y == nil || y.ID != 20 {
		t.Fatalf("SwapFor(5) = %v, want job 20, the youngest by id", y)
	}
}

// TestStartsSoonFollowsTheLinesPace: a job waiting in the line here starts
// soon when fewer jobs of its key wait ahead of it here than began here
// within the window; begins of another key, or older than the window, do
// not count, nor does a job not in the line.
func TestStartsSoonFollowsTheLinesPace(t *testing.T) {
	q := NewQueue("k")
	now := time.Now()
	var fetched []Fetched
	for id := int64(1); id <= 6; id++ {
		key := "a"
		if id == 6 {
			key = "b"
		}
		fetched = append(fetched, Fetched{ID: id, Key: key, Fetched: now})
	}
	q.Fetch(fetched)
	for _, id := range []int64{1, 2} {
		if !q.Work(id, LineSlot) || !q.Begin(id) {
			t.Fatalf("job %d did not begin", id)
		}
	}
	for _, id := range []int64{3, 4, 5, 6} {
		if !q.Line(id, false, "key_limit") {
			t.Fatalf("job %d did not go in the line", id)
		}
	}
	window := time.Minute
	for _, c := range []struct {
		id   int64
		want bool
	}{{3, true}, {4, true}, {5, false}, {6, false}} {
		if got := q.StartsSoon(c.id, time.Now(), window); got != c.want {
			t.Errorf("job %d (%d of its key ahead, 2 begun): starts soon %t, want %t", c.id, c.id-3, got, c.want)
		}
	}
	if q.StartsSoon(3, time.Now().Add(2*window), window) {
		t.Error("begins older than the window count")
	}
	if q.StartsSoon(1, time.Now(), window) {
		t.Error("a job working is said to start soon")
	}
	q.Forget(1)
	q.Forget(2)
	q.Forget(3)
	q.Forget(4)
	q.Forget(5)
	if _, ok := q.keys["a"]; ok {
		t.Error("the begins of a key with no job left here are kept")
	}
}

// TestAGrantGivenBackByTheDecisionIsForgotten: a grant heard while a job
// decides (its wait ended, or a change of limits sent it back) starts the
// job when its decision is to wait: the grant came after the decision read
// the line. But when the decision gave back a grant the job held, the one
// heard may be that one: ForgetEarly drops it, and the job waits in the
// line (torture seed 797934157: a job whose claimed start a recheck under
// a new limit took back began on it, uncounted by the rate).
func TestAGrantGivenBackByTheDecisionIsForgotten(t *testing.T) {
	for _, gaveBack := range []bool{false, true} {
		now := time.Now()
		q := NewQueue("k")
		q.Fetch([]Fetched{{ID: 5, Key: "a", Fetched: now}})
		if q.Grant(5, NoSlot, true, 0) {
			t.Fatal("a grant to a job deciding was applied at once")
		}
		if gaveBack {
			q.ForgetEarly(5)
		}
		lined := q.Line(5, false, "limit")
		switch j := q.Get(5); {
		case gaveBack && (!lined || j.State() != Lined):
			t.Fatalf("job 5, its grant given back by its decision, is %s (lined %t), not Lined", j.State(), lined)
		case !gaveBack && (lined || j.State() != Working):
			t.Fatalf("job 5, granted as it decided to wait, is %s (lined %t), not Working", j.State(), lined)
		}
	}
}
