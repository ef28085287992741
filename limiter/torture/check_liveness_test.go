package torture

import (
	"time"
)

// livenessStep is the liveness check's time step.
const livenessStep = 25 * time.Millisecond

// readyAt reports whether job id could start at t as far as River is
// concerned: parked, available and due, or fetched and not started.
func (r *record) readyAt(id int64, t time.Time) bool {
	c, ok := r.stateAt(id, t)
	if !ok {
		return false
	}
	switch c.to {
	case "pending":
		return !r.cancelledBy(id, t)
	case "running":
		// Fetched by a worker since killed, it waits for the reaper.
		if k := r.killedAt(c.client); !k.IsZero() && !k.After(t) {
			return false
		}
		return !r.cancelledBy(id, t) && !r.startedSince(id, c.at, t)
	case "available":
		return !r.cancelledBy(id, t) && !c.scheduledAt.After(t)
	}
	return false
}

// checkLiveness: no key of a kind goes longer than livenessBound without a
// start while it has ready jobs and its limits have room (the kind's and
// the key's running jobs under their limits, room in the rate windows, no
// circuit breaker; a killed worker's slots count as taken until the
// reaper has freed them, and the jobs it had fetched wait for it). Each
// step of livenessStep in which a kind has ready jobs is judged; a key's
// wait is timed afresh from a change of the kind's limits.
func checkLiveness(r *record, vs *violations, cov coverage) {
	for _, kind := range kinds {
		ids := r.kindJobs(kind)
		runs := r.kindRuns(kind)
		stuck := map[string]time.Time{}
		reported := map[string]bool{}
		for t := r.begin; t.Before(r.end); t = t.Add(livenessStep) {
			l := r.limitsAt(kind, t)
			ready := false
			for _, id := range ids {
				if r.readyAt(id, t) {
					ready = true
					break
				}
			}
			if !ready {
				clear(stuck)
				continue
			}
			switch {
			case len(r.possible(kind, "", t)) > 1:
				// A change under way: the limits the wait is judged by start
				// afresh once it is in force everywhere.
				cov.judge("liveness")
				cov.excuse("liveness", "limits changed (wait timed afresh)")
				clear(stuck)
				continue
			case l.kindCap() == 0:
				clear(stuck) // a circuit breaker: nothing may start
				continue
			}
			cov.judge("liveness")
			active := 0
			activeKey := map[string]int{}
			starts, startsKey := 0, map[string]int{}
			lastStart := map[string]time.Time{}
			for _, x := range runs {
				k := keyOf(l, x.key)
				if x.start.After(t) {
					break
				}
				if r.slotEnd(x).After(t) {
					// Running, or killed with its slot not freed yet.
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
