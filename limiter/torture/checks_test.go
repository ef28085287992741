package torture

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/limiter"
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

// found runs the checks and returns the violations of check name.
func (f *fakeRecord) found(name string) []string {
	f.r.runsOf = nil // runs may have been added since the last check
	vs := check(f.r)
	var out []string
	for _, v := range vs.list {
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
	if vs := check(f.r); len(vs.list) > 0 {
		t.Fatalf("a clean record: %v", vs.list)
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
	if len(got) != 1 || !strings.Contains(got[0], "job 2 started") || !strings.Contains(got[0], "older job 1 was parked") {
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

// TestCheckOrderGrantsInOrder: a parked job granted (its start reserved)
// before a younger one waiting in the worker starts after it, being resumed
// and fetched: the grants went in order, no violation; the same record
// without the older job's grant (resumed ahead of one, and passed over)
// is one.
func TestCheckOrderGrantsInOrder(t *testing.T) {
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
			// A round reserves a start for job 1 (resumed) at 100 ms.
			f.r.line[1] = append(f.r.line[1], lineEvent{what: "concurrency_starts INSERT", reserved: true, at: f.at(100), tx: 7})
		}
		// The next round, at 150 ms, grants job 2, which starts at once;
		// job 1, resumed, is fetched and starts 300 ms later.
		f.r.line[2] = append(f.r.line[2], lineEvent{what: "concurrency_starts INSERT", at: f.at(150), tx: 8})
		f.r.runs = append(f.r.runs, run{id: 1, job: 2, kind: "torture.a", attempt: 1, worker: "w1",
			start: f.at(160), end: f.at(170), outcome: "ok"})
		f.state(2, "running", "completed", 170)
		// Job 1 is resumed at 110 ms (with its start, or ahead of one) and
		// fetched by w1 at 120 ms; it starts at 460 ms.
		f.state(1, "pending", "available", 110)
		f.state(1, "available", "running", 120)
		f.r.runs = append(f.r.runs, run{id: 2, job: 1, kind: "torture.a", attempt: 1, worker: "w1",
			start: f.at(460), end: f.at(470), outcome: "ok"})
		f.state(1, "running", "completed", 470)
		got := f.found("order")
		if granted && len(got) > 0 {
			t.Fatalf("granted in order: %q", got)
		}
		if !granted && (len(got) != 1 || !strings.Contains(got[0], "job 2 started")) {
			t.Fatalf("job 2 granted while job 1 waited ungranted: %q", got)
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

func TestCheckResumesFindsAHerd(t *testing.T) {
	f := newFakeRecord(limits{max: 2})
	// Parked jobs all resumed at once under a limit of 2: more than the
	// limit and its lookahead (MinLookahead) wait unstarted.
	n := int64(2 + limiter.MinLookahead + 8)
	for id := int64(1); id <= n; id++ {
		f.job(id, "")
		f.state(id, "available", "running", 1)
		f.state(id, "running", "pending", 2)
		f.state(id, "pending", "available", 500)
	}
	for id := int64(1); id <= n; id++ {
		f.ran(id, 500+int(id)*100, 50, "ok")
	}
	got := f.found("resume")
	if len(got) == 0 || !strings.Contains(got[0], fmt.Sprintf("%d resumed jobs waiting to start", 2+limiter.MinLookahead+1)) {
		t.Fatalf("resume violations: %q", got)
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
