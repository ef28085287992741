package torture

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// The checks on records written by hand: a clean record passes, and each
// broken promise is reported by its check, so that a torture run that
// finds nothing means something.

// fakeRecord builds a record: limits set long before t0, one worker w1
// started then, jobs of torture.a inserted available at t0.
type fakeRecord struct {
	r  *record
	t0 time.Time
}

func newFakeRecord(l limits) *fakeRecord {
	t0 := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	l.present = true
	return &fakeRecord{t0: t0, r: &record{
		changes: map[int64][]change{},
		limits:  map[string][]limitChange{"torture.a": {{at: t0.Add(-10 * time.Second), limits: l}}},
		jobs:    map[int64]*job{},
		workers: []workerEvent{{worker: "w1", what: "start", at: t0.Add(-10 * time.Second)}},
		begin:   t0,
		end:     t0.Add(10 * time.Second),
	}}
}

// at is t0 plus ms milliseconds.
func (f *fakeRecord) at(ms int) time.Time { return f.t0.Add(time.Duration(ms) * time.Millisecond) }

// job adds job id of key, inserted available at t0, completed with one
// attempt.
func (f *fakeRecord) job(id int64, key string) {
	f.r.jobs[id] = &job{id: id, kind: "torture.a", args: jobArgs{K: "a", Key: key}, maxAttempts: 5, final: "completed", attempt: 1}
	f.state(id, "", "available", 0)
}

// state records a state change of job id at ms.
func (f *fakeRecord) state(id int64, from, to string, ms int) {
	f.r.changes[id] = append(f.r.changes[id], change{job: id, from: from, to: to, client: "w1", at: f.at(ms)})
}

// ran records an execution of job id from ms to ms+dur (fetched at ms),
// ending with outcome.
func (f *fakeRecord) ran(id int64, ms, dur int, outcome string) {
	f.state(id, "available", "running", ms)
	j := f.r.jobs[id]
	f.r.runs = append(f.r.runs, run{id: int64(len(f.r.runs) + 1), job: id, kind: j.kind, key: j.args.Key, attempt: 1,
		worker: "w1", start: f.at(ms), end: f.at(ms + dur), outcome: outcome})
	if outcome == "ok" {
		f.state(id, "running", "completed", ms+dur)
	}
}

// lastTx sets the transaction of job id's last state change.
func (f *fakeRecord) lastTx(id, tx int64) {
	f.r.changes[id][len(f.r.changes[id])-1].tx = tx
}

// fetched records a fetch of job id by worker at ms.
func (f *fakeRecord) fetched(id int64, worker string, ms int) {
	f.r.changes[id] = append(f.r.changes[id], change{job: id, from: "available", to: "running", client: worker, at: f.at(ms)})
}

// parked adds jobs ids, fetched at 1 ms and parked at 2 ms.
func (f *fakeRecord) parked(ids ...int64) {
	for _, id := range ids {
		f.job(id, "")
		f.state(id, "available", "running", 1)
		f.state(id, "running", "pending", 2)
	}
}

// reparked records job id resumed at ms, fetched at fetchMs and parked
// again at parkMs, then resumed and run at 5 s.
func (f *fakeRecord) reparked(id int64, ms, fetchMs, parkMs int) {
	f.state(id, "pending", "available", ms)
	f.fetched(id, "w1", fetchMs)
	f.state(id, "running", "pending", parkMs)
	f.state(id, "pending", "available", 5000)
	f.ran(id, 5001, 10, "ok")
}

// started records an execution of job id on worker from ms to ms+dur (its
// fetch recorded apart), completed.
func (f *fakeRecord) started(id int64, worker string, ms, dur int) {
	j := f.r.jobs[id]
	f.r.runs = append(f.r.runs, run{id: int64(len(f.r.runs) + 1), job: id, kind: j.kind, key: j.args.Key, attempt: 1,
		worker: worker, start: f.at(ms), end: f.at(ms + dur), outcome: "ok"})
	f.r.changes[id] = append(f.r.changes[id], change{job: id, from: "running", to: "completed", client: worker, at: f.at(ms + dur)})
}

// worker adds a worker started long before t0.
func (f *fakeRecord) worker(id string) {
	f.r.workers = append(f.r.workers, workerEvent{worker: id, what: "start", at: f.at(-10_000)})
}

// backlog adds n jobs of key A, inserted at t0 and fetched at 1 ms, that
// run two at a time for runMs each (A's backlog behind which B arrives).
func (f *fakeRecord) backlog(n int, runMs int) {
	for id := int64(1); id <= int64(n); id++ {
		f.job(id, "A")
		f.r.jobs[id].inserted = f.at(0)
		f.state(id, "available", "running", 1)
		f.started(id, "w1", 1+int(id-1)/2*runMs, runMs-1)
	}
}

// arrives adds job 20 of key B, inserted at 100 ms, fetched at fetchMs and
// started at startMs.
func (f *fakeRecord) arrives(fetchMs, startMs int) { f.arrivesAs(20, fetchMs, startMs) }

// arrivesAs adds job id of key B, inserted at 100 ms, fetched at fetchMs
// and started at startMs.
func (f *fakeRecord) arrivesAs(id int64, fetchMs, startMs int) {
	f.job(id, "B")
	f.r.jobs[id].inserted = f.at(100)
	f.r.changes[id][0].at = f.at(100)
	f.fetched(id, "w1", fetchMs)
	f.started(id, "w1", startMs, 10)
}

// startedEarlier adds n jobs of key B from id from on, inserted at t0 and
// run from 5 ms on, one a millisecond: B's own starts before it arrives.
func (f *fakeRecord) startedEarlier(from int64, n int) {
	for i := range n {
		id := from + int64(i)
		f.job(id, "B")
		f.r.jobs[id].inserted = f.at(0)
		f.ran(id, 5+i, 10, "ok")
	}
}

// found runs the checks and returns the violations of check name.
func (f *fakeRecord) found(name string) []string {
	f.r.runsOf = nil // runs may have been added since the last check
	res := check(f.r)
	var out []string
	for _, v := range res.violations.list {
		if v.check == name {
			out = append(out, v.String())
		}
	}
	return out
}

func TestChecksPassACleanRecord(t *testing.T) {
	f := newFakeRecord(limits{max: 2, fields: []string{"key"}, keyMax: 1})
	for id := int64(1); id <= 4; id++ {
		f.job(id, "k")
	}
	for i, id := range []int64{1, 2, 3, 4} {
		f.ran(id, 10+i*100, 90, "ok")
	}
	if res := check(f.r); len(res.violations.list) > 0 {
		t.Fatalf("a clean record: %v", res.violations.list)
	}
}

func TestCheckLimitsFindsTooManyRunning(t *testing.T) {
	f := newFakeRecord(limits{max: 2})
	for id := int64(1); id <= 3; id++ {
		f.job(id, "")
		f.ran(id, 10+int(id), 500, "ok")
	}
	got := f.found("limit")
	if len(got) != 1 || !strings.Contains(got[0], "job 3 started") || !strings.Contains(got[0], "3 running, limit 2") {
		t.Fatalf("limit violations: %q", got)
	}
}

func TestCheckLimitsFindsTooManyOfAKey(t *testing.T) {
	f := newFakeRecord(limits{fields: []string{"key"}, keyMax: 1})
	f.job(1, "x")
	f.job(2, "x")
	f.job(3, "y")
	f.ran(1, 10, 500, "ok")
	f.ran(3, 20, 500, "ok") // another key: fine
	f.ran(2, 30, 500, "ok")
	got := f.found("limit")
	if len(got) != 1 || !strings.Contains(got[0], "key x: job 2") {
		t.Fatalf("limit violations: %q", got)
	}
}

func TestCheckRatesFindsAFullWindow(t *testing.T) {
	f := newFakeRecord(limits{rateMax: 2, ratePeriod: time.Second})
	for id := int64(1); id <= 4; id++ {
		f.job(id, "")
	}
	f.ran(1, 10, 5, "ok")
	f.ran(2, 300, 5, "ok")
	f.ran(3, 1400, 5, "ok") // a new window: fine
	f.ran(4, 1500, 5, "ok") // 2 since 500: fine
	if got := f.found("rate"); len(got) > 0 {
		t.Fatalf("a rate kept: %q", got)
	}
	f.job(5, "")
	f.ran(5, 1600, 5, "ok") // 3 starts within 1400..1600
	got := f.found("rate")
	if len(got) != 1 || !strings.Contains(got[0], "3 starts") || !strings.Contains(got[0], "job 5") {
		t.Fatalf("rate violations: %q", got)
	}
}

// TestCheckRatesJudgesStartsLoggedUnderTheNewRate: a rate of 2/s set at
// 100 ms (its transaction began at 90 ms). Starts within the change window
// after it are exempt (they may have followed no rate), unless the
// limiter's own rows show it logged their starts since the change began
// (it decided them under the new rate): then three of them in the window
// are a violation.
func TestCheckRatesJudgesStartsLoggedUnderTheNewRate(t *testing.T) {
	for _, logged := range []bool{false, true} {
		f := newFakeRecord(limits{})
		f.r.limits["torture.a"] = append(f.r.limits["torture.a"], limitChange{at: f.at(100), began: f.at(90),
			limits: limits{present: true, rateMax: 2, ratePeriod: time.Second}})
		f.r.line = map[int64][]lineEvent{}
		for id := int64(1); id <= 3; id++ {
			f.job(id, "")
			f.ran(id, 120+int(id), 5, "ok")
			if logged {
				f.r.line[id] = []lineEvent{{what: "concurrency_starts INSERT", at: f.at(95)}}
			}
		}
		got := f.found("rate")
		switch {
		case logged && (len(got) != 1 || !strings.Contains(got[0], "3 starts")):
			t.Fatalf("logged under the new rate: rate violations %q, want one of 3 starts", got)
		case !logged && len(got) > 0:
			t.Fatalf("in the change window: rate violations %q, want none (exempt)", got)
		}
	}
}

// TestCheckOrderJudgesWhatTheLimiterDecided: a per-key limit set at 100 ms
// over a kind with none; jobs 1 and 2 of one key are fetched just before,
// and job 2 starts at 130 ms while job 1 waits. In the change window it may
// have run with no limit (exempt), unless the limiter's own rows show it
// decided job 2 (a slot written between its fetch and its start): then
// the pair is judged, and is a violation.
func TestCheckOrderJudgesWhatTheLimiterDecided(t *testing.T) {
	for _, decided := range []bool{false, true} {
		f := newFakeRecord(limits{})
		f.r.limits["torture.a"] = append(f.r.limits["torture.a"], limitChange{at: f.at(100), began: f.at(95),
			limits: limits{present: true, fields: []string{"key"}, keyMax: 1}})
		f.r.line = map[int64][]lineEvent{}
		f.job(1, "repo")
		f.job(2, "repo")
		f.state(1, "available", "running", 97)
		f.state(2, "available", "running", 98)
		f.started(2, "w1", 130, 10)
		f.started(1, "w1", 400, 10)
		if decided {
			f.r.line[2] = []lineEvent{{what: "concurrency_executions INSERT", at: f.at(120)}}
		}
		got := f.found("order")
		switch {
		case decided && (len(got) != 1 || !strings.Contains(got[0], "job 2 started")):
			t.Fatalf("decided by the limiter: order violations %q, want job 2's", got)
		case !decided && len(got) > 0:
			t.Fatalf("in the change window: order violations %q, want none (exempt)", got)
		}
	}
}

// TestCheckOrderFollowsRiversOrder: under a per-kind limit alone, job 2
// starts while job 1, older, is resumed and not fetched yet: a violation,
// unless River hands job 1 out after job 2 (its scheduled_at later: it
// was snoozed after job 2's insert).
func TestCheckOrderFollowsRiversOrder(t *testing.T) {
	for _, snoozed := range []bool{false, true} {
		f := newFakeRecord(limits{max: 2})
		f.job(1, "")
		f.job(2, "")
		sched1 := f.at(0)
		if snoozed {
			sched1 = f.at(50)
		}
		f.r.changes[1] = append(f.r.changes[1],
			change{job: 1, from: "available", to: "running", client: "w1", at: f.at(10), scheduledAt: f.at(0)},
			change{job: 1, from: "running", to: "pending", client: "w1", at: f.at(20), scheduledAt: sched1},
			change{job: 1, from: "pending", to: "available", at: f.at(100), scheduledAt: sched1})
		f.r.changes[2][0].scheduledAt = f.at(5)
		f.ran(2, 400, 10, "ok")
		f.r.changes[1] = append(f.r.changes[1], change{job: 1, from: "available", to: "running", client: "w1", at: f.at(600)})
		f.started(1, "w1", 600, 10)
		got := f.found("order")
		switch {
		case snoozed && len(got) > 0:
			t.Fatalf("River hands job 1 out after job 2: order violations %q", got)
		case !snoozed && (len(got) != 1 || !strings.Contains(got[0], "job 2 started")):
			t.Fatalf("order violations %q, want job 2's", got)
		}
	}
}

// TestCheckOrderParkedJustNowByItsOwnWorker: under a per-kind limit
// alone, job 1 is fetched by w1 and parked by it at 40 ms; job 2, younger,
// starts in w1 at 60 ms. Parked by w2 it is within the lease tolerance
// (w1 hears of it at its next look); parked by w1 itself it is a violation
// (the worker knew: a spare leased slot was served to job 2 as job 1 left
// its queue, before it was recorded as parked).
func TestCheckOrderParkedJustNowByItsOwnWorker(t *testing.T) {
	for _, parker := range []string{"w2", "w1"} {
		f := newFakeRecord(limits{max: 1})
		f.worker("w2")
		f.job(1, "")
		f.job(2, "")
		f.r.changes[1] = append(f.r.changes[1],
			change{job: 1, from: "available", to: "running", client: parker, at: f.at(10)},
			change{job: 1, from: "running", to: "pending", client: parker, at: f.at(40)})
		f.ran(2, 20, 40, "ok")
		f.r.runs[len(f.r.runs)-1].start = f.at(60)
		f.state(1, "pending", "available", 300)
		f.ran(1, 310, 10, "ok")
		got := f.found("order")
		switch {
		case parker == "w2" && len(got) > 0:
			t.Fatalf("parked by another worker just before: order violations %q, want none", got)
		case parker == "w1" && (len(got) != 1 || !strings.Contains(got[0], "job 2 started") || !strings.Contains(got[0], "job 1 was parked")):
			t.Fatalf("parked by job 2's own worker just before: order violations %q, want job 2's", got)
		}
	}
}

func TestCheckOrderFindsAYoungerJobFirst(t *testing.T) {
	f := newFakeRecord(limits{fields: []string{"key"}, keyMax: 1})
	f.job(1, "repo")
	f.job(2, "repo")
	// Job 1 is fetched, waits and parks; job 2 starts while it is parked.
	f.state(1, "available", "running", 5)
	f.state(1, "running", "pending", 40)
	f.ran(2, 100, 50, "ok")
	f.state(1, "pending", "available", 200)
	f.ran(1, 210, 50, "ok")
	got := f.found("order")
	if len(got) != 1 || !strings.Contains(got[0], "job 2 started") || !strings.Contains(got[0], "job 1 was parked") {
		t.Fatalf("order violations: %q", got)
	}
}

func TestCheckOrderExemptsFetchesAtOnce(t *testing.T) {
	f := newFakeRecord(limits{fields: []string{"key"}, keyMax: 1})
	f.r.workers = append(f.r.workers, workerEvent{worker: "w2", what: "start", at: f.at(-10_000)})
	f.job(1, "repo")
	f.job(2, "repo")
	// Job 1 fetched by w2 10 ms after w1 fetched job 2, which starts: the
	// two fetches are within fetchTolerance.
	f.r.changes[1] = append(f.r.changes[1], change{job: 1, from: "available", to: "running", client: "w2", at: f.at(110)})
	f.ran(2, 100, 50, "ok")
	f.r.runs = append(f.r.runs, run{id: 9, job: 1, kind: "torture.a", key: "repo", attempt: 1, worker: "w2",
		start: f.at(300), end: f.at(350), outcome: "ok"})
	f.state(1, "running", "completed", 350)
	if got := f.found("order"); len(got) > 0 {
		t.Fatalf("fetches within the tolerance: %q", got)
	}
}

// TestCheckOrderFetchRaceThenParked: under a per-key limit, job 1 fetched
// by w2 10 ms after w1 fetched job 2 and parked by w2 just before job 2
// starts lost the same race as one still waiting in w2; parked long before
// job 2's start, or fetched long before its fetch, it did not.
func TestCheckOrderFetchRaceThenParked(t *testing.T) {
	for _, c := range []struct {
		fetchMs, parkMs int
		want            int
	}{{110, 140, 0}, {110, 60, 1}, {20, 140, 1}} {
		f := newFakeRecord(limits{fields: []string{"key"}, keyMax: 1})
		f.worker("w2")
		f.job(1, "repo")
		f.job(2, "repo")
		f.fetched(2, "w1", 100)
		f.fetched(1, "w2", c.fetchMs)
		f.state(1, "running", "pending", c.parkMs)
		f.started(2, "w1", 150, 10)
		f.state(1, "pending", "available", 300)
		f.fetched(1, "w1", 310)
		f.started(1, "w1", 320, 10)
		if got := f.found("order"); len(got) != c.want {
			t.Fatalf("fetched at %d ms, parked at %d ms: order violations %q, want %d", c.fetchMs, c.parkMs, got, c.want)
		}
	}
}

// TestCheckOrderFetchInFlight: under a per-key limit, job 1 fetched by
// job 2's own worker, after job 2's fetch, 3 ms before job 2 starts was in
// flight; 30 ms before, it was not. The same holds when its worker parked
// it straight from that fetch, 2 ms before job 2 started (seed 909341368):
// fetched 8 ms before, it lost the race of an in-flight fetch; 30 ms
// before, it did not.
func TestCheckOrderFetchInFlight(t *testing.T) {
	for _, c := range []struct {
		fetchMs, parkMs int // parkMs 0: not parked
		want            int
	}{{147, 0, 0}, {120, 0, 1}, {142, 148, 0}, {120, 148, 1}} {
		f := newFakeRecord(limits{fields: []string{"key"}, keyMax: 1})
		f.job(1, "repo")
		f.job(2, "repo")
		f.fetched(2, "w1", 100)
		f.fetched(1, "w1", c.fetchMs)
		if c.parkMs > 0 {
			f.state(1, "running", "pending", c.parkMs)
			f.state(1, "pending", "available", 300)
			f.fetched(1, "w1", 310)
		}
		f.started(2, "w1", 150, 10)
		f.started(1, "w1", 320, 10)
		if got := f.found("order"); len(got) != c.want {
			t.Fatalf("job 1 fetched at %d ms (parked at %d ms), job 2 started at 150 ms: order violations %q, want %d",
				c.fetchMs, c.parkMs, got, c.want)
		}
	}
}

// TestCheckOrderJudgesADecisionByItsLimits: per-key limits; job 2 (key b)
// is granted a slot at 100 ms and starts at 300 ms while job 1 (key a)
// waits parked. The partition is dropped (one kind-wide rate) at 150 ms:
// decided under per-key limits, where the two keys do not order each
// other, it kept the order; granted after the change, it broke it.
func TestCheckOrderJudgesADecisionByItsLimits(t *testing.T) {
	for _, c := range []struct {
		grantMs int
		want    int
	}{{100, 0}, {250, 1}} {
		f := newFakeRecord(limits{fields: []string{"key"}, keyMax: 1})
		f.r.limits["torture.a"] = append(f.r.limits["torture.a"], limitChange{at: f.at(150),
			limits: limits{present: true, rateMax: 5, ratePeriod: time.Second}})
		f.r.line = map[int64][]lineEvent{}
		f.job(1, "a")
		f.job(2, "b")
		f.state(1, "available", "running", 5)
		f.state(1, "running", "pending", 40)
		f.fetched(2, "w1", 50)
		f.r.line[2] = append(f.r.line[2], lineEvent{what: "concurrency_executions INSERT", at: f.at(c.grantMs), tx: 8})
		f.started(2, "w1", 300, 10)
		f.state(1, "pending", "available", 500)
		f.fetched(1, "w1", 510)
		f.started(1, "w1", 520, 10)
		if got := f.found("order"); len(got) != c.want {
			t.Fatalf("granted at %d ms: order violations %q, want %d", c.grantMs, got, c.want)
		}
	}
}

// TestCheckOrderLetGo: job 2 waits in the line (a waiter row at 60 ms)
// under a rate while job 1, older, is parked; the rate is cleared and the
// limiter lets job 2 go (LedgerLetGo at 100 ms); a rate is set again at
// 120 ms and job 2 starts at 300 ms. Let go, it ran with no limit; without
// the let-go, it broke the order.
func TestCheckOrderLetGo(t *testing.T) {
	for _, letGo := range []bool{true, false} {
		f := newFakeRecord(limits{rateMax: 5, ratePeriod: time.Second})
		f.r.limits["torture.a"] = append(f.r.limits["torture.a"],
			limitChange{at: f.at(90), limits: limits{}},
			limitChange{at: f.at(120), limits: limits{present: true, rateMax: 5, ratePeriod: time.Second}})
		f.r.line = map[int64][]lineEvent{}
		f.job(1, "")
		f.job(2, "")
		f.state(1, "available", "running", 5)
		f.state(1, "running", "pending", 40)
		f.fetched(2, "w1", 50)
		f.r.line[2] = append(f.r.line[2], lineEvent{what: "concurrency_waiters INSERT", at: f.at(60), tx: 7})
		if letGo {
			f.r.line[2] = append(f.r.line[2], lineEvent{what: "concurrency_waiters DELETE", at: f.at(100), tx: 8,
				query: "-- name: LedgerLetGo :one\nWITH ..."})
		}
		f.started(2, "w1", 300, 10)
		f.state(1, "pending", "available", 500)
		f.fetched(1, "w1", 510)
		f.started(1, "w1", 520, 10)
		want := 1
		if letGo {
			want = 0
		}
		if got := f.found("order"); len(got) != want {
			t.Fatalf("let go %t: order violations %q, want %d", letGo, got, want)
		}
	}
}

// TestCheckOrderResumedByALetGo: job 1, parked, is made available at
// 100 ms; job 2, younger, fetched at 50 ms, starts at 300 ms under a
// per-kind limit set at 200 ms (its slot taken at 280 ms), and job 1 is
// fetched at 500 ms. Resumed by
// a grant, job 1 was in the line ahead of job 2: a violation. Let go by a
// clearing of the limits (at 90 ms), it lost its place and is River's to
// hand out: job 2, fetched before it was available, goes first.
func TestCheckOrderResumedByALetGo(t *testing.T) {
	for _, letGo := range []bool{true, false} {
		f := newFakeRecord(limits{max: 4})
		f.r.limits["torture.a"] = append(f.r.limits["torture.a"],
			limitChange{at: f.at(90), limits: limits{}},
			limitChange{at: f.at(200), limits: limits{present: true, max: 4}})
		f.job(1, "")
		f.job(2, "")
		f.state(1, "available", "running", 5)
		f.state(1, "running", "pending", 40)
		f.fetched(2, "w1", 50)
		resume := change{job: 1, from: "pending", to: "available", client: "w1", at: f.at(100),
			query: "-- name: LedgerGrantParked :exec WITH ..."}
		if letGo {
			resume.query = "-- name: LedgerLetGo :one WITH resumed AS ("
		}
		f.r.changes[1] = append(f.r.changes[1], resume)
		// The limiter decided job 2 under the new limit: a slot at 280 ms.
		f.r.line = map[int64][]lineEvent{2: {{what: "concurrency_executions INSERT", at: f.at(280), tx: 9}}}
		f.started(2, "w1", 300, 10)
		f.fetched(1, "w1", 500)
		f.started(1, "w1", 510, 10)
		want := 1
		if letGo {
			want = 0
		}
		if got := f.found("order"); len(got) != want {
			t.Fatalf("let go %t: order violations %q, want %d", letGo, got, want)
		}
	}
}

// TestCheckOrderTrustsNoLimiterRow: a parked job granted a start before
// a younger one waiting in the worker, which starts first while the older
// one is resumed and fetched, breaks the order: the limiter's own rows
// (its grants in order) never excuse it, with or without them.
func TestCheckOrderTrustsNoLimiterRow(t *testing.T) {
	for _, granted := range []bool{true, false} {
		f := newFakeRecord(limits{rateMax: 20, ratePeriod: time.Second})
		f.r.line = map[int64][]lineEvent{}
		f.job(1, "")
		f.job(2, "")
		// Job 1 waits and parks; job 2 waits in w1 from 20 ms.
		f.state(1, "available", "running", 5)
		f.state(1, "running", "pending", 40)
		f.state(2, "available", "running", 20)
		if granted {
			f.r.line[1] = append(f.r.line[1], lineEvent{what: "concurrency_starts INSERT", reserved: true, at: f.at(100), tx: 7})
		}
		f.r.line[2] = append(f.r.line[2], lineEvent{what: "concurrency_starts INSERT", at: f.at(150), tx: 8})
		// Job 2 starts at 160 ms; job 1, resumed at 110 ms and fetched at
		// 120 ms, starts at 460 ms.
		f.started(2, "w1", 160, 10)
		f.state(1, "pending", "available", 110)
		f.fetched(1, "w1", 120)
		f.started(1, "w1", 460, 10)
		got := f.found("order")
		if len(got) != 1 || !strings.Contains(got[0], "job 2 started") || !strings.Contains(got[0], "job 1 was fetched") {
			t.Fatalf("granted first (%t): job 2 started while job 1 waited: %q", granted, got)
		}
	}
}

// TestCheckOrderByFetchAcrossWorkers: under a per-kind limit alone, a job
// fetched by w2 100 ms after a job waiting in w1 must not start before it;
// one fetched within fetchTolerance may.
func TestCheckOrderByFetchAcrossWorkers(t *testing.T) {
	for _, c := range []struct {
		fetchMs int
		want    int
	}{{100, 1}, {30, 0}} {
		f := newFakeRecord(limits{max: 2})
		f.worker("w2")
		f.job(1, "")
		f.job(2, "")
		f.fetched(1, "w1", 0)
		f.fetched(2, "w2", c.fetchMs)
		f.started(2, "w2", 200, 10)
		f.started(1, "w1", 500, 10)
		if got := f.found("order"); len(got) != c.want {
			t.Fatalf("fetched %d ms apart: order violations %q, want %d", c.fetchMs, got, c.want)
		}
	}
}

// TestCheckOrderAnOlderJobGrantedOnItsWayBack: under a per-kind limit
// alone, job 1 waits in w1 from 0 ms and steps back; a slot is reserved
// for it at 150 ms while River's completion of the step back is under way
// (written at 300 ms); job 2, fetched by w2 at 100 ms, starts at 200 ms,
// and job 1 only at 320 ms. Its turn came first, and its grant stood: no
// violation (seeds 884311840, 902252574). With no grant, a grant after
// job 2's start, or a grant taken back before it, job 1 waited for its
// turn: one.
func TestCheckOrderAnOlderJobGrantedOnItsWayBack(t *testing.T) {
	for _, c := range []struct {
		name            string
		grantMs, backMs int // 0: none
		want            int
	}{
		{"granted before the younger one's start", 150, 0, 0},
		{"no grant", 0, 0, 1},
		{"granted after it", 250, 0, 1},
		{"granted, taken back", 150, 180, 1},
	} {
		f := newFakeRecord(limits{max: 2})
		f.r.line = map[int64][]lineEvent{}
		f.worker("w2")
		f.job(1, "")
		f.job(2, "")
		f.fetched(1, "w1", 0)
		f.fetched(2, "w2", 100)
		if c.grantMs != 0 {
			f.r.line[1] = append(f.r.line[1], lineEvent{what: "concurrency_executions INSERT", reserved: true, at: f.at(c.grantMs), tx: 7,
				query: "-- name: LedgerInsertSlots :exec\nINSERT ..."})
		}
		if c.backMs != 0 {
			f.r.line[1] = append(f.r.line[1], lineEvent{what: "concurrency_executions DELETE", reserved: true, at: f.at(c.backMs), tx: 8,
				query: "-- name: LedgerStealGrants :exec\nWITH ..."})
		}
		f.started(2, "w2", 200, 10)
		f.state(1, "running", "available", 300)
		f.fetched(1, "w1", 310)
		f.started(1, "w1", 320, 10)
		if got := f.found("order"); len(got) != c.want {
			t.Errorf("%s: order violations %q, want %d", c.name, got, c.want)
		}
	}
}

// TestCheckOrderJudgesAHandOverByTheLimitsAtItsStart: job 2, fetched at
// 10 ms and placed in the line at 20 ms under a per-kind limit and a rate
// (order by job id), begins at 500 ms on a slot of the line with no slot
// row written for it before (handed over in memory), while job 1, older,
// fetched again at 400 ms, waits in the same worker. With the rate cleared
// at 300 ms the hand-over followed the per-kind limit alone, in fetch
// order, where job 1 (fetched after it) does not go first: no violation
// (seed 33732833). With the rate in force throughout, or with a slot row
// written before its start (the ledger's grant, under the rate), one.
func TestCheckOrderJudgesAHandOverByTheLimitsAtItsStart(t *testing.T) {
	for _, c := range []struct {
		name             string
		cleared, slotRow bool
		want             int
	}{
		{"rate cleared, handed over", true, false, 0},
		{"rate in force", false, false, 1},
		{"rate cleared, granted before the change", true, true, 1},
	} {
		f := newFakeRecord(limits{max: 2, rateMax: 5, ratePeriod: time.Second})
		f.r.line = map[int64][]lineEvent{}
		if c.cleared {
			f.r.limits["torture.a"] = append(f.r.limits["torture.a"], limitChange{at: f.at(300), limits: limits{present: true, max: 2}})
		}
		f.job(1, "")
		f.job(2, "")
		f.fetched(1, "w2", 5)
		f.state(1, "running", "pending", 8)
		f.fetched(2, "w1", 10)
		f.r.line[2] = append(f.r.line[2], lineEvent{what: "concurrency_waiters INSERT", at: f.at(20), tx: 5,
			query: "-- name: LedgerWait :exec\nINSERT ..."})
		if c.slotRow {
			f.r.line[2] = append(f.r.line[2], lineEvent{what: "concurrency_executions INSERT", at: f.at(250), tx: 6,
				query: "-- name: LedgerInsertSlots :exec\nINSERT ..."})
		}
		f.state(1, "pending", "available", 390)
		f.fetched(1, "w1", 400)
		f.started(2, "w1", 500, 10)
		f.r.runs[len(f.r.runs)-1].slot = "line"
		f.started(1, "w1", 700, 10)
		if got := f.found("order"); len(got) != c.want {
			t.Errorf("%s: order violations %q, want %d", c.name, got, c.want)
		}
	}
}

func TestCheckLivenessFindsAStall(t *testing.T) {
	f := newFakeRecord(limits{max: 2})
	f.job(1, "")
	f.ran(1, 5000, 10, "ok") // ready from t0, room all along, started 5 s later
	got := f.found("liveness")
	if len(got) != 1 || !strings.Contains(got[0], "without a start") {
		t.Fatalf("liveness violations: %q", got)
	}
}

func TestCheckOutcomesFindsWhatRiverWouldNotDo(t *testing.T) {
	f := newFakeRecord(limits{max: 2})
	f.job(1, "")
	f.ran(1, 10, 10, "ok")
	f.ran(1, 100, 10, "ok") // completed twice, no kill to explain it
	f.r.jobs[1].attempt = 2
	f.job(2, "")
	f.ran(2, 30, 10, "ok")
	f.r.jobs[2].attempt = 2 // one real execution
	f.job(3, "")
	f.r.jobs[3].final = "cancelled"
	f.r.ops = append(f.r.ops, clientOp{op: "cancel", job: 3, before: f.at(40), after: f.at(41), state: "cancelled"})
	f.ran(3, 60, 10, "cancelled") // ran after its cancellation
	got := strings.Join(f.found("outcome"), "\n")
	for _, want := range []string{
		"job 1 completed with 2 successful runs of 2",
		"job 2: attempt 2, but 1 real executions",
		"job 3 ran at",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("outcome violations lack %q:\n%s", want, got)
		}
	}
}

func TestCheckHerdFindsTooManyResumed(t *testing.T) {
	f := newFakeRecord(limits{max: 2})
	// Parked jobs all resumed at once under a limit of 2: more than the
	// limit and its lookahead (kindLookahead) wait unstarted.
	n := int64(2 + kindLookahead + 8)
	for id := int64(1); id <= n; id++ {
		f.job(id, "")
		f.state(id, "available", "running", 1)
		f.state(id, "running", "pending", 2)
		f.state(id, "pending", "available", 500)
	}
	for id := int64(1); id <= n; id++ {
		f.ran(id, 500+int(id)*100, 50, "ok")
	}
	got := f.found("herd")
	if len(got) == 0 || !strings.Contains(got[0], fmt.Sprintf("%d resumed jobs waiting to start", 2+kindLookahead+1)) {
		t.Fatalf("herd violations: %q", got)
	}
}

func TestCheckLimitsCountsNoRunThatStartedUnlimited(t *testing.T) {
	f := newFakeRecord(limits{})
	f.r.limits["torture.a"] = []limitChange{{at: f.at(-10_000), limits: limits{}}}
	f.job(1, "x")
	f.job(2, "x")
	f.job(3, "x")
	f.ran(1, 10, 3000, "ok") // no limit yet: it takes no slot
	f.r.limits["torture.a"] = append(f.r.limits["torture.a"],
		limitChange{at: f.at(100), limits: limits{present: true, fields: []string{"key"}, keyMax: 1}})
	f.ran(2, 2000, 100, "ok") // the key's one slot: fine beside job 1
	if got := f.found("limit"); len(got) > 0 {
		t.Fatalf("a run from before the limit counted: %q", got)
	}
	f.ran(3, 2050, 100, "ok") // a second slot of the key: too many
	got := f.found("limit")
	if len(got) != 1 || !strings.Contains(got[0], "job 3 started") {
		t.Fatalf("limit violations: %q", got)
	}
}

// TestCheckOutcomesToleratesAnUnwrittenHandOver: a job that waited in w1
// (fetched at 0) and started at startMs, on a slot handed to it in memory,
// ran to its end; w1 was killed at 250 ms before it wrote the move, so the
// rescue took the job for one still waiting and undid its attempt: it ran
// again on w2 and ended at attempt 1 with two executions. That is the
// README's tolerance when it had waited; a job that started at its fetch
// held no hand-over, and the same record is a violation.
func TestCheckOutcomesToleratesAnUnwrittenHandOver(t *testing.T) {
	for _, c := range []struct {
		startMs int
		want    int
	}{{100, 0}, {5, 1}} {
		f := newFakeRecord(limits{max: 2})
		f.r.workers = append(f.r.workers, workerEvent{worker: "w2", what: "start", at: f.at(-10000)},
			workerEvent{worker: "w1", what: "kill", at: f.at(250)})
		f.r.jobs[1] = &job{id: 1, kind: "torture.a", maxAttempts: 5, final: "completed", attempt: 1}
		f.state(1, "", "available", 0)
		f.state(1, "available", "running", 0)
		f.r.runs = append(f.r.runs, run{id: 1, job: 1, kind: "torture.a", attempt: 1, worker: "w1",
			start: f.at(c.startMs), end: f.at(c.startMs + 10), outcome: "ok"})
		f.state(1, "running", "pending", 300)
		f.state(1, "pending", "available", 310)
		f.r.changes[1] = append(f.r.changes[1], change{job: 1, from: "available", to: "running", client: "w2", at: f.at(320)})
		f.r.runs = append(f.r.runs, run{id: 2, job: 1, kind: "torture.a", attempt: 1, worker: "w2",
			start: f.at(320), end: f.at(330), outcome: "ok"})
		f.state(1, "running", "completed", 330)
		if got := f.found("outcome"); len(got) != c.want {
			t.Fatalf("started %d ms after its fetch: outcome violations %q, want %d", c.startMs, got, c.want)
		}
	}
}

// TestCheckOutcomesToleratesAnUndoneFailedAttempt: a job of 2 attempts,
// failing every time, failed on w1 at 100 ms; w1 was killed at 250 ms,
// after the job, fetched again, had waited and started at startMs on a
// slot handed over in memory (its move not written): the rescue undid that
// attempt, and the job failed twice more on w2 before River discarded it.
// Three failed runs for two attempts is the README's tolerance then; with
// no hand-over to lose (it started at its fetch), it is a violation.
func TestCheckOutcomesToleratesAnUndoneFailedAttempt(t *testing.T) {
	for _, c := range []struct {
		startMs int
		want    int
	}{{200, 0}, {121, 2}} {
		f := newFakeRecord(limits{max: 2})
		f.r.workers = append(f.r.workers, workerEvent{worker: "w2", what: "start", at: f.at(-10000)},
			workerEvent{worker: "w1", what: "kill", at: f.at(250)})
		f.r.jobs[1] = &job{id: 1, kind: "torture.a", args: jobArgs{Fail: 9}, maxAttempts: 2, final: "discarded", attempt: 2}
		f.state(1, "", "available", 0)
		runs := []struct {
			worker           string
			fetchMs, startMs int
		}{{"w1", 0, 0}, {"w1", 120, c.startMs}, {"w2", 320, 320}}
		for i, x := range runs {
			f.r.changes[1] = append(f.r.changes[1], change{job: 1, from: "available", to: "running", client: x.worker, at: f.at(x.fetchMs)})
			f.r.runs = append(f.r.runs, run{id: int64(i + 1), job: 1, kind: "torture.a", attempt: 1, worker: x.worker,
				start: f.at(x.startMs), end: f.at(x.startMs + 10), outcome: "fail"})
			switch i {
			case 0:
				f.state(1, "running", "available", 20)
			case 1:
				f.state(1, "running", "pending", 300)
				f.state(1, "pending", "available", 310)
			}
		}
		f.state(1, "running", "discarded", 330)
		if got := f.found("outcome"); len(got) != c.want {
			t.Fatalf("started %d ms after its fetch: outcome violations %q, want %d", c.startMs, got, c.want)
		}
	}
}

// TestCheckOutcomesToleratesASuccessLostToAKill: a job of 2 attempts ran
// successfully on w1, which was killed before River wrote the completion
// (within completionWindow: the rescue made it retryable), and an enqueue
// policy's replace gave it args that always fail, so it failed on w2 and
// was discarded (CI's seed 450221669). The lost success is River's at
// least once, as for a completed job; with w1 killed long after the run,
// the success was River's to record, and a discarded job with it is a
// violation.
func TestCheckOutcomesToleratesASuccessLostToAKill(t *testing.T) {
	for _, c := range []struct {
		killMs int
		want   int
	}{{150, 0}, {5000, 1}} {
		f := newFakeRecord(limits{})
		f.r.workers = append(f.r.workers, workerEvent{worker: "w2", what: "start", at: f.at(-10000)},
			workerEvent{worker: "w1", what: "kill", at: f.at(c.killMs)})
		f.r.jobs[1] = &job{id: 1, kind: "torture.a", args: jobArgs{Fail: 9}, maxAttempts: 2, final: "discarded", attempt: 2}
		f.state(1, "", "available", 0)
		f.r.changes[1] = append(f.r.changes[1], change{job: 1, from: "available", to: "running", client: "w1", at: f.at(0)})
		f.r.runs = append(f.r.runs, run{id: 1, job: 1, kind: "torture.a", attempt: 1, worker: "w1",
			start: f.at(5), end: f.at(15), outcome: "ok"})
		f.state(1, "running", "retryable", c.killMs+500)
		f.state(1, "retryable", "available", c.killMs+600)
		f.r.changes[1] = append(f.r.changes[1], change{job: 1, from: "available", to: "running", client: "w2", at: f.at(c.killMs + 610)})
		f.r.runs = append(f.r.runs, run{id: 2, job: 1, kind: "torture.a", attempt: 2, worker: "w2",
			start: f.at(c.killMs + 620), end: f.at(c.killMs + 630), outcome: "fail"})
		f.state(1, "running", "discarded", c.killMs+640)
		if got := f.found("outcome"); len(got) != c.want {
			t.Fatalf("w1 killed %d ms after the success: outcome violations %q, want %d", c.killMs-15, got, c.want)
		}
	}
}

// TestCheckHerdFindsAResumeUnderARate: under a rate of 3 a second (no
// lookahead), 6 parked jobs resumed at once are a herd.
func TestCheckHerdFindsAResumeUnderARate(t *testing.T) {
	f := newFakeRecord(limits{rateMax: 3, ratePeriod: time.Second})
	for id := int64(1); id <= 6; id++ {
		f.job(id, "")
		f.state(id, "available", "running", 1)
		f.state(id, "running", "pending", 2)
		f.state(id, "pending", "available", 500)
	}
	for id := int64(1); id <= 6; id++ {
		f.ran(id, 500+int(id)*400, 10, "ok")
	}
	got := f.found("herd")
	if len(got) == 0 || !strings.Contains(got[0], "4 resumed jobs waiting to start") {
		t.Fatalf("herd violations: %q", got)
	}
}

// TestCheckHerdResumedJobWhoseSlotAnOlderJobTook: under a per-kind limit
// of 1 and a per-key rate, k1's job 7 is resumed at 574 ms; k1's older job
// 5, back from a snooze, was fetched at 571 ms (as the resume's round ran:
// the round could not see it) and takes the slot, starting at 584 ms; job
// 7 waits on in the line, and k0's job 8 resumed at 593 ms is no second
// resumed job waiting. When job 5 was fetched at 300 ms, long before the
// resume, the round should have seen it: two resumed jobs wait at 593 ms;
// and when job 5 was itself resumed (at 560 ms, with a slot of its own),
// it took no other job's.
func TestCheckHerdResumedJobWhoseSlotAnOlderJobTook(t *testing.T) {
	for _, c := range []struct {
		fetch5  int
		resumed bool
		found   bool
	}{{571, false, false}, {300, false, true}, {571, true, true}} {
		f := newFakeRecord(limits{max: 1, fields: []string{"key"}, rateMax: 3, ratePeriod: time.Second, ratePerKey: true})
		f.job(5, "k1")
		if c.resumed {
			f.state(5, "available", "running", 1)
			f.state(5, "running", "pending", 2)
			f.state(5, "pending", "available", 560)
		}
		f.fetched(5, "w1", c.fetch5)
		f.started(5, "w1", 584, 5)
		for _, j := range []struct {
			id                   int64
			key                  string
			resume, fetch, start int
		}{{7, "k1", 574, 577, 1183}, {8, "k0", 593, 595, 600}} {
			f.job(j.id, j.key)
			f.state(j.id, "available", "running", 1)
			f.state(j.id, "running", "pending", 2)
			f.state(j.id, "pending", "available", j.resume)
			f.fetched(j.id, "w1", j.fetch)
			f.started(j.id, "w1", j.start, 10)
		}
		if got := f.found("herd"); (len(got) > 0) != c.found {
			t.Fatalf("job 5 fetched at %d ms (resumed: %v): herd violations %q, want some: %v", c.fetch5, c.resumed, got, c.found)
		}
	}
}

// TestCheckHerdFindsAResumedJobParkedAgain: a job resumed, fetched and
// parked again before it ran, its limits unchanged and its worker alive,
// was resumed for nothing; the same after its limit was lowered is not.
func TestCheckHerdFindsAResumedJobParkedAgain(t *testing.T) {
	for _, lowered := range []bool{false, true} {
		f := newFakeRecord(limits{max: 2})
		f.job(1, "")
		f.state(1, "available", "running", 1)
		f.state(1, "running", "pending", 2)
		f.state(1, "pending", "available", 100)
		f.state(1, "available", "running", 110)
		f.state(1, "running", "pending", 700)
		if lowered {
			f.r.limits["torture.a"] = append(f.r.limits["torture.a"], limitChange{at: f.at(300), limits: limits{present: true, max: 1}})
		}
		f.state(1, "pending", "available", 900)
		f.ran(1, 910, 10, "ok")
		got := f.found("herd")
		if lowered && len(got) > 0 {
			t.Fatalf("parked again after its limit was lowered: %q", got)
		}
		if !lowered && (len(got) != 1 || !strings.Contains(got[0], "parked again")) {
			t.Fatalf("herd violations: %q", got)
		}
	}
}

// TestCheckHerdReparkedAfterABreakerSetAgain: a circuit breaker is
// raised to 6 (the change's transaction from 80 to 100 ms) and set again
// (from 101 to 130 ms); job 1, resumed by the raise at 90 ms and fetched
// at 95 ms, parks again at 150 ms: its limits were tightened meanwhile,
// though the breaker it ends under is the one it was resumed from.
func TestCheckHerdReparkedAfterABreakerSetAgain(t *testing.T) {
	f := newFakeRecord(limits{max: -1})
	f.r.limits["torture.a"] = append(f.r.limits["torture.a"],
		limitChange{began: f.at(80), at: f.at(100), limits: limits{present: true, max: 6}},
		limitChange{began: f.at(101), at: f.at(130), limits: limits{present: true, max: -1}},
		limitChange{began: f.at(800), at: f.at(810), limits: limits{present: true, max: 6}})
	f.parked(1)
	f.reparked(1, 90, 95, 150)
	if got := f.found("herd"); len(got) > 0 {
		t.Fatalf("parked again after a breaker was set again: %q", got)
	}
}

// TestUnseenPendingIsFolded: a step back (running → pending → available
// in one transaction) reads as running → available, as every other
// session saw it; a parking and a resume in two transactions stay two
// changes; a parking undone in its own transaction is no change.
func TestUnseenPendingIsFolded(t *testing.T) {
	at := func(ms int) time.Time { return time.Date(2026, 12, 4, 0, 0, 0, ms*int(time.Millisecond), time.UTC) }
	got := unseenPendingFolded([]change{
		{from: "available", to: "running", at: at(1), tx: 1},
		{from: "running", to: "pending", at: at(2), tx: 2},
		{from: "pending", to: "available", at: at(3), tx: 2, query: "step back"},
		{from: "available", to: "running", at: at(4), tx: 3},
		{from: "running", to: "pending", at: at(5), tx: 4},
		{from: "pending", to: "available", at: at(6), tx: 5},
		{from: "available", to: "pending", at: at(7), tx: 6},
		{from: "pending", to: "available", at: at(8), tx: 6},
	})
	var seen []string
	for _, c := range got {
		seen = append(seen, c.from+"→"+c.to)
	}
	want := []string{"available→running", "running→available", "available→running", "running→pending", "pending→available"}
	if !slices.Equal(seen, want) {
		t.Fatalf("folded: %v, want %v", seen, want)
	}
	if got[1].query != "step back" || !got[1].at.Equal(at(2)) {
		t.Fatalf("the fold keeps the resume's statement and the first change's time: %+v", got[1])
	}
}

// TestCheckOutcomesFindsALostRow: a job gone from river_job that the test
// never deleted is lost; one it deleted is not.
func TestCheckOutcomesFindsALostRow(t *testing.T) {
	f := newFakeRecord(limits{max: 2})
	f.job(1, "")
	f.job(2, "")
	for _, id := range []int64{1, 2} {
		f.state(id, "available", "running", 10)
		f.state(id, "running", "pending", 20)
		f.state(id, "pending", "deleted", 40)
		f.r.jobs[id].final, f.r.jobs[id].attempt = "", 0
	}
	f.r.ops = append(f.r.ops, clientOp{op: "delete", job: 2, before: f.at(35), after: f.at(41), state: "pending"})
	got := f.found("outcome")
	if len(got) != 1 || !strings.Contains(got[0], "job 1 is gone from river_job") {
		t.Fatalf("outcome violations: %q", got)
	}
}

// TestCheckOutcomesFindsAnUnaskedCancel: a job cancelled that the test
// never cancelled was lost to a cancellation.
func TestCheckOutcomesFindsAnUnaskedCancel(t *testing.T) {
	f := newFakeRecord(limits{max: 2})
	f.job(1, "")
	f.state(1, "available", "cancelled", 10)
	f.r.jobs[1].final, f.r.jobs[1].attempt = "cancelled", 0
	got := f.found("outcome")
	if len(got) != 1 || !strings.Contains(got[0], "never cancelled it") {
		t.Fatalf("outcome violations: %q", got)
	}
}

// TestCheckAccountingAgainstTheRecord: the limiter's count of a kind's
// slots is judged against the runs: fewer than those working, or more
// than those working within slotLead and slotLag, is a violation; and its
// limit row's count against its slot rows and leased slots, in the same
// sample.
func TestCheckAccountingAgainstTheRecord(t *testing.T) {
	for _, c := range []struct {
		counted, rows int
		want          []string
	}{
		{2, 2, nil},
		{1, 1, []string{"counts 1 slots, but 2 jobs that hold one are working", "stand for 1 slots, but 2 jobs"}},
		{5, 5, []string{"counts 5 slots, but only 2 jobs work within", "stand for 5 slots, but only 2 jobs"}},
		{1, 2, []string{"its limit row counts 1 slots, but its slot rows and leased slots are 2", "counts 1 slots, but 2 jobs"}},
		{3, 2, []string{"its limit row counts 3 slots, but its slot rows and leased slots are 2", "counts 3 slots, but only 2 jobs"}},
	} {
		f := newFakeRecord(limits{max: 4})
		f.job(1, "")
		f.job(2, "")
		f.ran(1, 0, 5000, "ok")
		f.ran(2, 100, 5000, "ok")
		f.r.samples = []sample{{at: f.at(2500), counted: map[string]int{"torture.a": c.counted},
			rows: map[string]int{"torture.a": c.rows}}}
		got := f.found("accounting")
		if len(got) != len(c.want) {
			t.Fatalf("counted %d, rows %d: accounting violations %q, want %q", c.counted, c.rows, got, c.want)
		}
		for i, want := range c.want {
			if !strings.Contains(got[i], want) {
				t.Fatalf("counted %d, rows %d: accounting violations %q, want %q", c.counted, c.rows, got, c.want)
			}
		}
	}
}

// TestCheckAccountingPerKey: a key's slot rows, and the slots its key row
// counts, are judged against its runs.
func TestCheckAccountingPerKey(t *testing.T) {
	f := newFakeRecord(limits{fields: []string{"key"}, keyMax: 2})
	f.job(1, "x")
	f.ran(1, 0, 5000, "ok")
	f.job(2, "z")
	f.ran(2, 0, 5000, "ok")
	f.r.samples = []sample{{at: f.at(2500), counted: map[string]int{"torture.a": 2}, rows: map[string]int{"torture.a": 2},
		keyRows:    map[string]map[string]int{"torture.a": {`"x"`: 0, `"y"`: 1, `"z"`: 1}},
		keyCounted: map[string]map[string]int{"torture.a": {`"x"`: 1, `"z"`: 2}}}}
	got := strings.Join(f.found("accounting"), "\n")
	for _, want := range []string{"key x at", "0 slot rows, but 1 jobs of the key", "key y at", "1 slot rows, but only 0 jobs",
		"key z at", "2 slots counted on its key row, but only 1 jobs"} {
		if !strings.Contains(got, want) {
			t.Errorf("accounting violations lack %q:\n%s", want, got)
		}
	}
	if n := strings.Count(got, "\n") + 1; n != 3 {
		t.Errorf("%d violations, want 3 (x's rows, y's rows, z's count):\n%s", n, got)
	}
}

// TestCheckAccountingJudgesASampleBetweenItsTimes: a sample's snapshot
// lies somewhere between its two times (the client's clock before the
// query, clock_timestamp() in it). A job that began between them may have
// begun after the snapshot, and one that ended between them may have
// given its slot back before it: neither surely holds a slot the sample
// must show. A job working through both times does.
func TestCheckAccountingJudgesASampleBetweenItsTimes(t *testing.T) {
	for _, c := range []struct {
		start, end int // the run, in ms; the sample is taken from 2500 to 2502 ms
		found      bool
	}{
		{2501, 5000, false}, // began between the times
		{0, 2501, false},    // ended between the times
		{2499, 5000, true},  // began before: its slot committed before the snapshot
	} {
		f := newFakeRecord(limits{max: 4})
		f.job(1, "")
		f.ran(1, c.start, c.end-c.start, "ok")
		f.r.samples = []sample{{at: f.at(2500), to: f.at(2502), counted: map[string]int{"torture.a": 0},
			rows: map[string]int{"torture.a": 0}}}
		if got := f.found("accounting"); (len(got) > 0) != c.found {
			t.Errorf("run %d–%d ms, sampled 2500–2502 ms: accounting violations %q, want found %v", c.start, c.end, got, c.found)
		}
	}
}

// TestCheckFairnessFindsAKeyHeldBack: under a per-kind limit of 2 and a
// per-key limit, key B's job arrives while 6 jobs of key A wait; it is
// fetched at once but starts only after 4 more of A's jobs: more than a
// turn (1 other key) and the kind's limit (2).
// TestCheckFairnessCountsJobsResumedAhead: A's jobs 3 to 6, parked, were
// resumed by a grant (not let go) at 105 ms and fetched at 106 ms, before
// B's job was fetched at 110 ms: they hold their places, and their four
// starts before B's are a turn B waits behind. The same four starts by
// jobs never parked break fairness (TestCheckFairnessFindsAKeyHeldBack).
func TestCheckFairnessCountsJobsResumedAhead(t *testing.T) {
	f := newFakeRecord(limits{max: 2, fields: []string{"key"}, keyMax: 2})
	for id := int64(1); id <= 8; id++ {
		f.job(id, "A")
		f.r.jobs[id].inserted = f.at(0)
	}
	f.job(20, "B")
	f.r.jobs[20].inserted = f.at(100)
	f.r.changes[20][0].at = f.at(100)
	for id := int64(1); id <= 8; id++ {
		f.state(id, "available", "running", 1)
	}
	for id := int64(3); id <= 6; id++ {
		f.state(id, "running", "pending", 2)
		f.r.changes[id] = append(f.r.changes[id], change{job: id, from: "pending", to: "available", client: "w1", at: f.at(105),
			query: "-- name: LedgerGrantParked :exec WITH ..."})
		f.fetched(id, "w1", 106)
	}
	f.started(1, "w1", 1, 99)
	f.started(2, "w1", 1, 99)
	for id := int64(3); id <= 6; id++ {
		f.started(id, "w1", 200+int(id-3)/2*200, 99)
	}
	f.fetched(20, "w1", 110)
	f.started(20, "w1", 650, 10)
	if got := f.found("fairness"); len(got) > 0 {
		t.Fatalf("B waited behind jobs resumed ahead of it: %q", got)
	}
}

func TestCheckFairnessFindsAKeyHeldBack(t *testing.T) {
	for _, late := range []bool{false, true} {
		f := newFakeRecord(limits{max: 2, fields: []string{"key"}, keyMax: 2})
		for id := int64(1); id <= 8; id++ {
			f.job(id, "A")
			f.r.jobs[id].inserted = f.at(0)
		}
		f.job(20, "B")
		f.r.jobs[20].inserted = f.at(100)
		f.r.changes[20][0].at = f.at(100)
		for id := int64(1); id <= 8; id++ {
			f.state(id, "available", "running", 1)
		}
		// A's jobs run two at a time, 100 ms each.
		for id := int64(1); id <= 8; id++ {
			f.started(id, "w1", 1+int(id-1)/2*100, 99)
		}
		f.fetched(20, "w1", 110)
		startB := 160
		if late {
			startB = 650
		}
		f.started(20, "w1", startB, 10)
		got := f.found("fairness")
		if !late && len(got) > 0 {
			t.Fatalf("B started within a turn: %q", got)
		}
		if late && (len(got) != 1 || !strings.Contains(got[0], "after 4 starts of 1 other keys")) {
			t.Fatalf("fairness violations: %q", got)
		}
	}
}

// TestCheckFairnessWakeJitter: B's job arrives behind A's backlog (the
// kind's limit 2, A's jobs 100 ms each) and starts in the round after its
// fetch, woken with one of A's: A's begins 3 ms before B's (one round, its
// goroutine first), which is not ahead of B; begun 30 ms before, it is.
func TestCheckFairnessWakeJitter(t *testing.T) {
	for _, c := range []struct {
		beforeMs int
		want     int
	}{{3, 0}, {30, 1}} {
		f := newFakeRecord(limits{max: 2, fields: []string{"key"}, keyMax: 2})
		for id := int64(1); id <= 8; id++ {
			f.job(id, "A")
			f.r.jobs[id].inserted = f.at(0)
			f.state(id, "available", "running", 1)
		}
		f.job(20, "B")
		f.r.jobs[20].inserted = f.at(100)
		f.r.changes[20][0].at = f.at(100)
		f.fetched(20, "w1", 110)
		// A's 1 and 2 run from 1 ms, 3 and 4 (the kind's limit, let go
		// before B was decided) from 115 ms, 5 (A's turn) from 220 ms, 6
		// with B.
		f.started(1, "w1", 1, 99)
		f.started(2, "w1", 1, 99)
		f.started(3, "w1", 115, 100)
		f.started(4, "w1", 115, 100)
		f.started(5, "w1", 220, 100)
		f.started(20, "w1", 330, 10)
		f.started(6, "w1", 330-c.beforeMs, 100)
		if got := f.found("fairness"); len(got) != c.want {
			t.Fatalf("A's job begun %d ms before B's: fairness violations %q, want %d", c.beforeMs, got, c.want)
		}
	}
}

// TestCheckFairnessFindsAFetchHeldBack: key B's job, arriving behind A's
// backlog, fetched only 3 s later, was held back by it.
func TestCheckFairnessFindsAFetchHeldBack(t *testing.T) {
	f := newFakeRecord(limits{max: 2, fields: []string{"key"}, keyMax: 2})
	f.backlog(8, 1000)
	f.arrives(3100, 3110)
	got := f.found("fairness")
	if len(got) != 1 || !strings.Contains(got[0], "was fetched 3s later") {
		t.Fatalf("fairness violations: %q", got)
	}
}

// TestCheckRatesCountTheWorkersStarts: the rate check counts a start when
// the worker's record says the job began, whatever the limiter's rows say:
// three starts within a 1-s window under 2/1s are a violation.
func TestCheckRatesCountTheWorkersStarts(t *testing.T) {
	f := newFakeRecord(limits{rateMax: 2, ratePeriod: time.Second})
	f.r.line = map[int64][]lineEvent{}
	for id := int64(1); id <= 3; id++ {
		f.job(id, "")
		// The limiter's rows admit them 1 s apart.
		f.r.line[id] = []lineEvent{{what: "concurrency_starts INSERT", at: f.at(int(id) * 1000), tx: id}}
		f.ran(id, 3000+int(id)*10, 5, "ok")
	}
	got := f.found("rate")
	if len(got) != 1 || !strings.Contains(got[0], "3 starts") {
		t.Fatalf("rate violations: %q", got)
	}
}

// TestCoverageStarvation: a check that exempted more than maxExempt of
// its candidates is starved; one that judged nothing in a whole run too.
func TestCoverageStarvation(t *testing.T) {
	c := newCoverage()
	for range 80 {
		c.judge("order")
	}
	for range 20 {
		c.exempt("order", "order regime changed")
	}
	for range 100 {
		c.judge("limit")
	}
	c.exempt("limit", "x")
	got := strings.Join(c.starved(false), "\n")
	if !strings.Contains(got, "order exempted 20 of 100") || strings.Contains(got, "limit") || strings.Contains(got, "rate") {
		t.Fatalf("starved: %q", got)
	}
	if got := strings.Join(c.starved(true), "\n"); !strings.Contains(got, "rate judged nothing") {
		t.Fatalf("starved over a long run: %q", got)
	}

	// Runs exempted for the drain's own changes of limits (after the
	// schedule) are no candidates of the schedule's: they starve nothing.
	d := newCoverage()
	for range 80 {
		d.judge("order")
	}
	for range 40 {
		d.exempt("order", drainExempt)
	}
	d.exempt("order", "order regime changed")
	if got := d.starved(false); len(got) != 0 {
		t.Fatalf("starved by the drain: %q", got)
	}
	for range 9 {
		d.exempt("order", "may have run with no limit")
	}
	if got := strings.Join(d.starved(false), "\n"); !strings.Contains(got, "order exempted 10 of 90") {
		t.Fatalf("starved beside the drain: %q", got)
	}
}

// TestCheckOrderTellsTheDrainsExemptions: a run fetched and started just
// after the drain's own change of limits (after the schedule) may have run
// with no limit, and is exempted for the drain (no candidate of the
// schedule's); one fetched within the window of a change the schedule
// made is exempted as before, even when it is fetched and starts in the
// drain.
func TestCheckOrderTellsTheDrainsExemptions(t *testing.T) {
	exempts := func(scheduleMs int, schedule limits, fetchMs int) map[string]int {
		f := newFakeRecord(limits{max: 4})
		f.r.limits["torture.a"] = append(f.r.limits["torture.a"],
			limitChange{at: f.at(90), limits: limits{}},
			limitChange{at: f.at(scheduleMs), limits: schedule},
			limitChange{at: f.at(410), limits: limits{present: true, max: 20}})
		f.r.drainFrom = f.at(400)
		f.job(1, "")
		f.fetched(1, "w1", fetchMs)
		f.started(1, "w1", 430, 10)
		return check(f.r).coverage["order"].exempt
	}
	if got := exempts(100, limits{}, 412); got[drainExempt] != 1 || len(got) != 1 {
		t.Fatalf("fetched just after the drain's change: %v", got)
	}
	for _, ms := range []int{390, 405} {
		if got := exempts(380, limits{present: true, max: 4}, ms); got["may have run with no limit"] != 1 || len(got) != 1 {
			t.Fatalf("fetched at %d ms, just after the schedule's change: %v", ms, got)
		}
	}
}

// TestCheckOrderJudgesLeasedRuns: a run fetched within the window of a
// change that set a per-kind limit (from none) may have run with no limit,
// and is exempt; unless its worker's run log says the limiter let it start
// on a leased slot: then it is judged by fetch, and starting while an
// older job fetched well before it waits is a violation (seed 441286793
// starved on 16 such runs).
func TestCheckOrderJudgesLeasedRuns(t *testing.T) {
	order := func(slot string) (map[string]int, []string) {
		f := newFakeRecord(limits{max: 4})
		f.r.limits["torture.a"] = append(f.r.limits["torture.a"],
			limitChange{at: f.at(90), limits: limits{}},
			limitChange{at: f.at(380), limits: limits{present: true, max: 1}})
		f.job(1, "")
		f.job(2, "")
		f.fetched(1, "w1", 330) // waits for a slot until 600
		f.started(1, "w1", 600, 10)
		f.fetched(2, "w2", 395) // within the change's window
		f.started(2, "w2", 400, 10)
		f.r.runs[len(f.r.runs)-1].slot = slot
		return check(f.r).coverage["order"].exempt, f.found("order")
	}
	if exempt, vs := order(""); exempt["may have run with no limit"] != 1 || len(vs) != 0 {
		t.Fatalf("no slot recorded: exempt %v, violations %q", exempt, vs)
	}
	if exempt, vs := order("leased"); len(exempt) != 0 || len(vs) != 1 || !strings.Contains(vs[0], "job 2 started") {
		t.Fatalf("on a leased slot: exempt %v, violations %q", exempt, vs)
	}
}

// TestCheckFairnessKeyRate: under a per-key rate of 2/1s, key B's job
// arrives behind A's backlog (the kind's limit 2), fetched at 110 ms,
// after two of B's own jobs started at 5 and 6 ms: its own window holds
// it back until about 1 s, and A's starts before that are not ahead of it.
// The same when the rate is set only at 200 ms, while B waits: it counts
// B's starts before it (seed 371433671: a kind-wide rate made per key
// while the key waited). With one earlier start of B's, its window had
// room, and A's 12 starts are.
func TestCheckFairnessKeyRate(t *testing.T) {
	rate := limits{max: 2, fields: []string{"key"}, rateMax: 2, ratePeriod: time.Second, ratePerKey: true}
	for _, setWhileWaiting := range []bool{false, true} {
		for _, earlier := range []int{2, 1} {
			f := newFakeRecord(rate)
			if setWhileWaiting {
				f = newFakeRecord(limits{max: 2, fields: []string{"key"}})
				set := rate
				set.present = true
				f.r.limits["torture.a"] = append(f.r.limits["torture.a"], limitChange{at: f.at(200), limits: set})
			}
			f.backlog(16, 100)
			f.startedEarlier(17, earlier)
			f.arrives(110, 1010)
			got := f.found("fairness")
			if earlier == 2 && len(got) > 0 {
				t.Fatalf("rate set while it waited %v: B was held back by its own rate, not by A: %q", setWhileWaiting, got)
			}
			if earlier == 1 && (len(got) != 1 || !strings.Contains(got[0], "after 12 starts")) {
				t.Fatalf("rate set while it waited %v: B's window had room: fairness violations %q", setWhileWaiting, got)
			}
		}
	}
}

// TestCheckFairnessKeyRateFilledAfterItsFetch: under a per-key rate of
// 2/1s, B's one earlier start (5 ms) leaves its window room at its job's
// fetch (110 ms); a younger job of B's, fetched with it in another worker,
// starts first at 115 ms (the order check's "fetched at about the same
// time"), and fills B's window until about 1 s: A's starts before that are
// not ahead of B's job (seed 870277562: 15 starts of 7 other keys where 9
// were allowed, all while its key's window was full). With the younger
// job's start after B's job's own, the window had room, and A's 12 starts
// are.
func TestCheckFairnessKeyRateFilledAfterItsFetch(t *testing.T) {
	for _, youngerFirst := range []bool{true, false} {
		f := newFakeRecord(limits{max: 2, fields: []string{"key"}, rateMax: 2, ratePeriod: time.Second, ratePerKey: true})
		f.backlog(16, 100)
		f.startedEarlier(17, 1)
		f.arrives(110, 1010)
		f.job(30, "B")
		f.r.jobs[30].inserted = f.at(105)
		f.fetched(30, "w2", 111)
		if youngerFirst {
			f.started(30, "w2", 115, 10)
		} else {
			f.started(30, "w2", 1020, 10)
		}
		got := f.found("fairness")
		if youngerFirst && len(got) > 0 {
			t.Fatalf("B's window filled by its younger job at 115 ms: B was held back by its own rate, not by A: %q", got)
		}
		if !youngerFirst && (len(got) != 1 || !strings.Contains(got[0], "after 12 starts")) {
			t.Fatalf("B's window had room: fairness violations %q", got)
		}
	}
}

// TestCheckFairnessKeyRateFreesAPeriodAfterTheCodeBegan: under a per-key
// rate of 2/1s, B's two jobs began at 5 and 6 ms (the limiter logged their
// starts up to 150 ms before: its window frees between 855 and 1,006 ms),
// and B's next job, arriving behind A's backlog, starts at 1,012 ms. A's
// starts from 860 to 1,000 ms may all have come while B's window was
// full: they are not ahead of it. A's starts from 300 ms on, with B's
// window freeing at 1 s less nothing, would be: B's two earlier starts at
// 5 and 6 ms with a rate of 2/500ms free it at 506 ms.
func TestCheckFairnessKeyRateFreesAPeriodAfterTheCodeBegan(t *testing.T) {
	for _, c := range []struct {
		period time.Duration
		found  bool
	}{{time.Second, false}, {500 * time.Millisecond, true}} {
		f := newFakeRecord(limits{max: 2, fields: []string{"key"}, rateMax: 2, ratePeriod: c.period, ratePerKey: true})
		f.backlog(40, 50)
		f.startedEarlier(41, 2)
		f.arrivesAs(50, 110, 1012)
		if got := f.found("fairness"); (len(got) > 0) != c.found {
			t.Fatalf("rate 2/%s: fairness violations %q, want some: %v", c.period, got, c.found)
		}
	}
}

// TestCheckFairnessJudgedUpToAChange: B's job, arriving behind A's backlog
// (the kind's limit 2), starts at 650 ms, after 4 of A's starts; the
// kind-wide limit is cleared meanwhile. Cleared at 350 ms, the 4 starts
// came while the promise held: a violation. Cleared at 250 ms, 2 did: none.
// Cleared before B's fetch, the wait is not judged at all.
func TestCheckFairnessJudgedUpToAChange(t *testing.T) {
	for _, c := range []struct {
		clearMs    int
		violations int
		exempt     string
	}{{350, 1, ""}, {250, 0, ""}, {105, 0, "partition or kind-wide limit changed before its turn could come"}} {
		f := newFakeRecord(limits{max: 2, fields: []string{"key"}, keyMax: 2})
		f.r.limits["torture.a"] = append(f.r.limits["torture.a"],
			limitChange{at: f.at(c.clearMs), limits: limits{present: true, fields: []string{"key"}, keyMax: 2}})
		f.backlog(8, 100)
		f.arrives(110, 650)
		if got := f.found("fairness"); len(got) != c.violations {
			t.Fatalf("cleared at %d ms: fairness violations %q, want %d", c.clearMs, got, c.violations)
		}
		if c.exempt != "" && check(f.r).coverage["fairness"].exempt[c.exempt] != 1 {
			t.Fatalf("cleared at %d ms: exemptions %v", c.clearMs, check(f.r).coverage["fairness"].exempt)
		}
	}
}

// TestCheckFairnessJudgedUpToItsWorkersKill: B's job arrives behind A's
// backlog (the kind's limit 2, A's jobs 100 ms each), is fetched by w1 at
// 110 ms, and starts at 650 ms, after w1 was killed: its wait is judged up
// to the kill, not exempted. Killed at 350 ms, 4 of A's starts came before
// it (a turn is 3): held back; at 250 ms, 2: not; at 105 ms, before its
// fetch, its turn could not come: exempt.
func TestCheckFairnessJudgedUpToItsWorkersKill(t *testing.T) {
	for _, c := range []struct {
		killMs     int
		violations int
		exempt     string
	}{{350, 1, ""}, {250, 0, ""}, {105, 0, "its worker was killed before its turn could come"}} {
		f := newFakeRecord(limits{max: 2, fields: []string{"key"}, keyMax: 2})
		f.backlog(8, 100)
		f.arrives(110, 650)
		f.r.workers = append(f.r.workers, workerEvent{worker: "w1", what: "kill", at: f.at(c.killMs)})
		if got := f.found("fairness"); len(got) != c.violations {
			t.Fatalf("killed at %d ms: fairness violations %q, want %d", c.killMs, got, c.violations)
		}
		cov := check(f.r).coverage["fairness"]
		if c.exempt != "" && cov.exempt[c.exempt] != 1 {
			t.Fatalf("killed at %d ms: exemptions %v", c.killMs, cov.exempt)
		}
		if c.exempt == "" && cov.judged != 1 {
			t.Fatalf("killed at %d ms: %d judged, want 1", c.killMs, cov.judged)
		}
	}
}

// TestCheckFairnessJudgesAnInsertByItsOldestJob: one insert at 100 ms
// brings B's jobs 20 and 22 and C's jobs 21 and 23–30 (their rows a few
// µs apart) behind A's backlog. The insert's jobs arrive together: none of
// them is another's backlog, and B arrives with job 20, judged against
// the backlog before the insert. With 2 of A's jobs waiting (fewer than
// fairnessBacklog) B is no arrival, though C's job 21 is older than B's
// 22, and 22 starting after C's eight starts breaks nothing (it was
// judged, and failed, when C's jobs were counted as 22's backlog); with 6
// of A's jobs waiting, jobs 20 and 21 (C's arrival) are judged, and 20
// is found held back when it starts after C's eight.
func TestCheckFairnessJudgesAnInsertByItsOldestJob(t *testing.T) {
	for _, c := range []struct {
		backlog, start20 int
		judged, found    int
	}{{4, 150, 0, 0}, {8, 150, 2, 0}, {8, 950, 2, 1}} {
		f := newFakeRecord(limits{max: 2, fields: []string{"key"}, keyMax: 2})
		f.backlog(c.backlog, 100)
		insert := []struct {
			id  int64
			key string
		}{{20, "B"}, {21, "C"}, {22, "B"}, {23, "C"}, {24, "C"}, {25, "C"}, {26, "C"}, {27, "C"}, {28, "C"}, {29, "C"}, {30, "C"}}
		for i, j := range insert {
			f.job(j.id, j.key)
			f.r.jobs[j.id].inserted = f.at(101)
			f.r.changes[j.id][0].at = f.at(100).Add(time.Duration(i) * 10 * time.Microsecond)
			f.fetched(j.id, "w1", 110)
		}
		for i := range int64(8) {
			f.started(23+i, "w1", 150+int(i)*80, 60)
		}
		f.started(21, "w1", 140, 5)
		f.started(20, "w1", c.start20, 10)
		f.started(22, "w1", 900, 10)
		got := f.found("fairness")
		if len(got) != c.found || (c.found == 1 && !strings.Contains(got[0], "job 20,")) {
			t.Fatalf("backlog %d, job 20 started at %d ms: fairness violations %q, want %d of job 20", c.backlog, c.start20, got, c.found)
		}
		if n := check(f.r).coverage["fairness"].judged; n != c.judged {
			t.Fatalf("backlog %d: %d judged, want %d", c.backlog, n, c.judged)
		}
	}
}

// TestCheckFairnessArrivingInAChangeWindow: a per-kind limit of 2 is set
// over a per-key one 20 ms before B's job arrives behind A's backlog: its
// wait is judged from when every worker has heard of the change (50 ms
// after it), not exempted. Starting at 650 ms after 4 of A's starts from
// then, it was held back; at 250 ms, after 2, it was not.
func TestCheckFairnessArrivingInAChangeWindow(t *testing.T) {
	for _, c := range []struct {
		startMs, want int
	}{{650, 1}, {250, 0}} {
		f := newFakeRecord(limits{fields: []string{"key"}, keyMax: 2})
		f.r.limits["torture.a"] = append(f.r.limits["torture.a"],
			limitChange{at: f.at(80), limits: limits{present: true, max: 2, fields: []string{"key"}, keyMax: 2}})
		f.backlog(8, 100)
		f.arrives(110, c.startMs)
		if got := f.found("fairness"); len(got) != c.want {
			t.Fatalf("started at %d ms: fairness violations %q, want %d", c.startMs, got, c.want)
		}
		if ex := check(f.r).coverage["fairness"].exempted(); ex != 0 {
			t.Fatalf("started at %d ms: %d exempted", c.startMs, ex)
		}
	}
}

// TestCheckAccountingJobFetchedByAWorkerKilledSoon: a job fetched by w2
// at 1000 ms holds a slot of the kind; w2 is killed at 1020 ms, before the
// job began. A sample at 1010 ms (the kill within slotLead after it) counts
// the slot as near; when w2 is killed only at 4000 ms, a sample at 2500 ms
// does not: a job that holds a slot begins within slotLead.
func TestCheckAccountingJobFetchedByAWorkerKilledSoon(t *testing.T) {
	for _, c := range []struct {
		fetch, kill, sample int
		found               bool
	}{
		{1000, 1020, 1010, false},
		{1000, 1020, 1500, false}, // after the kill, until the reaper
		{1000, 4000, 2500, true},  // held 1.5 s before the sample, and on
	} {
		f := newFakeRecord(limits{max: 2})
		f.worker("w2")
		f.job(1, "")
		f.fetched(1, "w2", c.fetch)
		f.r.workers = append(f.r.workers, workerEvent{worker: "w2", what: "kill", at: f.at(c.kill)})
		f.state(1, "running", "retryable", c.kill+600) // rescued
		f.r.samples = []sample{{at: f.at(c.sample), counted: map[string]int{"torture.a": 1}, rows: map[string]int{"torture.a": 1}}}
		got := f.found("accounting")
		if (len(got) > 0) != c.found {
			t.Errorf("fetched at %d ms, killed at %d ms, sampled at %d ms: accounting violations %q, want found %v",
				c.fetch, c.kill, c.sample, got, c.found)
		}
	}
}

// TestCheckAccountingResumedGrantTakenBack: job 1, parked, is resumed at
// 500 ms with a grant (a reserved slot, transaction 5), fetched at 700 ms,
// and parked again without running: a change of limits (transaction 9,
// committed at 800 ms) deleted its reserved slot at revoke ms. A sample
// at 600 ms counts its slot as near, whether the change began after the
// resume or before it (it waited for the kind's lock while the round that
// resumed the job held it: torture seed 743141786). Without the change,
// the same record is a slot no job stood for; so is one whose change took
// the grant back 1.1 s after the resume (a grant leads to a start within
// slotLead), and one whose change did not take this job's grant back.
func TestCheckAccountingResumedGrantTakenBack(t *testing.T) {
	for _, c := range []struct {
		began, revoke, at int // the change (0: none); revoke 0: it did not take the grant back
		found             bool
	}{
		{650, 700, 800, false},
		{400, 650, 800, false}, // began before the resume (seed 743141786)
		{0, 0, 0, true},
		{1600, 1650, 1700, true},
		{650, 0, 800, true},
	} {
		f := newFakeRecord(limits{max: 2})
		f.parked(1)
		f.state(1, "pending", "available", 500)
		f.r.line = map[int64][]lineEvent{}
		f.r.line[1] = append(f.r.line[1], lineEvent{what: "concurrency_executions INSERT", reserved: true, at: f.at(500), tx: 5})
		f.fetched(1, "w1", 700)
		f.state(1, "running", "pending", max(900, c.at+100))
		if c.began != 0 {
			f.r.limits["torture.a"] = append(f.r.limits["torture.a"], limitChange{at: f.at(c.at), began: f.at(c.began), tx: 9,
				limits: limits{present: true, max: 3}})
		}
		if c.revoke != 0 {
			f.r.line[1] = append(f.r.line[1], lineEvent{what: "concurrency_executions DELETE", reserved: true, at: f.at(c.revoke), tx: 9})
		}
		f.r.samples = []sample{{at: f.at(600), counted: map[string]int{"torture.a": 1}, rows: map[string]int{"torture.a": 1}}}
		if got := f.found("accounting"); (len(got) > 0) != c.found {
			t.Errorf("change began at %d ms, took the grant back at %d ms: accounting violations %q, want found %v",
				c.began, c.revoke, got, c.found)
		}
	}
}

// TestCheckHerdCountsResumesFromTheChangesBeginning: under a limit of 1
// and a rate (no lookahead), job 1 is resumed at 500 ms and parked again
// (a change of limits that began at 600 ms took its grant back, committed
// at 800 ms); the change's own transaction resumes job 3 at 700 ms under
// the new limits. Job 1 was resumed under the earlier limits and is not
// counted against the new ones: no herd. Job 4, resumed at 750 ms too, is
// one more than the new limits allow.
func TestCheckHerdCountsResumesFromTheChangesBeginning(t *testing.T) {
	for _, extra := range []bool{false, true} {
		f := newFakeRecord(limits{max: 1, rateMax: 1, ratePeriod: time.Second})
		f.r.limits["torture.a"] = append(f.r.limits["torture.a"], limitChange{at: f.at(800), began: f.at(600), tx: 9,
			limits: limits{present: true, max: 1, rateMax: 1, ratePeriod: 2 * time.Second}})
		f.parked(1, 3)
		if extra {
			f.parked(4)
		}
		f.reparked(1, 500, 550, 900)
		f.state(3, "pending", "available", 700)
		f.lastTx(3, 9) // the change's own transaction
		f.ran(3, 1000, 10, "ok")
		if extra {
			f.state(4, "pending", "available", 750)
			f.lastTx(4, 9)
			f.ran(4, 3000, 10, "ok")
		}
		got := f.found("herd")
		if (len(got) > 0) != extra {
			t.Errorf("job 4 resumed too: %v; herd violations %q", extra, got)
		}
	}
}

// TestCheckHerdResumesByARoundThatBeganBeforeAChange: a change lowers a
// per-key limit from 2 to 1 (its transaction from 100 to 130 ms); a grant
// round that held the kind's lock as it began resumed three jobs of key k
// ahead at 110 ms, under the limits before it (2, and 2 ahead). They wait
// on, not counted against the new limits: a fourth resumed at 300 ms
// under them is alone. Resumed at 110 ms by the change's own transaction,
// the three follow the new limits, and with the fourth they are a herd.
func TestCheckHerdResumesByARoundThatBeganBeforeAChange(t *testing.T) {
	for _, c := range []struct {
		tx    int64
		found bool
	}{{5, false}, {9, true}} {
		f := newFakeRecord(limits{fields: []string{"key"}, keyMax: 2})
		f.r.limits["torture.a"] = append(f.r.limits["torture.a"], limitChange{began: f.at(100), at: f.at(130), tx: 9,
			limits: limits{present: true, fields: []string{"key"}, keyMax: 1}})
		for id := int64(1); id <= 4; id++ {
			f.job(id, "k")
			f.state(id, "available", "running", 1)
			f.state(id, "running", "pending", 2)
		}
		for id := int64(1); id <= 3; id++ {
			f.state(id, "pending", "available", 110)
			f.lastTx(id, c.tx)
			f.ran(id, 2000+int(id)*100, 10, "ok")
		}
		f.state(4, "pending", "available", 300)
		f.lastTx(4, 7)
		f.ran(4, 2500, 10, "ok")
		if got := f.found("herd"); (len(got) > 0) != c.found {
			t.Fatalf("resumed at 110 ms by transaction %d: herd violations %q, want some: %v", c.tx, got, c.found)
		}
	}
}

// TestCheckHerdParkingSeenLate: under a limit of 1 and a rate (no
// lookahead), job 1 is resumed at 500 ms, in a change lowering the limit
// from 2 (begun at 450 ms, committed at 700 ms), fetched at 600 ms and
// parked again (its limits lowered: no finding for the parking itself);
// River shows it pending at 800 ms, its worker having parked it up to
// parkCompletion before. Job 2, resumed at 750 ms, is not resumed beside
// it; resumed at 650 ms, it is.
func TestCheckHerdParkingSeenLate(t *testing.T) {
	for _, c := range []struct {
		resume int
		found  bool
	}{{750, false}, {650, true}} {
		f := newFakeRecord(limits{max: 2, rateMax: 1, ratePeriod: time.Second})
		f.r.limits["torture.a"] = append(f.r.limits["torture.a"], limitChange{at: f.at(700), began: f.at(450), tx: 9,
			limits: limits{present: true, max: 1, rateMax: 1, ratePeriod: time.Second}})
		f.parked(1, 2)
		f.reparked(1, 500, 600, 800)
		for i, ch := range f.r.changes[1] {
			if ch.from == "pending" && ch.at.Equal(f.at(500)) {
				f.r.changes[1][i].tx = 9 // resumed at 500 ms in the change
			}
		}
		f.state(2, "pending", "available", c.resume)
		if c.resume < 700 {
			f.lastTx(2, 9)
		}
		f.ran(2, 1000, 10, "ok")
		if got := f.found("herd"); (len(got) > 0) != c.found {
			t.Errorf("job 2 resumed at %d ms: herd violations %q, want found %v", c.resume, got, c.found)
		}
	}
}

// TestCheckFairnessAnOlderJobOfItsKeyTakesItsTurn: B's job 20 arrives at
// 100 ms behind A's backlog (the kind's limit 2, A's jobs 100 ms each, two
// at a time), B's older job 15 waiting for its retry (retryable at B's
// arrival, so B arrived alone). Job 15 comes back at 120 ms and starts at
// 130 ms, before 20: it takes B's turn, and A has a turn more. Job 20
// started after A's 4 starts at 201 and 301 ms is within one turn each
// for two turns of B's and the kind's limit (4); after A's 8 starts to
// 501 ms it is not. Without job 15's start, 4 of A's are already too many
// (TestCheckFairnessFindsAKeyHeldBack).
func TestCheckFairnessAnOlderJobOfItsKeyTakesItsTurn(t *testing.T) {
	for _, c := range []struct {
		startMs int
		held    bool
	}{{350, false}, {550, true}} {
		f := newFakeRecord(limits{max: 2, fields: []string{"key"}, keyMax: 2})
		f.backlog(12, 100)
		f.job(15, "B")
		f.r.jobs[15].inserted = f.at(0)
		f.state(15, "available", "running", 40)
		f.state(15, "running", "retryable", 50)
		f.state(15, "retryable", "available", 120)
		f.fetched(15, "w1", 125)
		f.started(15, "w1", 130, 5)
		f.arrives(110, c.startMs)
		got := f.found("fairness")
		switch {
		case !c.held && len(got) > 0:
			t.Fatalf("B started within a turn of each other key per turn of its own: %q", got)
		case c.held && (len(got) != 1 || !strings.Contains(got[0], "after 8 starts of 1 other keys")):
			t.Fatalf("fairness violations with B started after 8 of A's: %q", got)
		}
	}
}

// TestCheckFairnessJudgedUpToAGrantOnItsWayBack: B's job, fetched at 110
// ms behind A's backlog (the kind's limit 2, A's jobs 100 ms each), is
// granted its slot at 130 ms while River has it running: its parking
// completing (LedgerGrantParked) or its step back (a job resumed ahead
// giving its worker's River slot back: LedgerInsertSlots, a slot reserved
// for a job without a worker). River's completion writes it at 380 ms, and
// the job, fetched again, starts at 400 ms, after four starts of A (one
// turn and the kind's limit: 3). Its turn came at the grant: it is judged
// up to it. Not granted, or its grant taken back by an older job of its
// line, the same record breaks the promise.
func TestCheckFairnessJudgedUpToAGrantOnItsWayBack(t *testing.T) {
	for _, c := range []struct {
		name, grant   string // grant: the statement that reserved its slot ("": none)
		parked, taken bool
		want          int
	}{
		{"step back", "LedgerInsertSlots", false, false, 0},
		{"parking", "LedgerGrantParked", true, false, 0},
		{"no grant", "", false, false, 1},
		{"grant taken by an older job", "LedgerInsertSlots", false, true, 1},
	} {
		f := newFakeRecord(limits{max: 2, fields: []string{"key"}, keyMax: 2})
		f.r.line = map[int64][]lineEvent{}
		f.backlog(8, 100)
		f.job(20, "B")
		f.r.jobs[20].inserted = f.at(100)
		f.r.changes[20][0].at = f.at(100)
		f.fetched(20, "w1", 110)
		if c.grant != "" {
			f.r.line[20] = append(f.r.line[20], lineEvent{what: "concurrency_executions INSERT", reserved: true, at: f.at(130), tx: 7,
				query: "-- name: " + c.grant + " :exec\nINSERT ..."})
		}
		if c.taken {
			f.r.line[20] = append(f.r.line[20], lineEvent{what: "concurrency_executions DELETE", reserved: true, at: f.at(200), tx: 8,
				query: "-- name: LedgerStealGrants :exec\nWITH ..."})
		}
		if c.parked {
			f.state(20, "running", "pending", 380)
			f.state(20, "pending", "available", 380)
		} else {
			f.state(20, "running", "available", 380)
		}
		f.fetched(20, "w1", 390)
		f.started(20, "w1", 400, 10)
		if got := f.found("fairness"); len(got) != c.want {
			t.Errorf("%s: fairness violations %q, want %d", c.name, got, c.want)
		}
	}
}
