package torture

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// The checks judge the limiter from an independent record only: what the
// workers' own run logs say ran (each execution's start and end, by the
// process's clock), River's state history of every job (by trigger), the
// history of the limits (by trigger) and what the test itself did
// (inserts, River client calls, worker starts, stops and kills, and the
// accounting samples). The limiter's own tables may explain a violation
// in its report; they never excuse one.
//
// The tolerances below are the README's promises table's, each written
// here as a number rather than taken from the code under test.
const (
	// changeWindow is how long after a change of a kind's limits a worker
	// may still follow the limits before it: every worker hears of a
	// change by notification (within 50 ms), and a decision already under
	// way finishes by the limits it read.
	changeWindow = 50 * time.Millisecond
	// rateJitter is how long after its admission a job's own code may
	// begin (the worker's record of its start): a window of the rate's
	// period less rateJitter holds at most the rate's starts.
	rateJitter = 150 * time.Millisecond
	// fetchTolerance is how close two fetches by different workers may be
	// for their jobs to start in either order: River hands them out at
	// once, and the limiter learns of each when its fetch commits.
	fetchTolerance = 50 * time.Millisecond
	// fetchInFlight is how long before a job's start its own worker may
	// fetch an older job of its key and still let it start: the fetch's
	// jobs reach the limiter when the fetch returns, a round trip after
	// its attempted_at (the time the record holds).
	fetchInFlight = 10 * time.Millisecond
	// togetherTolerance is how far apart jobs let start at the same moment
	// (one grant, one fetch's decisions) may start, in either order: each
	// begins as its worker's goroutine does.
	togetherTolerance = 100 * time.Millisecond
	// wakeJitter is how far apart jobs woken by one grant round (in the
	// round's order) may begin, in either order: each begins as its
	// goroutine is scheduled. The fairness check counts no start of
	// another key within it before a key's own as ahead of it.
	wakeJitter = 10 * time.Millisecond
	// leaseTolerance is how long after a parking by another worker (or a
	// resume) a worker on leased slots may still hand a freed slot to a
	// younger job waiting in it: it hears of the parking at its next look
	// (LeasePoll 5 ms, LeaseIdlePoll 25 ms), later on a loaded machine. A
	// worker knows of its own parkings at once: none is tolerated there.
	leaseTolerance = 150 * time.Millisecond
	// livenessBound is the longest a key with waiting jobs may go without
	// a start while its limits have room.
	livenessBound = 3 * time.Second
	// rescueTime is how long after a kill the dead worker's slots may stay
	// taken (until a reaper finds it dead and frees them).
	rescueTime = deadAfter + 2*time.Second
	// cancelTolerance is how long after JobCancel of a job that a worker
	// had fetched it may still start: River cancels its context once the
	// worker hears of it.
	cancelTolerance = 500 * time.Millisecond
	// killTolerance is how soon before a kill a job's start may still be
	// taken for a wait by the rescue (killBlur): a worker publishes the
	// jobs waiting for its leased slots within 20 ms.
	killTolerance = 50 * time.Millisecond
	// handOverWriteWindow is how soon before a kill a job that waited in
	// the killed worker and then started may have started on a slot handed
	// to it in memory whose move the worker had not written yet: the
	// rescue takes it for a job still waiting and undoes its attempt.
	handOverWriteWindow = 500 * time.Millisecond
	// waitedFor is how long after its fetch a job must start to count as
	// having waited in its worker (rather than started at its fetch).
	waitedFor = 20 * time.Millisecond
	// completionWindow is how long after a run ends its worker may die with
	// the job's completion not yet written: River works a job at least
	// once, and such a job runs again.
	completionWindow = time.Second
	// parkCompletion is how long before River shows a job pending its
	// worker may have parked it: River's batch completer writes a job's
	// end every 50 ms or so (later on a loaded machine), and the parking
	// goes with it.
	parkCompletion = 100 * time.Millisecond
	// slotLead and slotLag bound how long a slot may be counted before its
	// job starts (a grant on its way: a resumed job fetched, a claim) and
	// after it ends (its release, written in the background; an idle
	// leased slot kept LeaseLinger).
	slotLead = time.Second
	slotLag  = time.Second
	// kindLookahead and its key share are how many jobs beyond what the
	// limits let start a resume may make available: the README's stated
	// lookahead (per kind 32 under a concurrency limit; per key the key's
	// limit, at most 32; none under a rate).
	kindLookahead = 32
	// fairnessBacklog is how many jobs of other keys must wait for a key's
	// arrival to count as arriving behind a backlog.
	fairnessBacklog = 3
	// fairnessFetch is how long after its insert an arriving key's job
	// must be fetched: jobs waiting in the workers for other keys do not
	// hold every worker's River slots (they park within park-after).
	fairnessFetch = 2 * time.Second
)

// checkResult is what the checks found and what they judged.
type checkResult struct {
	violations *violations
	coverage   coverage
}

// check runs every check of the record.
func check(r *record) checkResult {
	res := checkResult{violations: &violations{}, coverage: newCoverage()}
	r.indexRuns()
	for _, fn := range []func(*record, *violations, coverage){
		checkLimits, checkRates, checkOrder, checkFairness, checkLiveness, checkOutcomes, checkHerd, checkAccounting,
	} {
		fn(r, res.violations, res.coverage)
	}
	return res
}

// keyOf is the key of a job under l: its args' key when l partitions the
// kind, else "".
func keyOf(l limits, key string) string {
	if l.keyed() {
		return key
	}
	return ""
}

// startedAt is when worker started (zero: unknown).
func (r *record) startedAt(worker string) time.Time {
	for _, e := range r.workers {
		if e.worker == worker && e.what == "start" {
			return e.at
		}
	}
	return time.Time{}
}

// limitsFor is every limits of kind that a start at t on worker may have
// followed.
func (r *record) limitsFor(kind, worker string, t time.Time) []limits {
	return r.possible(kind, worker, t)
}

// runEnd is when x ended, or far in the future if it never did.
func (r *record) runEnd(x run) time.Time {
	if x.end.IsZero() {
		return r.end.Add(time.Hour)
	}
	return x.end
}

// changedBetween reports whether a change of kind's limits was under way
// at some instant of [t0, t1]: made by t1, and not changeWindow before t0.
func (r *record) changedBetween(kind string, t0, t1 time.Time) bool {
	for _, c := range r.limits[kind] {
		if !c.at.After(t1) && c.at.Add(changeWindow).After(t0) {
			return true
		}
	}
	return false
}

// slotEnd is when run x's slot may be freed: its end, or, for a run its
// worker's kill cut short, when the reaper has surely freed the dead
// worker's slots (rescueTime after the kill).
func (r *record) slotEnd(x run) time.Time {
	if x.cut {
		return x.end.Add(rescueTime)
	}
	return r.runEnd(x)
}

// cancelledBy reports whether the test cancelled or deleted the job at or
// before t.
func (r *record) cancelledBy(id int64, t time.Time) bool {
	for _, op := range r.ops {
		if op.job == id && (op.op == "cancel" || op.op == "delete") && !op.before.After(t) {
			return true
		}
	}
	return false
}

// retriedAt reports whether the test's JobRetry of job id was under way at t.
func (r *record) retriedAt(id int64, t time.Time) bool {
	for _, op := range r.ops {
		if op.job == id && op.op == "retry" && !t.Before(op.before) && !t.After(op.after) {
			return true
		}
	}
	return false
}

// startedSince reports whether job id has a run started in [from, to].
func (r *record) startedSince(id int64, from, to time.Time) bool {
	for _, x := range r.runsOf[id] {
		if !x.start.Before(from) && !x.start.After(to) {
			return true
		}
	}
	return false
}

// nextStart is the start of job id's first run at or after t (zero: none).
func (r *record) nextStart(id int64, t time.Time) time.Time {
	for _, x := range r.runsOf[id] {
		if !x.start.Before(t) {
			return x.start
		}
	}
	return time.Time{}
}

// wait is how a job waits at a moment, as River's history and the run logs
// tell it.
type wait struct {
	how    string    // parked (pending), resumed (made available from pending, not fetched yet), fetched (not started)
	since  time.Time // since when it waits so
	worker string    // fetched: the worker that fetched it
	// fetchedAt and fetchedBy: parked straight from a fetch that never
	// started (its worker parked it), that fetch.
	fetchedAt time.Time
	fetchedBy string
}

// waitingAt reports how job id waits at t, if it does: parked (pending);
// resumed (made available again from pending by something other than the
// test's JobRetry, and not fetched yet); or fetched by a worker and not
// started by it yet.
func (r *record) waitingAt(id int64, t time.Time) (wait, bool) {
	c, ok := r.stateAt(id, t)
	if !ok {
		return wait{}, false
	}
	switch c.to {
	case "pending":
		w := wait{how: "parked", since: c.at}
		if f, ok := r.stateAt(id, c.at.Add(-time.Nanosecond)); ok && f.to == "running" && !r.startedSince(id, f.at, c.at) {
			w.fetchedAt, w.fetchedBy = f.at, f.client
		}
		return w, true
	case "available":
		// A job the limiter let go (its kind's limits cleared: its place in
		// the line went with them) is available as any other: River's to
		// hand out, in its order.
		if c.from == "pending" && !r.retriedAt(id, c.at) && !strings.Contains(c.query, "name: LedgerLetGo ") {
			return wait{how: "resumed", since: c.at}, true
		}
	case "running":
		if !r.startedSince(id, c.at, t) {
			return wait{how: "fetched", since: c.at, worker: c.client}, true
		}
	}
	return wait{}, false
}

// fetchOf is the fetch (the change to running) that run x belongs to: the
// last one at or before its start.
func (r *record) fetchOf(x run) (change, bool) {
	var out change
	ok := false
	for _, c := range r.changes[x.job] {
		if c.at.After(x.start) {
			break
		}
		if c.to == "running" {
			out, ok = c, true
		}
	}
	return out, ok
}

// regime is what the order promise of limits l is: none (no limit, or a
// circuit breaker), by fetch (a per-kind limit alone), or strict within a
// key (a per-key or rate limit), with the partition.
func regime(l limits) string {
	switch {
	case !l.limited() || l.kindCap() == 0:
		return "none"
	case !l.strict():
		return "by fetch"
	}
	return "strict by " + strings.Join(l.fields, ",")
}

// killedAt is when worker was killed (zero: never).
func (r *record) killedAt(worker string) time.Time {
	for _, e := range r.workers {
		if e.worker == worker && e.what == "kill" {
			return e.at
		}
	}
	return time.Time{}
}

// gone is when worker was stopped or killed (zero: never).
func (r *record) gone(worker string) time.Time {
	for _, e := range r.workers {
		if e.worker == worker && (e.what == "kill" || e.what == "stop") {
			return e.at
		}
	}
	return time.Time{}
}

// history describes job id's state changes, runs and the kills of the
// workers that fetched it, for diagnosis.
func (r *record) history(id int64) string {
	var b strings.Builder
	b.WriteString("history:")
	workers := map[string]bool{}
	for _, c := range r.changes[id] {
		fmt.Fprintf(&b, " %s→%s at %s", c.from, c.to, c.at.Format("15:04:05.000000"))
		if c.to == "running" {
			fmt.Fprintf(&b, " by %s", c.client)
			if at, ok := r.commits[c.tx]; ok && at.Sub(c.at) >= time.Millisecond {
				fmt.Fprintf(&b, " (the fetch committed %s later)", at.Sub(c.at).Round(10*time.Microsecond))
			}
			workers[c.client] = true
		}
		b.WriteString(";")
	}
	for _, x := range r.runsOf[id] {
		fmt.Fprintf(&b, " run on %s %s–%s %s;", x.worker, x.start.Format("15:04:05.000000"), x.end.Format("15:04:05.000000"), x.outcome)
	}
	for w := range workers {
		if k := r.killedAt(w); !k.IsZero() {
			fmt.Fprintf(&b, " %s killed at %s;", w, k.Format("15:04:05.000000"))
		}
	}
	return b.String()
}

// eventsBefore describes, for diagnosis, the changes of kind's limits and
// the workers' starts, stops and kills in the span d before t.
func (r *record) eventsBefore(kind string, t time.Time, d time.Duration) string {
	var b strings.Builder
	b.WriteString("events in the " + d.String() + " before:")
	for _, c := range r.limits[kind] {
		if c.at.After(t.Add(-d)) && !c.at.After(t) {
			fmt.Fprintf(&b, " limits %s at %s;", c.limits, c.at.Format("15:04:05.000000"))
		}
	}
	for _, e := range r.workers {
		if e.at.After(t.Add(-d)) && !e.at.After(t) {
			fmt.Fprintf(&b, " %s %s at %s;", e.worker, e.what, e.at.Format("15:04:05.000000"))
		}
	}
	return b.String()
}

// lineAt describes the limiter's rows of job id up to t: diagnosis only.
func (r *record) lineAt(id int64, t time.Time) string {
	var parts []string
	for _, e := range r.line[id] {
		if e.at.After(t) {
			break
		}
		parts = append(parts, fmt.Sprintf("%s %s reserved=%t worker=%q by %.30s", e.at.Format("05.000000"), e.what, e.reserved,
			e.worker, e.query))
	}
	if len(parts) > 5 {
		parts = parts[len(parts)-5:]
	}
	for _, e := range r.marks[id] {
		if !e.at.After(t) {
			parts = append(parts, fmt.Sprintf("%s %s by %.30s", e.at.Format("05.000000"), e.what, e.query))
		}
	}
	key := ""
	if j := r.jobs[id]; j != nil {
		key = j.args.Key
	}
	return fmt.Sprintf("job %d (key %s) [%s]", id, key, strings.Join(parts, ", "))
}

// recentLimits describes kind's limit changes in the 2 s up to t.
func (r *record) recentLimits(kind string, t time.Time) string {
	var out []string
	for _, c := range r.limits[kind] {
		if c.at.After(t.Add(-2*time.Second)) && !c.at.After(t) {
			at := c.at.Format(time.StampMicro)
			if !c.began.IsZero() {
				at += " (its transaction began at " + c.began.Format("05.000000") + ")"
			}
			out = append(out, fmt.Sprintf("%s at %s", c.limits, at))
		}
	}
	if len(out) == 0 {
		return "no change in the 2 s before"
	}
	return "changed to " + strings.Join(out, ", then ")
}

// kindRuns is the runs of kind, in start order.
func (r *record) kindRuns(kind string) []run {
	var out []run
	for _, x := range r.runs {
		if x.kind == kind {
			out = append(out, x)
		}
	}
	return out
}

// kindJobs is the ids of kind's jobs, in id order.
func (r *record) kindJobs(kind string) []int64 {
	var ids []int64
	for id, j := range r.jobs {
		if j.kind == kind {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}
