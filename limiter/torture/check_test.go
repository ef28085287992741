package torture

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/limiter"
)

// The tolerances of the checks: the limiter's stated bounds.
const (
	// graceNew is how long a kind without a limit row may run jobs
	// unlimited after it gets one: workers re-read the limits at most once
	// a second (limiter.LimitCacheTTL).
	graceNew = 1100 * time.Millisecond
	// graceChange is how long after a change of a kind's limits starts may
	// still follow the old ones (a worker's leased slots, its cached state).
	graceChange = 300 * time.Millisecond
	// rateJitter is how far a start's time may be off the moment the line
	// counted it (a run's own clock, for a start without a row): a window
	// of the rate's period less rateJitter holds at most the rate's starts.
	rateJitter = 50 * time.Millisecond
	// fetchTolerance is how close two fetches by different workers may be
	// for their jobs to start in either order: River hands them out at
	// once, and the limiter learns of each when its fetch commits.
	fetchTolerance = 50 * time.Millisecond
	// leaseTolerance is how long after a parking a worker on leased slots
	// may still hand a freed slot to a job waiting in it: it hears of the
	// parking at its keeper's next poll (LeasePoll, 5 ms; LeaseIdlePoll,
	// 50 ms), later when the machine is loaded (94 ms seen with three
	// workers, Postgres and the test on two cores).
	leaseTolerance = 150 * time.Millisecond
	// grantTolerance is how far apart jobs let start by the same free room
	// may start, in either order. Jobs granted in order (grantedFirst: the
	// older one's grant written with the younger one's, or before it)
	// start in either order however far apart: a job waiting in the granting worker starts at once, one
	// waiting in another worker at its next poll, a parked one once
	// resumed and fetched (184 ms seen under CI's load).
	grantTolerance = 100 * time.Millisecond
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
	// to it in memory whose move (and the end of its wait) the worker had
	// not written yet: the rescue takes it for a job still waiting and
	// undoes its attempt (README's nothing-lost tolerance). The move is
	// written with the worker's next release, tens of ms later, more on a
	// loaded machine (seed 597827135: 101 ms, under a statement-tracking
	// load).
	handOverWriteWindow = 500 * time.Millisecond
	// waitedFor is how long after its fetch a job must start to count as
	// having waited in its worker (rather than started at its fetch).
	waitedFor = 20 * time.Millisecond
	// completionWindow is how long after a run ends its worker may die with
	// the job's completion not yet written: River works a job at least
	// once, and such a job runs again.
	completionWindow = time.Second
)

// lookaheadOf is how many jobs beyond what l lets start a resume may make
// available, per kind and per key, so that the next ones wait fetched in
// the workers: the limiter's stated lookahead (under a concurrency limit
// and no rate: per kind at least MinLookahead and the kind's limit, or MaxLookahead
// under a per-key limit alone; per key the key's limit; at most
// limiter.MaxLookahead).
func lookaheadOf(l limits) (perKind, perKey int) {
	perKind = limiter.MaxLookahead
	if l.max > 0 {
		perKind = min(max(limiter.MinLookahead, int(l.max)), limiter.MaxLookahead)
	}
	switch {
	case !l.present || l.rateMax > 0 || l.max < 0:
		return 0, 0
	case len(l.fields) == 0 && l.max > 0:
		return perKind, perKind
	case len(l.fields) > 0 && l.keyMax > 0:
		return perKind, min(int(l.keyMax), limiter.MaxLookahead)
	}
	return 0, 0
}

// violation is one broken promise.
type violation struct {
	check string
	msg   string
}

func (v violation) String() string { return v.check + ": " + v.msg }

// maxPerCheck caps the violations a check reports.
const maxPerCheck = 20

type violations struct {
	list  []violation
	count map[string]int
}

func (vs *violations) add(check, format string, args ...any) {
	if vs.count == nil {
		vs.count = map[string]int{}
	}
	vs.count[check]++
	if vs.count[check] <= maxPerCheck {
		vs.list = append(vs.list, violation{check: check, msg: fmt.Sprintf(format, args...)})
	}
}

// check runs every check of the record.
func check(r *record) *violations {
	vs := &violations{}
	checkLimits(r, vs)
	checkRates(r, vs)
	checkOrder(r, vs)
	checkLiveness(r, vs)
	checkOutcomes(r, vs)
	checkResumes(r, vs)
	return vs
}

// keyOf is the key of a job under l: its args' key when l partitions the
// kind, else "".
func keyOf(l limits, key string) string {
	if l.keyed() {
		return key
	}
	return ""
}

// graceAt is how long before t a change of kind's limits may still not be
// in force: graceNew when the kind had no limit row at some point of that
// time, else graceChange.
func (r *record) graceAt(kind string, t time.Time) time.Duration {
	for _, l := range r.limitsDuring(kind, t.Add(-graceNew), t) {
		if !l.limited() {
			return graceNew
		}
	}
	return graceChange
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
// followed: those in force in the grace before t (graceNew when the kind
// had no limit row in it, as a worker's cache may say; else graceChange),
// but none from before the worker started, which read them afresh.
func (r *record) limitsFor(kind, worker string, t time.Time) []limits {
	started := r.startedAt(worker)
	lo := t.Add(-graceNew)
	if started.After(lo) {
		lo = started
	}
	window := r.limitsDuring(kind, lo, t)
	for _, l := range window {
		if !l.limited() {
			return window
		}
	}
	if short := t.Add(-graceChange); short.After(lo) {
		lo = short
	}
	return r.limitsDuring(kind, lo, t)
}

// runEnd is when x ended, or far in the future if it never did.
func (r *record) runEnd(x run) time.Time {
	if x.end.IsZero() {
		return r.end.Add(time.Hour)
	}
	return x.end
}

// checkLimits: at every start, the executions running (the new one
// included) are at most what the limits in force let run, per kind and
// per key; a run started before a lowering may finish.
func checkLimits(r *record, vs *violations) {
	for _, kind := range kinds {
		var runs []run
		for _, x := range r.runs {
			if x.kind == kind {
				runs = append(runs, x)
			}
		}
		for i, x := range runs {
			window := r.limitsFor(kind, x.worker, x.start)
			kindCap, keyCap := 0, 0
			for _, l := range window {
				kindCap = max(kindCap, l.kindCap())
				keyCap = max(keyCap, l.keyCap())
			}
			active, activeKey := 0, 0
			for _, y := range runs[:i+1] {
				if !r.runEnd(y).After(x.start) {
					continue
				}
				// A run started while the kind (or its key) had no
				// limit took no slot: a limit that appears does not
				// count the jobs already running.
				kindSlot, keySlot := r.heldSlots(kind, y)
				if kindSlot || y.job == x.job {
					active++
				}
				if y.key == x.key && (keySlot || y.job == x.job) {
					activeKey++
				}
			}
			if active > kindCap {
				vs.add("limit", "%s: job %d started at %s with %d running, limit %d (limits %s)",
					kind, x.job, x.start.Format(time.StampMicro), active, kindCap, r.limitsAt(kind, x.start))
			}
			if activeKey > keyCap {
				vs.add("limit", "%s key %s: job %d started at %s with %d of its key running, limit %d per key (limits %s)",
					kind, x.key, x.job, x.start.Format(time.StampMicro), activeKey, keyCap, r.limitsAt(kind, x.start))
			}
		}
	}
}

// heldSlots reports whether run y surely took a slot of its kind and of
// its key: whether a per-kind (per-key) limit was in force when it started
// and throughout the grace before (a worker's copy of the limits may lag).
// A run that started with none took no slot, and a limit that appears
// later does not count it.
func (r *record) heldSlots(kind string, y run) (kindSlot, keySlot bool) {
	kindSlot, keySlot = true, true
	for _, l := range r.limitsFor(kind, y.worker, y.start) {
		kindSlot = kindSlot && l.kindCap() != unlimited
		keySlot = keySlot && l.keyCap() != unlimited
	}
	return kindSlot, keySlot
}

// rateSince is when kind's rate limit in force at t was set (unchanged
// since then).
func (r *record) rateSince(kind string, t time.Time) time.Time {
	cur := r.limitsAt(kind, t)
	since := time.Time{}
	for _, c := range r.limits[kind] {
		if c.at.After(t) {
			break
		}
		if !c.limits.rateEqual(cur) {
			since = time.Time{}
			continue
		}
		if since.IsZero() {
			since = c.at
		}
	}
	return since
}

// checkRates: no window of a rate's period (less rateJitter) holds more
// starts than the rate, per kind or per key, from the moment the rate is in
// force. A start counts at its admission, when the line wrote it (its row
// in concurrency_starts, by the database's clock), else at the run's
// start: the limiter decides when a job may begin, and a loaded worker
// may take a while to run a job it admitted (300 ms seen under CI's load).
func checkRates(r *record, vs *violations) {
	type start struct {
		run
		at time.Time // admitted
	}
	for _, kind := range kinds {
		var starts []start
		for _, x := range r.runs {
			if x.kind == kind {
				starts = append(starts, start{run: x, at: r.admittedAt(x)})
			}
		}
		sort.SliceStable(starts, func(i, j int) bool { return starts[i].at.Before(starts[j].at) })
		for i, x := range starts {
			l := r.limitsAt(kind, x.at)
			if !l.hasRate() {
				continue
			}
			since := r.rateSince(kind, x.at)
			from := since.Add(r.graceAt(kind, since))
			if x.at.Before(from) {
				continue
			}
			lo := x.at.Add(-l.ratePeriod + rateJitter)
			if lo.Before(from) {
				lo = from
			}
			var in []string
			for _, y := range starts[:i+1] {
				if y.at.After(lo) && (!l.ratePerKey || y.key == x.key) {
					in = append(in, fmt.Sprintf("job %d attempt %d on %s admitted at %s, started at %s [%s]", y.job, y.attempt,
						y.worker, y.at.Format("05.000000"), y.start.Format("05.000000"), r.lineAt(y.job, y.start)))
				}
			}
			if len(in) > int(l.rateMax) {
				scope := kind
				if l.ratePerKey {
					scope += " key " + x.key
				}
				vs.add("rate", "%s: %d starts in the %s up to job %d's admission at %s, rate %d/%s (set at %s): %s; %s",
					scope, len(in), x.at.Sub(lo).Round(time.Millisecond), x.job, x.at.Format(time.StampMicro),
					l.rateMax, l.ratePeriod, since.Format(time.StampMicro), strings.Join(in, "; "),
					r.eventsBefore(kind, x.at, 3*time.Second))
			}
		}
	}
}

// admittedAt is when the line admitted run x: the last write of its job's
// start row (inserted as started, or a reserved one claimed) between the
// fetch of this run and its start; else the run's start (no row: a start
// the line did not write, which counts when it ran).
func (r *record) admittedAt(x run) time.Time {
	at := x.start
	fetch, ok := r.stateAt(x.job, x.start)
	if !ok || fetch.to != "running" {
		return at
	}
	for _, e := range r.line[x.job] {
		if e.at.After(x.start) {
			break
		}
		if e.at.Before(fetch.at) {
			continue
		}
		if (e.what == "concurrency_starts INSERT" && !e.reserved) || e.what == "concurrency_starts UPDATE" {
			at = e.at
		}
	}
	return at
}

// firstRun is the job's first execution (ok false: none).
func (r *record) firstRuns() map[int64]run {
	out := map[int64]run{}
	for _, x := range r.runs {
		if _, ok := out[x.job]; !ok {
			out[x.job] = x
		}
	}
	return out
}

// cancelled reports whether the test cancelled or deleted the job at or
// before t.
func (r *record) cancelledBy(id int64, t time.Time) bool {
	for _, op := range r.ops {
		if op.job == id && (op.op == "cancel" || op.op == "delete") && !op.before.After(t) {
			return true
		}
	}
	return false
}

// waitingAt reports whether job id waited at t, known to the limiter: parked
// (pending), or fetched by a worker and not started; fetchedBy is the worker
// that fetched it (empty when parked) and since when.
func (r *record) waitingAt(id int64, t time.Time) (waiting bool, fetchedBy string, since time.Time) {
	c, ok := r.stateAt(id, t)
	if !ok {
		return false, "", time.Time{}
	}
	switch c.to {
	case "pending":
		return true, "", c.at
	case "running":
		return true, c.client, c.at
	}
	return false, "", time.Time{}
}

// checkOrder: within a key, a job never starts while an older job of its
// key waits (parked, or fetched and not started). Strict for kinds with a
// per-key limit or a rate, but for jobs fetched by two workers within
// fetchTolerance of each other. For a kind with only a per-kind limit
// (leased slots), a parked job goes first once the workers heard of it
// (leaseTolerance), and within one worker
// jobs fetched more than fetchTolerance earlier go first. A job that ran before (a retry, a
// snooze) is exempt, and so is an older job that ran before (it took a new
// place in the line), as are jobs the test cancelled or deleted.
func checkOrder(r *record, vs *violations) {
	r.indexRuns()
	first := r.firstRuns()
	for _, kind := range kinds {
		var ids []int64
		for id, j := range r.jobs {
			if j.kind == kind {
				ids = append(ids, id)
			}
		}
		slices.Sort(ids)
		for _, jid := range ids {
			xj, ok := first[jid]
			if !ok {
				continue
			}
			l := r.limitsAt(kind, xj.start)
			if !l.limited() || l.kindCap() == 0 {
				continue
			}
			// The rule must have held for the whole grace: a job started
			// while the kind's limits changed is exempt.
			if !slices.EqualFunc(r.limitsFor(kind, xj.worker, xj.start), []limits{l},
				func(a, b limits) bool { return a.strict() == b.strict() && a.keyed() == b.keyed() }) {
				continue
			}
			jFetch, _ := r.stateAt(jid, xj.start)
			if r.changedBetween(kind, jFetch.at.Add(-limiter.LimitCacheTTL), xj.start) {
				// Fetched while a worker may still follow the limits before
				// a change (its copy of them is up to LimitCacheTTL old):
				// jobs fetched together may take the old path and the new.
				continue
			}
			for _, iid := range ids {
				if iid >= jid {
					break
				}
				if keyOf(l, r.jobs[iid].args.Key) != keyOf(l, r.jobs[jid].args.Key) {
					continue
				}
				if xi, ok := first[iid]; ok && !xi.start.After(xj.start.Add(grantTolerance)) {
					continue // it started first, or together (one grant round)
				}
				if r.grantedFirst(iid, jid, xj.start) {
					continue // granted in order: the older one was on its way (resumed, or waiting in another worker)
				}
				if r.cancelledBy(iid, xj.start) || r.startedSince(iid, time.Time{}, xj.start) || r.retriedBefore(iid, xj.start) {
					continue // cancelled; or a retry (it ran before, or was retried by hand): it took a new place
				}
				// The line decided at j's grant (its start, without one):
				// what waited then went first.
				decided := xj.start
				if tx, at := r.grantOf(jid, xj.start); tx != 0 {
					decided = at
				}
				waiting, by, since := r.waitingAt(iid, decided)
				if !waiting {
					continue
				}
				if k := r.killedAt(by); by != "" && !k.IsZero() && !k.After(xj.start) {
					continue // fetched by a worker killed since: it waits for the reaper
				}
				switch {
				case by == "" && !l.strict() && since.After(xj.start.Add(-leaseTolerance)):
					// Parked just now: a worker hands its freed leased slots
					// on in memory until it hears of the parking (within a
					// lease poll).
					continue
				case by == "":
					// Parked: it goes first.
				case l.strict():
					if by != xj.worker && since.After(jFetch.at.Add(-fetchTolerance)) {
						continue // fetched at about the same time by another worker
					}
					if by == xj.worker && since.After(xj.start) {
						continue
					}
				default:
					// Leased slots: within one worker, jobs of an earlier
					// fetch go first, but for a job on its way to parking
					// (it parks right after).
					if by != xj.worker || !since.Before(jFetch.at.Add(-fetchTolerance)) || r.parksSoon(iid, decided) || r.parksSoon(iid, xj.start) {
						continue
					}
				}
				where := "parked since " + since.Format(time.StampMicro)
				if by != "" {
					where = "waiting in " + by + " since " + since.Format(time.StampMicro)
				}
				vs.add("order", "%s key %q: job %d started at %s (in %s) while older job %d was %s (limits %s); job %d %s; job %d %s; %s",
					kind, keyOf(l, r.jobs[jid].args.Key), jid, xj.start.Format(time.StampMicro), xj.worker, iid, where, l,
					iid, r.history(iid), jid, r.history(jid), r.eventsBefore(kind, xj.start, 3*time.Second)+" line: "+r.lineAt(iid, xj.start)+"; "+r.lineAt(jid, xj.start))
			}
		}
	}
}

// inRescue reports whether t is within rescueTime after a kill.
func (r *record) inRescue(t time.Time) bool {
	for _, e := range r.workers {
		if e.what == "kill" && !t.Before(e.at) && t.Before(e.at.Add(rescueTime)) {
			return true
		}
	}
	return false
}

// readyAt reports whether job id could start at t as far as River is
// concerned: parked, available and due, or fetched and not started.
func (r *record) readyAt(id int64, t time.Time) bool {
	c, ok := r.stateAt(id, t)
	if !ok {
		return false
	}
	switch c.to {
	case "pending", "running":
		return !r.cancelledBy(id, t) && (c.to == "pending" || !r.startedSince(id, c.at, t))
	case "available":
		return !r.cancelledBy(id, t) && !c.scheduledAt.After(t)
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

// checkLiveness: no key of a kind goes longer than livenessBound without a
// start while it has ready jobs and its limits have room (the kind's and
// the key's running jobs under their limits, room in the rate windows, no
// circuit breaker), but right after a kill (its slots wait for a reaper)
// and right after a change of limits.
func checkLiveness(r *record, vs *violations) {
	const step = 25 * time.Millisecond
	r.indexRuns()
	for _, kind := range kinds {
		var ids []int64
		var runs []run
		for id, j := range r.jobs {
			if j.kind == kind {
				ids = append(ids, id)
			}
		}
		for _, x := range r.runs {
			if x.kind == kind {
				runs = append(runs, x)
			}
		}
		stuck := map[string]time.Time{}
		reported := map[string]bool{}
		for t := r.begin; t.Before(r.end); t = t.Add(step) {
			l := r.limitsAt(kind, t)
			if r.inRescue(t) || len(r.limitsDuring(kind, t.Add(-r.graceAt(kind, t)), t)) > 1 || l.kindCap() == 0 {
				clear(stuck)
				continue
			}
			active := 0
			activeKey := map[string]int{}
			starts, startsKey := 0, map[string]int{}
			lastStart := map[string]time.Time{}
			for _, x := range runs {
				k := keyOf(l, x.key)
				if !x.start.After(t) {
					if r.runEnd(x).After(t) {
						active++
						activeKey[k]++
					}
					if l.hasRate() && x.start.After(t.Add(-l.ratePeriod)) {
						starts++
						startsKey[k]++
					}
					if x.start.After(lastStart[k]) {
						lastStart[k] = x.start
					}
				}
			}
			kindRoom := active < l.kindCap() && (!l.hasRate() || l.ratePerKey || starts < int(l.rateMax))
			waitingKeys := map[string]bool{}
			if kindRoom {
				for _, id := range ids {
					if r.readyAt(id, t) {
						waitingKeys[keyOf(l, r.jobs[id].args.Key)] = true
					}
				}
			}
			for k := range stuck {
				if !waitingKeys[k] {
					delete(stuck, k)
				}
			}
			for k := range waitingKeys {
				room := activeKey[k] < l.keyCap() && (!l.hasRate() || !l.ratePerKey || startsKey[k] < int(l.rateMax))
				since, ok := stuck[k]
				switch {
				case !room:
					delete(stuck, k)
				case !ok || lastStart[k].After(since):
					stuck[k] = t
				case t.Sub(since) > livenessBound && !reported[k]:
					reported[k] = true
					vs.add("liveness", "%s key %q: ready jobs and room (%d running, %d of the key; limits %s) from %s to %s without a start",
						kind, k, active, activeKey[k], l, since.Format(time.StampMicro), t.Format(time.StampMicro))
				}
			}
		}
	}
}

// indexRuns indexes the runs by job.
func (r *record) indexRuns() {
	if r.runsOf != nil {
		return
	}
	r.runsOf = map[int64][]run{}
	for _, x := range r.runs {
		r.runsOf[x.job] = append(r.runsOf[x.job], x)
	}
}

// checkOutcomes: every job ended as River documents. A completed job ran
// to success exactly once, last; a discarded one failed max_attempts
// times; a job cancelled or deleted while it waited never started after;
// and its attempt counts its real executions (a snooze gives its attempt
// back).
func checkOutcomes(r *record, vs *violations) {
	r.indexRuns()
	for id, j := range r.jobs {
		runs := r.runsOf[id]
		ok, snoozes, failed := 0, 0, 0
		for _, x := range runs {
			switch x.outcome {
			case "ok":
				ok++
			case "snooze":
				snoozes++
			default:
				failed++
			}
			if x.end.IsZero() {
				vs.add("outcome", "job %d: a run started at %s on %s never ended", id, x.start.Format(time.StampMicro), x.worker)
			}
		}
		for _, op := range r.ops {
			if op.job != id || (op.op == "cancel" && op.state != "cancelled") || (op.op != "cancel" && op.op != "delete") {
				continue
			}
			if op.op == "delete" && j.final != "" {
				// Not deleted: River's JobDelete racing a fetch of the job
				// waits for the fetch's row lock, deletes nothing (the job
				// is running), and returns the row as its snapshot had it,
				// not running, with no error; the job ran and ended.
				continue
			}
			tolerance := time.Duration(0)
			if op.op == "cancel" && op.state == "running" {
				tolerance = cancelTolerance
			}
			for _, x := range runs {
				if x.start.After(op.after.Add(tolerance)) {
					vs.add("outcome", "job %d ran at %s after the test's %s at %s (state then %s); %s", id, x.start.Format(time.StampMicro), op.op,
						op.after.Format(time.StampMicro), op.state, r.history(id))
				}
			}
		}
		switch j.final {
		case "":
			continue // deleted
		case "completed":
			if len(runs) == 0 {
				vs.add("outcome", "job %d completed without a run", id)
				continue
			}
			// Every successful run but the last must have lost its
			// completion to a kill.
			lost := 0
			for _, x := range runs[:len(runs)-1] {
				if killed := r.killedAt(x.worker); x.outcome == "ok" && !killed.IsZero() && !x.end.IsZero() &&
					killed.Sub(x.end) < completionWindow {
					lost++
				}
			}
			if ok-lost != 1 || runs[len(runs)-1].outcome != "ok" {
				vs.add("outcome", "job %d completed with %d successful runs of %d (%d of them on a worker killed right after)",
					id, ok, len(runs), lost)
			}
		case "discarded":
			over, _ := r.killBlur(id)
			if ok != 0 || failed > j.maxAttempts || failed+over < j.maxAttempts {
				vs.add("outcome", "job %d discarded after %d failed runs (max attempts %d) and %d successful", id, failed,
					j.maxAttempts, ok)
			}
		case "cancelled":
		default:
			vs.add("outcome", "job %d is still %s at the end", id, j.final)
			continue
		}
		if last := len(runs) - 1; last >= 0 && j.final == "cancelled" && runs[last].outcome == "snooze" &&
			r.cancelledRunning(id) && !r.fetchedAfter(id, runs[last].end) {
			// River cancels a job whose cancellation was asked while it
			// snoozed, at the snooze's completion, and keeps its attempt.
			// (A job fetched again after its snooze and cancelled while it
			// waited for a slot has that attempt undone by its parking.)
			snoozes--
		}
		over, under := r.killBlur(id)
		if d := j.attempt - (len(runs) - snoozes); d > over || -d > under {
			vs.add("outcome", "job %d: attempt %d, but %d real executions (%d snoozed; errors %q); %s", id, j.attempt,
				len(runs)-snoozes, snoozes, j.errors, r.history(id))
		}
	}
}

// checkResumes: a resume makes available only what the limits let start
// (plus lookahead): at no moment more resumed jobs of a kind wait unstarted
// than its limit, or per key than the key's limit. Jobs the test retried
// by hand are not resumes, nor are jobs resumed because every limit of the
// kind was cleared (nothing holds them).
func checkResumes(r *record, vs *violations) {
	r.indexRuns()
	type event struct {
		at    time.Time
		job   int64
		in    bool
		query string
	}
	for _, kind := range kinds {
		var events []event
		for id, j := range r.jobs {
			if j.kind != kind {
				continue
			}
			cs := r.changes[id]
			for i, c := range cs {
				if c.from != "pending" || c.to != "available" || r.retriedAt(id, c.at) {
					continue
				}
				events = append(events, event{at: c.at, job: id, in: true, query: c.query})
				// It leaves the resumed set at its next start, or when it
				// changes state again other than to running.
				out := time.Time{}
				for _, x := range r.runsOf[id] {
					if x.start.After(c.at) {
						out = x.start
						break
					}
				}
				for _, d := range cs[i+1:] {
					if d.to != "running" && (out.IsZero() || d.at.Before(out)) {
						out = d.at
						break
					}
				}
				// Or when it is decided to park again (its parking
				// record), before River's completion makes it pending.
				for _, le := range r.line[id] {
					if le.what == "concurrency_parked_jobs INSERT" && le.at.After(c.at) {
						if out.IsZero() || le.at.Before(out) {
							out = le.at
						}
						break
					}
				}
				if !out.IsZero() {
					events = append(events, event{at: out, job: id})
				}
			}
		}
		sort.Slice(events, func(i, j int) bool {
			if events[i].at.Equal(events[j].at) {
				return !events[i].in
			}
			return events[i].at.Before(events[j].at)
		})
		set := map[int64]time.Time{} // resumed jobs not started yet, and when they were resumed
		reported := 0
		for _, e := range events {
			if !e.in {
				delete(set, e.job)
				continue
			}
			if r.inRescue(e.at) {
				// Right after a kill the reaper parks the dead worker's
				// waiting jobs and frees its slots: the line is rebuilt.
				continue
			}
			if !r.limitsAt(kind, e.at).limited() {
				// Resumed because the kind's limits were cleared: nothing
				// holds it; when fetched it is a new job to the line.
				continue
			}
			set[e.job] = e.at
			// A resume decides under the kind's lock, with its limits as
			// committed.
			window := r.limitsDuring(kind, e.at.Add(-graceChange), e.at)
			kindCap, keyCap := 0, 0
			rate := false
			for _, l := range window {
				ahead, keyAhead := lookaheadOf(l)
				kindCap = max(kindCap, capPlus(l.kindCap(), ahead))
				keyCap = max(keyCap, capPlus(l.keyCap(), keyAhead))
				rate = rate || l.hasRate()
			}
			if kindCap == unlimited && keyCap == unlimited {
				continue
			}
			// Jobs resumed under earlier limits (ahead of slots the old
			// limits would have freed) wait on; only those resumed since
			// the limits last changed count against the new ones. A
			// resume holds the kind's limit row, which a change locks
			// first: one resumed before the change was decided under the
			// old limits (CI: 3 jobs of a key resumed 135 ms before a
			// per-key limit of 1 was set, counted against it).
			regime := r.lastChange(kind, e.at)
			n, nKey := 0, 0
			key := r.jobs[e.job].args.Key
			for id, at := range set {
				if at.Before(regime) {
					continue
				}
				n++
				if r.jobs[id].args.Key == key {
					nKey++
				}
			}
			if (kindCap != unlimited && !rate && n > kindCap) || (keyCap != unlimited && nKey > keyCap) {
				reported++
				var who []string
				for id, at := range set {
					if !at.Before(regime) {
						who = append(who, fmt.Sprintf("resumed at %s by %.40q: %s", at.Format("05.000000"), r.resumeQuery(id, at),
							r.lineAt(id, e.at)))
					}
				}
				slices.Sort(who)
				vs.add("resume", "%s: %d resumed jobs waiting to start (%d of key %s) at %s, limits and lookahead allow %d (%d per key; limits %s; %s) by %q: %s",
					kind, n, nKey, key, e.at.Format(time.StampMicro), kindCap, keyCap, r.limitsAt(kind, e.at), r.recentLimits(kind, e.at),
					e.query, strings.Join(who, "; "))
			}
		}
	}
}

// resumeQuery is the statement that resumed job id at t.
func (r *record) resumeQuery(id int64, t time.Time) string {
	for _, c := range r.changes[id] {
		if c.at.Equal(t) && c.from == "pending" {
			return c.query
		}
	}
	return ""
}

// lineAt describes job id's slot and waiter rows as of t, for diagnosis.
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
	return fmt.Sprintf("job %d (key %s) [%s]", id, r.jobs[id].args.Key, strings.Join(parts, ", "))
}

// lastChange is when kind's limits last changed at or before t (zero:
// never).
func (r *record) lastChange(kind string, t time.Time) time.Time {
	var at time.Time
	for _, c := range r.limits[kind] {
		if c.at.After(t) {
			break
		}
		at = c.at
	}
	return at
}

// retriedBefore reports whether the test retried job id by hand before t.
func (r *record) retriedBefore(id int64, t time.Time) bool {
	for _, op := range r.ops {
		if op.job == id && op.op == "retry" && op.before.Before(t) {
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

// recentLimits describes kind's limit changes in the 2 s up to t.
func (r *record) recentLimits(kind string, t time.Time) string {
	var out []string
	for _, c := range r.limits[kind] {
		if c.at.After(t.Add(-2*time.Second)) && !c.at.After(t) {
			out = append(out, fmt.Sprintf("%s at %s", c.limits, c.at.Format(time.StampMicro)))
		}
	}
	if len(out) == 0 {
		return "no change in the 2 s before"
	}
	return "changed to " + strings.Join(out, ", then ")
}

// capPlus is capacity c plus n (unlimited stays unlimited).
func capPlus(c, n int) int {
	if c == unlimited {
		return c
	}
	return c + n
}

// parkingLag is how long after its decision to park a job's parking may
// complete (River's completer writes it in batches).
const parkingLag = 250 * time.Millisecond

// parksSoon reports whether job id, running at t, was completing its
// parking: it turns pending within parkingLag.
func (r *record) parksSoon(id int64, t time.Time) bool {
	for _, c := range r.changes[id] {
		if c.at.After(t) && c.from == "running" {
			return c.to == "pending" && c.at.Sub(t) < parkingLag
		}
	}
	return false
}

// cancelledRunning reports whether job id went from running straight to
// cancelled (its completion found its cancellation asked).
func (r *record) cancelledRunning(id int64) bool {
	for _, c := range r.changes[id] {
		if c.to == "cancelled" {
			return c.from == "running"
		}
	}
	return false
}

// fetchedAfter reports whether job id was fetched (made running) after t.
func (r *record) fetchedAfter(id int64, t time.Time) bool {
	for _, c := range r.changes[id] {
		if c.to == "running" && c.at.After(t) {
			return true
		}
	}
	return false
}

// killBlur is how far a kill may have made job id's attempt count differ
// from its real executions, as River counts them. over: the kills of
// workers that had fetched the job and not started it (River counts an
// attempt for a job its worker fetched and never ran; under sluice the
// job may also be between its fetch and its limiter's decision, or
// waiting for a leased slot, which its worker publishes within 20 ms).
// A snooze whose completion the kill lost counts as an attempt too. under:
// the kills of workers that had started running it within killTolerance
// (still listed as waiting for a leased slot, it is parked by the rescue,
// its attempt undone).
func (r *record) killBlur(id int64) (over, under int) {
	for _, e := range r.workers {
		if e.what != "kill" {
			continue
		}
		// A fetch the worker sent before it died may still commit just
		// after: Postgres finishes the statement.
		var fetched time.Time
		for _, c := range r.changes[id] {
			if c.to == "running" && c.client == e.worker && !c.at.After(e.at.Add(killTolerance)) {
				fetched = c.at
			}
		}
		if fetched.IsZero() {
			continue
		}
		ran := false
		for _, x := range r.runsOf[id] {
			if x.worker == e.worker && !x.start.Before(fetched) && !x.start.After(e.at.Add(killTolerance)) {
				ran = true
				waited := x.start.Sub(fetched) > waitedFor
				if e.at.Sub(x.start) < killTolerance || (waited && e.at.Sub(x.start) < handOverWriteWindow) {
					under++
				}
				if x.outcome == "snooze" && !x.end.IsZero() && e.at.Sub(x.end) < completionWindow {
					over++ // the snooze's completion may be lost: River counts the attempt
				}
			}
		}
		if !ran {
			over++
		}
	}
	return over, under
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

// grantOf is the grant job id held at t: the transaction and time of the
// write of a slot or a start for it (inserted, or moved to it by a
// hand-over) not taken back since (tx 0: none).
func (r *record) grantOf(id int64, t time.Time) (int64, time.Time) {
	var tx int64
	var at time.Time
	for _, e := range r.line[id] {
		if e.at.After(t) {
			break
		}
		switch e.what {
		case "concurrency_executions INSERT", "concurrency_starts INSERT":
			tx, at = e.tx, e.at
		case "concurrency_executions UPDATE", "concurrency_starts UPDATE":
			if tx == 0 {
				tx, at = e.tx, e.at
			}
		case "concurrency_executions DELETE", "concurrency_starts DELETE":
			tx = 0 // taken back, or given up
		}
	}
	return tx, at
}

// grantedFirst reports whether job a held a grant at t that was written in
// the transaction of b's grant or before it: the line granted them in
// order, and they start in whatever order they reach their workers (a
// parked one is resumed and fetched first, a job waiting in another worker
// takes its grant at its next poll).
func (r *record) grantedFirst(a, b int64, t time.Time) bool {
	ta, atA := r.grantOf(a, t)
	tb, atB := r.grantOf(b, t)
	return ta != 0 && (ta == tb || tb == 0 || !atA.After(atB))
}

// changedBetween reports whether kind's limits changed in (t0, t1].
func (r *record) changedBetween(kind string, t0, t1 time.Time) bool {
	for _, c := range r.limits[kind] {
		if c.at.After(t0) && !c.at.After(t1) {
			return true
		}
	}
	return false
}
