package torture

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// checkLimits: at every start, the executions running (the new one
// included) are at most what the limits in force let run, per kind and
// per key. A run started before a lowering may finish; a start within
// changeWindow of a change may follow the limits before it; a run started
// while its kind (its key) had no limit took no slot and is not counted.
// Every start of a kind with a limit in force is judged.
func checkLimits(r *record, vs *violations, cov coverage) {
	for _, kind := range kinds {
		runs := r.kindRuns(kind)
		for i, x := range runs {
			window := r.limitsFor(kind, x.worker, x.start)
			kindCap, keyCap := 0, 0
			limited := false
			for _, l := range window {
				kindCap = max(kindCap, l.kindCap())
				keyCap = max(keyCap, l.keyCap())
				limited = limited || l.limited()
			}
			if !limited {
				continue
			}
			cov.judge("limit")
			active, activeKey := 0, 0
			var runningKey, running []string
			for _, y := range runs[:i+1] {
				if !r.runEnd(y).After(x.start) {
					continue
				}
				kindSlot, keySlot := r.heldSlots(kind, y)
				if kindSlot || y.job == x.job {
					active++
					running = append(running, fmt.Sprintf("job %d (%s; limiter's rows: %s)", y.job, r.history(y.job), r.lineAt(y.job, x.start)))
				}
				if y.key == x.key && (keySlot || y.job == x.job) {
					activeKey++
					runningKey = append(runningKey, fmt.Sprintf("job %d (%s; limiter's rows: %s)", y.job, r.history(y.job), r.lineAt(y.job, x.start)))
				}
			}
			if active > kindCap {
				vs.add("limit", "%s: job %d started at %s with %d running, limit %d (limits %s; %s): %s",
					kind, x.job, x.start.Format(time.StampMicro), active, kindCap, r.limitsAt(kind, x.start),
					r.recentLimits(kind, x.start), strings.Join(running, "; "))
			}
			if activeKey > keyCap {
				vs.add("limit", "%s key %s: job %d started at %s with %d of its key running, limit %d per key (limits %s; %s): %s",
					kind, x.key, x.job, x.start.Format(time.StampMicro), activeKey, keyCap, r.limitsAt(kind, x.start),
					r.recentLimits(kind, x.start), strings.Join(runningKey, "; "))
			}
		}
	}
}

// heldSlots reports whether run y surely took a slot of its kind and of
// its key: whether a per-kind (per-key) limit was in force when it started
// by every limits its start may have followed (a worker may follow the
// limits before a change for changeWindow after its commit). A run that started with none took no slot, and a
// limit that appears later does not count it.
func (r *record) heldSlots(kind string, y run) (kindSlot, keySlot bool) {
	kindSlot, keySlot = true, true
	for _, l := range r.limitsFor(kind, y.worker, y.start) {
		kindSlot = kindSlot && l.kindCap() != unlimited
		keySlot = keySlot && l.keyCap() != unlimited
	}
	return kindSlot, keySlot
}

// rateSince is the change that set kind's rate limit in force at t
// (unchanged since then).
func (r *record) rateSince(kind string, t time.Time) limitChange {
	cur := r.limitsAt(kind, t)
	var since limitChange
	for _, c := range r.limits[kind] {
		if c.at.After(t) {
			break
		}
		if !c.limits.rateEqual(cur) {
			since = limitChange{}
			continue
		}
		if since.at.IsZero() {
			since = c
		}
	}
	return since
}

// startLogged reports whether the limiter logged a start of job id (a
// row of concurrency_starts written, or claimed) in [from, to]: a start it
// decided under a rate then.
func (r *record) startLogged(id int64, from, to time.Time) bool {
	return r.rowWritten(id, "concurrency_starts", from, to)
}

// rowWritten reports whether the limiter inserted or updated a row of
// table for job id in [from, to].
func (r *record) rowWritten(id int64, table string, from, to time.Time) bool {
	for _, e := range r.line[id] {
		if strings.HasPrefix(e.what, table+" ") && !strings.HasSuffix(e.what, "DELETE") &&
			!e.at.Before(from) && !e.at.After(to) {
			return true
		}
	}
	return false
}

// checkRates: no window of a rate's period less rateJitter holds more
// starts than the rate, per kind or per key, from changeWindow after the
// rate was set. A start counts when the worker's own record says the job
// began: the limiter admits it a moment before (rateJitter). Every start
// under a rate is judged; one within changeWindow of the rate's setting
// is exempt.
func checkRates(r *record, vs *violations, cov coverage) {
	for _, kind := range kinds {
		starts := r.kindRuns(kind)
		sort.SliceStable(starts, func(i, j int) bool { return starts[i].start.Before(starts[j].start) })
		for i, x := range starts {
			l := r.limitsAt(kind, x.start)
			if !l.hasRate() {
				continue
			}
			set := r.rateSince(kind, x.start)
			since := set.at
			from := since.Add(changeWindow)
			if x.start.Before(from) && !r.startLogged(x.job, set.began, x.start) {
				cov.exempt("rate", "rate just set")
				continue
			}
			cov.judge("rate")
			// The window: the starts after from, and those the limiter logged
			// since the change began (decided under the new rate).
			lo := x.start.Add(-l.ratePeriod + rateJitter)
			counted := func(y run) bool {
				switch {
				case !y.start.After(lo):
					return false
				case !y.start.Before(from):
					return true
				}
				return r.startLogged(y.job, set.began, y.start)
			}
			var in []string
			for _, y := range starts[:i+1] {
				if counted(y) && (!l.ratePerKey || y.key == x.key) {
					in = append(in, fmt.Sprintf("job %d attempt %d on %s at %s (%s; limiter's rows: %s)", y.job, y.attempt, y.worker,
						y.start.Format("05.000000"), r.history(y.job), r.lineAt(y.job, x.start)))
				}
			}
			if len(in) > int(l.rateMax) {
				scope := kind
				if l.ratePerKey {
					scope += " key " + x.key
				}
				vs.add("rate", "%s: %d starts in the %s up to job %d's start at %s, rate %d/%s (set at %s): %s; %s",
					scope, len(in), x.start.Sub(lo).Round(time.Millisecond), x.job, x.start.Format(time.StampMicro),
					l.rateMax, l.ratePeriod, since.Format(time.StampMicro), strings.Join(in, "; "),
					r.eventsBefore(kind, x.start, 3*time.Second))
			}
		}
	}
}
