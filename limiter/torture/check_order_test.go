package torture

import (
	"time"
)

// checkOrder: the order promise of the README's table, for every run of a
// limited kind, whatever path admitted it.
//
//   - Strict (a per-key or rate limit): a job never starts while an older
//     job of its key waits, parked, resumed and on its way, or fetched by a
//     worker and not started; but for a job fetched by another worker
//     within fetchTolerance of the younger one's fetch, or of its start.
//   - By fetch (a per-kind limit alone): a job never starts while an older
//     job of its kind fetched more than fetchTolerance before it (by any
//     worker), or in the same fetch, waits in a worker; nor while an older
//     job of its kind is parked or resumed, but for one parked or resumed
//     within leaseTolerance. (An older job fetched later, a retry say, may
//     start after it: River hands jobs out in its own order.)
//
// In both, jobs let start together may start up to togetherTolerance apart
// in either order, a job fetched by a worker since killed waits for the
// reaper, and a job the test cancelled is not waiting for its turn. A run
// fetched, or started, within changeWindow of a change of its kind's order
// regime may follow either regime: a pair is a violation only under every
// regime the run may have followed; one that may have run with no limit at
// all is exempt.
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
			followed := r.regimesOf(kind, fj.at, xj.start)
			if followed == nil {
				cov.exempt("order", "may have run with no limit")
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
	if l.strict() {
		if w.how == "fetched" && w.worker != xj.worker &&
			(w.since.After(fj.at.Add(-fetchTolerance)) || w.since.After(xj.start.Add(-fetchTolerance))) {
			return "fetched at about the same time"
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
		if w.since.After(xj.start.Add(-leaseTolerance)) {
			return w.how + " just now"
		}
		return ""
	}
}
