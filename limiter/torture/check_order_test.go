package torture

import (
	"slices"
	"strings"
	"time"
)

// checkOrder: the order promise of the README's table, for every run of a
// limited kind, whatever path admitted it.
//
//   - Strict (a per-key or rate limit): a job never starts while an older
//     job of its key waits, parked, resumed and on its way, or fetched by a
//     worker and not started; but for a job fetched by another worker
//     within fetchTolerance of the younger one's fetch, or of its start,
//     or for one fetched so by another worker and parked by it straight
//     from that fetch within fetchTolerance before the younger one's start
//     (the same race: the worker parked the loser rather than keep it);
//     or for one its own worker fetched, after the younger one's fetch,
//     within fetchInFlight before the younger one's start (that fetch was
//     in flight), and parked by it straight from that fetch.
//   - By fetch (a per-kind limit alone): a job never starts while an older
//     job of its kind fetched more than fetchTolerance before it (by any
//     worker), or in the same fetch, waits in a worker; nor while an older
//     job of its kind is parked or resumed, but for one resumed, or parked
//     by another worker, within leaseTolerance, or one River hands out after it (its
//     scheduled_at later: snoozed or retried after the younger one's
//     insert). (An older job fetched later, a retry say, may start after
//     it: River hands jobs out in its own order.)
//
// In both, jobs let start together may start up to togetherTolerance apart
// in either order, a job granted while its parking or step back completed
// (before the younger one's start, the grant standing) waits for River, not
// for its turn, a job fetched by a worker since killed waits for the
// reaper, and a job the test cancelled is not waiting for its turn. A run
// fetched, or started, within changeWindow of a change of its kind's order
// regime may follow either regime: a pair is a violation only under every
// regime the run may have followed; one fetched or started with no limit
// is not a candidate, and one that may have run with no limit (a change
// window) is exempt, unless the limiter's own rows show it decided the run
// (a slot, a start or a place in the line written between its fetch and
// its start): then it is judged under the limits its decisions may have
// followed (a decision under way finishes by the limits it read), and, if
// it began on a slot of the line with no slot row before it (handed over
// in memory), under a per-kind limit alone in force at its start too; or
// unless its worker's run log says it started on a leased slot (which
// writes no row per job): then it is judged under the per-kind limits
// alone that its worker may have read between its fetch and its start.
func checkOrder(r *record, vs *violations, cov coverage) {
	for _, kind := range kinds {
		ids := r.kindJobs(kind)
		for _, xj := range r.kindRuns(kind) {
			l := r.limitsAt(kind, xj.start)
			if regime(l) == "none" {
				continue
			}
			fj, ok := r.fetchOf(xj)
			if !ok {
				cov.exempt("order", "no fetch recorded")
				continue
			}
			var followed []limits
			decided := r.decisionsOf(xj.job, fj.at, xj.start)
			switch {
			case r.letGo(xj.job, fj.at, xj.start):
				// Its limits were cleared while it waited, and the limiter let
				// it go: it ran with no limit.
				if r.inDrain(kind, fj.at, xj.start) {
					cov.exempt("order", drainExempt)
				} else {
					cov.exempt("order", "let go by a clearing of its limits")
				}
				continue
			case len(decided) > 0:
				// The limiter decided it (its own rows say so: this only turns
				// an exemption into a judgment): under the limits in force
				// when it did.
				followed = r.limitedRegimesAt(kind, decided)
				if xj.slot == "line" && !r.slotWritten(xj.job, fj.at, xj.start) {
					// Its slot of the line came with no row before it began:
					// handed over in memory by a job of its worker that ended,
					// which a worker does under a per-kind limit alone, in
					// fetch order (the move written afterwards): under those
					// limits too, if they held at its start (seed 33732833: a
					// job placed in the line under a rate, the rate cleared,
					// and handed a slot ahead of older jobs fetched after it).
					for _, m := range leasedRegimes(r.limitedRegimesAt(kind, []time.Time{xj.start})) {
						if !slices.ContainsFunc(followed, func(f limits) bool { return regime(f) == regime(m) }) {
							followed = append(followed, m)
						}
					}
				}
			case xj.slot == "leased" && len(leasedRegimes(r.limitedRegimesAt(kind, []time.Time{fj.at, xj.start}))) > 0:
				// Its worker's limiter let it start on a leased slot (its run
				// log says so; a leased slot writes no row per job): under a
				// per-kind limit alone, as its worker read the limits between
				// its fetch and its start.
				followed = leasedRegimes(r.limitedRegimesAt(kind, []time.Time{fj.at, xj.start}))
			case regime(r.limitsAt(kind, fj.at)) == "none":
				continue // fetched with no limit: no order to keep
			default:
				followed = r.regimesOf(kind, fj.at, xj.start)
			}
			if followed == nil {
				if r.inDrain(kind, fj.at, xj.start) {
					cov.exempt("order", drainExempt)
				} else {
					cov.exempt("order", "may have run with no limit")
				}
				continue
			}
			cov.judge("order")
			for _, i := range ids {
				if i >= xj.job {
					break // a younger job goes after it
				}
				w, waiting := r.waitingAt(i, xj.start)
				if !waiting {
					continue
				}
				violated, why := true, ""
				for _, m := range followed {
					if keyOf(m, r.jobs[i].args.Key) != keyOf(m, r.jobs[xj.job].args.Key) {
						violated, why = false, "-"
						break
					}
					if why = r.orderExcuse(m, i, w, xj, fj); why != "" {
						violated = false
						if len(followed) > 1 && why != "-" {
							why = "order regime changed"
						}
						break
					}
				}
				if !violated {
					if why != "-" {
						cov.excuse("order", why)
					}
					continue
				}
				where := w.how + " since " + w.since.Format(time.StampMicro)
				if w.worker != "" {
					where += " in " + w.worker
				}
				vs.add("order", "%s key %q: job %d started at %s (in %s, fetched at %s) while job %d was %s (limits %s); job %d %s; job %d %s; %s; limiter's rows: %s; %s",
					kind, keyOf(l, r.jobs[xj.job].args.Key), xj.job, xj.start.Format(time.StampMicro), xj.worker,
					fj.at.Format(time.StampMicro), i, where, l, i, r.history(i), xj.job, r.history(xj.job),
					r.eventsBefore(kind, xj.start, 3*time.Second), r.lineAt(i, xj.start), r.lineAt(xj.job, xj.start))
			}
		}
	}
}

// regimesOf is every order regime's limits (one each) that a run fetched
// at fetch and started at start may have followed, but breakers (which
// start nothing); nil when it may have run with no limit at all.
func (r *record) regimesOf(kind string, fetch, start time.Time) []limits {
	var out []limits
	seen := map[string]bool{}
	for _, l := range append(r.possible(kind, "", fetch), r.possible(kind, "", start)...) {
		if l.present && l.max < 0 {
			continue
		}
		rg := regime(l)
		if rg == "none" {
			return nil
		}
		if !seen[rg] {
			seen[rg] = true
			out = append(out, l)
		}
	}
	return out
}

// leasedRegimes is the limits of ls whose order regime is the leased
// path's (a per-kind limit alone: by fetch).
func leasedRegimes(ls []limits) []limits {
	var out []limits
	for _, l := range ls {
		if regime(l) == "by fetch" {
			out = append(out, l)
		}
	}
	return out
}

// limitedRegimesAt is every order regime's limits (one each) a decision
// of the limiter at one of times may have followed, but none and breakers.
func (r *record) limitedRegimesAt(kind string, times []time.Time) []limits {
	var out []limits
	seen := map[string]bool{}
	for _, t := range times {
		for _, l := range r.possible(kind, "", t) {
			if rg := regime(l); rg != "none" && !(l.present && l.max < 0) && !seen[rg] {
				seen[rg] = true
				out = append(out, l)
			}
		}
	}
	return out
}

// orderExcuse is the stated tolerance that excuses job i waiting (w) when
// run xj (fetched fj) started under limits l ("-": i does not go first
// there at all; "": none, a violation).
func (r *record) orderExcuse(l limits, i int64, w wait, xj run, fj change) string {
	if next := r.nextStart(i, xj.start); !next.IsZero() && !next.After(xj.start.Add(togetherTolerance)) {
		return "started together"
	}
	if w.how == "fetched" {
		if k := r.killedAt(w.worker); !k.IsZero() && !k.After(xj.start) {
			return "fetched by a killed worker"
		}
	}
	if r.cancelledBy(i, xj.start) {
		return "cancelled"
	}
	if r.grantStood(i, w.since, xj.start) {
		// Its turn came first: a slot (or a start) reserved for it while
		// its parking or its step back completed, standing at the younger
		// one's start. It waits for River's completion to make it
		// available and a worker to fetch it again (a few hundred ms at
		// worst), not for its turn (seeds 884311840, 902252574).
		return "granted as its parking or step back completed"
	}
	if l.strict() {
		if w.how == "fetched" && w.worker != xj.worker &&
			(w.since.After(fj.at.Add(-fetchTolerance)) || w.since.After(xj.start.Add(-fetchTolerance))) {
			return "fetched at about the same time"
		}
		if w.how == "fetched" && w.worker == xj.worker && w.since.After(fj.at) && w.since.After(xj.start.Add(-fetchInFlight)) {
			// Its worker's fetch of it was in flight when the younger one,
			// fetched before, started.
			return "fetched by its worker as the younger one started"
		}
		if w.how == "parked" && w.fetchedBy != "" && w.fetchedBy != xj.worker &&
			w.fetchedAt.After(fj.at.Add(-fetchTolerance)) && w.since.After(xj.start.Add(-fetchTolerance)) {
			// The same race, lost a moment before the younger one started:
			// its worker parked it rather than let it wait.
			return "fetched at about the same time, then parked"
		}
		if w.how == "parked" && w.fetchedBy == xj.worker && w.fetchedAt.After(fj.at) &&
			w.fetchedAt.After(xj.start.Add(-fetchInFlight)) {
			// Its worker's fetch of it was in flight, and the worker parked
			// it rather than let it wait (seed 909341368).
			return "fetched by its worker as the younger one started, then parked"
		}
		return ""
	}
	switch w.how {
	case "fetched":
		if w.worker == xj.worker && w.since.Equal(fj.at) {
			return "" // older, in the same fetch
		}
		if !w.since.Before(fj.at.Add(-fetchTolerance)) {
			if w.since.Before(fj.at) {
				return "fetched at about the same time"
			}
			return "-" // fetched after it: River's order
		}
		return ""
	default: // parked or resumed
		if w.since.After(xj.start.Add(-leaseTolerance)) && (w.how == "resumed" || w.fetchedBy != xj.worker) {
			// Another worker hears of a parking (or of a resume) at its
			// next look; the worker that parked the older job knows of it
			// at once, and no tolerance covers it.
			return w.how + " just now"
		}
		if r.scheduledAt(i, xj.start).After(r.scheduledAt(xj.job, fj.at)) {
			// River hands out available jobs by (priority, scheduled_at, id):
			// one snoozed or retried after the younger one's insert comes
			// after it.
			return "-"
		}
		return ""
	}
}

// grantStood reports whether job id was granted a slot or a start in
// [from, at] while its parking or its step back completed
// (grantedWhileCompleting), and that grant still stood at at: no row of
// it was deleted since.
func (r *record) grantStood(id int64, from, at time.Time) bool {
	g, ok := r.grantedWhileCompleting(id, from, at)
	if !ok {
		return false
	}
	for _, e := range r.line[id] {
		if strings.HasSuffix(e.what, " DELETE") && e.at.After(g) && !e.at.After(at) {
			return false
		}
	}
	return true
}

// scheduledAt is job id's scheduled_at as of its last change at or before
// t (River's fetch order within a priority).
func (r *record) scheduledAt(id int64, t time.Time) time.Time {
	var out time.Time
	for _, c := range r.changes[id] {
		if c.at.After(t) {
			break
		}
		if !c.scheduledAt.IsZero() {
			out = c.scheduledAt
		}
	}
	return out
}

// letGo reports whether the limiter let job id go (its kind's limits were
// cleared while it waited: LedgerLetGo took its place in the line) in
// [from, to].
func (r *record) letGo(id int64, from, to time.Time) bool {
	for _, e := range r.line[id] {
		if strings.Contains(e.query, "name: LedgerLetGo ") && !e.at.Before(from) && !e.at.After(to) {
			return true
		}
	}
	return false
}

// slotWritten reports whether the limiter wrote a slot row for job id (a
// slot taken, granted or claimed) in [from, to].
func (r *record) slotWritten(id int64, from, to time.Time) bool {
	return r.rowWritten(id, "concurrency_executions", from, to)
}

// decisionsOf is when the limiter wrote a row for job id (a slot, a start,
// a place in the line, a parking) in [from, to]: its decisions.
func (r *record) decisionsOf(id int64, from, to time.Time) []time.Time {
	var out []time.Time
	for _, e := range r.line[id] {
		if !strings.HasSuffix(e.what, "DELETE") && !e.at.Before(from) && !e.at.After(to) {
			out = append(out, e.at)
		}
	}
	return out
}
