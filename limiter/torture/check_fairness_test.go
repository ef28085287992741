package torture

import (
	"slices"
	"time"
)

// checkFairness: across keys, a key that arrives behind other keys'
// backlog is not held back by it. An arrival is a job of a key with
// nothing of its own running or waiting, inserted while the kind's limits
// partition it and a kind-wide limit (a per-kind limit or a kind-wide
// rate) holds other keys' jobs back (at least fairnessBacklog of them
// wait, one at least parked or in a worker). Its job is fetched within
// fairnessFetch of its insert, and from its fetch to its start at most a
// turn of the round goes to other keys: one start per other key, plus the
// kind's limit and the jobs of other keys resumed ahead and on their way
// at its fetch (the starts let go before it was decided). Every arrival is judged; one whose partition or kind-wide
// limit changed meanwhile, whose job the test cancelled, or whose job's
// worker was killed before it started, is exempt.
func checkFairness(r *record, vs *violations, cov coverage) {
	for _, kind := range kinds {
		ids := r.kindJobs(kind)
		arrived := map[int64]bool{}
		for _, b := range ids {
			jb := r.jobs[b]
			if arrived[b] || len(r.changes[b]) == 0 {
				continue
			}
			a := r.changes[b][0].at // its insert
			l := r.limitsAt(kind, a)
			if !fairRegime(l) {
				continue
			}
			// Its key has nothing else running or waiting; jobs of its own
			// insert arrive with it (the oldest is judged).
			alone, backlog, held := true, 0, false
			waitingKeys := map[string]bool{}
			for _, i := range ids {
				ji := r.jobs[i]
				if i == b || ji.inserted.After(jb.inserted) {
					continue
				}
				c, ok := r.stateAt(i, a)
				if !ok {
					continue
				}
				busy := c.to == "available" || c.to == "pending" || c.to == "running"
				if ji.args.Key == jb.args.Key {
					if busy && !ji.inserted.Equal(jb.inserted) {
						alone = false
					}
					continue
				}
				if !busy || (c.to == "running" && !func() bool { _, w := r.waitingAt(i, a); return w }()) {
					continue
				}
				backlog++
				if c.to != "available" {
					held = true
					waitingKeys[ji.args.Key] = true
				}
			}
			if !alone || backlog < fairnessBacklog || !held {
				continue
			}
			for _, i := range ids {
				if r.jobs[i].args.Key == jb.args.Key && r.jobs[i].inserted.Equal(jb.inserted) {
					arrived[i] = true
				}
			}
			xb, ok := r.firstRun(b)
			if !ok {
				cov.exempt("fairness", "never ran")
				continue
			}
			kindCap, steady := 0, true
			for _, m := range r.limitsDuring(kind, a, xb.start) {
				steady = steady && fairRegime(m) && slices.Equal(m.fields, l.fields)
				kindCap = max(kindCap, min(m.kindCap(), kindRateCap(m)))
			}
			switch {
			case r.cancelledBy(b, xb.start):
				cov.exempt("fairness", "cancelled")
				continue
			case !steady:
				cov.exempt("fairness", "partition or kind-wide limit changed")
				continue
			}
			fb, ok := r.firstFetchAfter(b, a)
			if !ok {
				cov.exempt("fairness", "no fetch recorded")
				continue
			}
			if k := r.killedAt(fb.client); !k.IsZero() && k.Before(xb.start) {
				cov.exempt("fairness", "its worker was killed")
				continue
			}
			cov.judge("fairness")
			if d := fb.at.Sub(a); d > fairnessFetch {
				vs.add("fairness", "%s key %s: job %d, arriving at %s behind %d waiting jobs of %d other keys, was fetched %s later (limits %s); %s",
					kind, jb.args.Key, b, a.Format(time.StampMicro), backlog, len(waitingKeys), d.Round(time.Millisecond), l,
					r.history(b))
				continue
			}
			others, started := 0, map[string]bool{}
			for _, x := range r.kindRuns(kind) {
				if x.key != jb.args.Key && x.start.After(fb.at) && x.start.Before(xb.start) {
					others++
					started[x.key] = true
				}
			}
			ahead := r.resumedAhead(ids, jb.args.Key, fb.at)
			if bound := len(started) + kindCap + ahead; others > bound {
				vs.add("fairness", "%s key %s: job %d, fetched at %s behind %d waiting jobs of %d other keys, started at %s after %d starts of %d other keys (one turn each, the kind's limit, and %d resumed ahead: %d; limits %s); %s",
					kind, jb.args.Key, b, fb.at.Format(time.StampMicro), backlog, len(waitingKeys), xb.start.Format(time.StampMicro),
					others, len(started), ahead, bound, l, r.history(b))
			}
		}
	}
}

// resumedAhead counts the jobs of ids of keys other than key that the
// line had resumed (not let go) and that were on their way at t:
// available, or fetched since and not started. Each holds its place, and
// goes ahead of a job decided at t (the README's resume row: the
// lookahead resumes them ahead of free slots).
func (r *record) resumedAhead(ids []int64, key string, t time.Time) int {
	n := 0
	for _, i := range ids {
		if r.jobs[i].args.Key == key {
			continue
		}
		c, ok := r.stateAt(i, t)
		if !ok {
			continue
		}
		if c.to == "running" {
			if r.startedSince(i, c.at, t) {
				continue
			}
			if c, ok = r.stateAt(i, c.at.Add(-time.Nanosecond)); !ok {
				continue
			}
		}
		if w, waiting := r.waitingAt(i, c.at); waiting && w.how == "resumed" {
			n++
		}
	}
	return n
}

// fairRegime reports whether the fairness promise holds under l: the kind
// is partitioned by key and a kind-wide limit (a positive per-kind limit,
// or a kind-wide rate) may hold jobs of every key back.
func fairRegime(l limits) bool {
	return l.keyed() && l.kindCap() != 0 && (l.kindCap() != unlimited || (l.hasRate() && !l.ratePerKey))
}

// kindRateCap is a kind-wide rate's starts per window (unlimited: none).
func kindRateCap(l limits) int {
	if l.hasRate() && !l.ratePerKey {
		return int(l.rateMax)
	}
	return unlimited
}

// firstRun is job id's first execution.
func (r *record) firstRun(id int64) (run, bool) {
	if runs := r.runsOf[id]; len(runs) > 0 {
		return runs[0], true
	}
	return run{}, false
}

// firstFetchAfter is job id's first fetch at or after t.
func (r *record) firstFetchAfter(id int64, t time.Time) (change, bool) {
	for _, c := range r.changes[id] {
		if c.to == "running" && !c.at.Before(t) {
			return c, true
		}
	}
	return change{}, false
}
