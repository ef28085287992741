package torture

import (
	"slices"
	"time"
)

// checkFairness: across keys, a key that arrives behind other keys'
// backlog is not held back by it. An arrival is a job of a key with
// nothing of its own running or waiting (the oldest of its key in its
// insert: the jobs of one insert arrive together, and none of them is
// another's backlog), inserted while the kind's limits
// partition it and a kind-wide limit (a per-kind limit or a kind-wide
// rate) holds other keys' jobs back (at least fairnessBacklog of them
// wait, one at least parked or in a worker). Its job is fetched within
// fairnessFetch of its insert, and from its fetch to its start (or to its
// grant, when its turn came while its parking or step back completed and
// the grant stood) at most a turn of the round goes to other keys: one
// start per other key, plus the
// kind's limit and the jobs of other keys resumed ahead and on their way
// at its fetch (the starts let go before it was decided), and a turn
// more per other key for each start of an older job of its own key (one
// that came back after its arrival, a retry: it goes first, and takes its
// key's turn); a start less than wakeJitter before its own was woken with
// it (one grant round), and is not ahead of it. Every arrival is judged, up to the first change of
// its partition or of a kind-wide limit that ends the promise (after it
// the other keys' starts are not counted), or up to the kill of its
// worker when it was killed before the job started; one that arrived in
// the window of such a change, or whose wait it ended before its fetch,
// whose job the test cancelled, or whose worker was killed before its
// turn could come, is exempt.
func checkFairness(r *record, vs *violations, cov coverage) {
	for _, kind := range kinds {
		ids := r.kindJobs(kind)
		for _, b := range ids {
			jb := r.jobs[b]
			if len(r.changes[b]) == 0 || r.youngerOfItsInsert(ids, b) {
				continue // the oldest job of its key in its insert is the arrival
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
				if ji.inserted.Equal(jb.inserted) {
					continue // of its own insert: it arrived with it, not ahead of it
				}
				busy := c.to == "available" || c.to == "pending" || c.to == "running"
				if ji.args.Key == jb.args.Key {
					if busy {
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
			xb, ok := r.firstRun(b)
			if !ok {
				cov.exempt("fairness", "never ran")
				continue
			}
			// The promise holds while the kind's limits partition it as at
			// the arrival and a kind-wide limit holds it back: the wait is
			// judged up to the first change that ends that (none: its
			// start), and, for one that arrived in the window of a change
			// into them, from when every worker has heard of it.
			steady, settled := true, a
			for _, m := range r.possible(kind, "", a) {
				steady = steady && fairRegime(m) && slices.Equal(m.fields, l.fields)
			}
			if !steady {
				for _, c := range r.limits[kind] {
					if !c.at.After(a.Add(changeWindow)) && c.at.Add(changeWindow).After(settled) {
						settled = c.at.Add(changeWindow)
					}
				}
			}
			until := xb.start
			for _, c := range r.limits[kind] {
				if c.at.After(a) && c.at.Before(xb.start) && (!fairRegime(c.limits) || !slices.Equal(c.limits.fields, l.fields)) {
					until = c.at
					break
				}
			}
			kindCap, capUntil := 0, until
			if until.Before(xb.start) {
				capUntil = until.Add(-time.Nanosecond) // the change that ended the promise sets no cap
			}
			for _, m := range r.limitsDuring(kind, settled, capUntil) {
				kindCap = max(kindCap, min(m.kindCap(), kindRateCap(m)))
			}
			if r.cancelledBy(b, xb.start) {
				cov.exempt("fairness", "cancelled")
				continue
			}
			fb, ok := r.firstFetchAfter(b, a)
			if !ok {
				cov.exempt("fairness", "no fetch recorded")
				continue
			}
			// Its key's own rate may hold it back after its fetch: the turns
			// of the other keys are counted from when that frees.
			from, excuse := fb.at, ""
			if settled.After(from) {
				from, excuse = settled, "arrived as its partition or kind-wide limit changed: judged once every worker heard"
			}
			if t := r.keyRateFrees(kind, jb.args.Key, l, fb.at); t.After(from) {
				from, excuse = t, "its key's own rate full at its fetch"
			}
			// So may a per-key rate set while it waited, counting its key's
			// starts before the change: from when that window frees.
			for _, c := range r.limits[kind] {
				if c.at.After(fb.at) && c.at.Before(until) {
					if t := r.keyRateFrees(kind, jb.args.Key, c.limits, c.at); t.After(from) {
						from, excuse = t, "its key's own rate, set while it waited, full"
					}
				}
			}
			// So may the starts of its own key after its fetch: an older job
			// that came back, or a younger one fetched with it that the
			// order check lets go first (a start of its key is its key's
			// turn, and fills its key's window).
			for _, x := range r.kindRuns(kind) {
				if x.key != jb.args.Key || x.job == b || !x.start.After(fb.at) || !x.start.Before(until) {
					continue
				}
				if t := r.keyRateFrees(kind, jb.args.Key, r.limitsAt(kind, x.start), x.start); t.After(from) {
					from, excuse = t, "its key's own rate, filled after its fetch by a start of its key"
				}
			}
			end := xb.start.Add(-wakeJitter)
			if until.Before(xb.start) {
				if !until.After(from) {
					cov.exempt("fairness", "partition or kind-wide limit changed before its turn could come")
					continue
				}
				end, excuse = until, "judged up to a change of its partition or kind-wide limit" // the promise ended there
			}
			// Its turn came as a grant while its parking (or its step back)
			// completed: the slot is its own from the grant, and the wait
			// after it is River's completion's (it parks the job and
			// resumes it at once, or makes it available), not the line's:
			// it is judged up to the grant, while that grant stood (no older
			// job of its key took it back).
			if g, ok := r.grantKeptWhileCompleting(kind, b, fb.at, end); ok && g.After(from) {
				end, excuse = g, "granted as its parking or step back completed: judged up to the grant"
			}
			// Its worker killed before it started: it is judged up to the
			// kill (its wait after it is the rescue's, not the line's).
			if k := r.killedAt(fb.client); !k.IsZero() && k.Before(end) { // end is before its start
				if !k.After(from) {
					cov.exempt("fairness", "its worker was killed before its turn could come")
					continue
				}
				end, excuse = k, "judged up to its worker's kill"
			}
			cov.judge("fairness")
			if d := fb.at.Sub(a); d > fairnessFetch {
				vs.add("fairness", "%s key %s: job %d, arriving at %s behind %d waiting jobs of %d other keys, was fetched %s later (limits %s); %s",
					kind, jb.args.Key, b, a.Format(time.StampMicro), backlog, len(waitingKeys), d.Round(time.Millisecond), l,
					r.history(b))
				continue
			}
			// own counts the starts of older jobs of its key: each came back
			// after its arrival (a retry; none waited then) and took its
			// key's turn, so the other keys have a turn more each.
			count := func(from, end time.Time) (others int, keys map[string]bool, own int) {
				keys = map[string]bool{}
				for _, x := range r.kindRuns(kind) {
					switch {
					case !x.start.After(from) || !x.start.Before(end):
					case x.key != jb.args.Key:
						others++
						keys[x.key] = true
					case x.job < b:
						own++
					}
				}
				return others, keys, own
			}
			others, started, own := count(from, end)
			ahead := r.resumedAhead(ids, jb.args.Key, fb.at)
			bound := len(started)*(1+own) + kindCap + ahead
			if others > len(started)+kindCap+ahead && others <= bound {
				cov.excuse("fairness", "an older job of its key came back and took its key's turn")
			}
			if others > bound {
				vs.add("fairness", "%s key %s: job %d, fetched at %s behind %d waiting jobs of %d other keys, started at %s after %d starts of %d other keys (one turn each, %d more each for the older jobs of its key that came back, the kind's limit, and %d resumed ahead: %d; limits %s; %s); %s; limiter's rows: %s",
					kind, jb.args.Key, b, fb.at.Format(time.StampMicro), backlog, len(waitingKeys), xb.start.Format(time.StampMicro),
					others, len(started), own, ahead, bound, l, r.recentLimits(kind, xb.start), r.history(b), r.lineAt(b, xb.start))
				continue
			}
			if excuse != "" {
				if all, keys, own := count(fb.at, xb.start.Add(-wakeJitter)); all > len(keys)*(1+own)+kindCap+ahead {
					cov.excuse("fairness", excuse)
				}
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

// keyRateFrees is when kind's key may start again under l's per-key rate,
// by the starts of its key before t that the record holds: the oldest of
// the last rateMax in the period before t, plus the period (the limiter
// counted each start up to rateJitter before the job's code began, so its
// window frees at the latest a period after the code began); zero when its
// window has room at t, or l has no rate per key.
func (r *record) keyRateFrees(kind, key string, l limits, t time.Time) time.Time {
	if !l.hasRate() || !l.ratePerKey {
		return time.Time{}
	}
	var starts []time.Time
	for _, x := range r.kindRuns(kind) {
		if x.key == key && !x.start.After(t) && x.start.After(t.Add(-l.ratePeriod-rateJitter)) {
			starts = append(starts, x.start)
		}
	}
	if len(starts) < int(l.rateMax) {
		return time.Time{}
	}
	slices.SortFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
	return starts[len(starts)-int(l.rateMax)].Add(l.ratePeriod)
}

// youngerOfItsInsert says whether a job of b's key older than b came in
// the same insert (ids in id order): the key arrived with that one.
func (r *record) youngerOfItsInsert(ids []int64, b int64) bool {
	jb := r.jobs[b]
	for _, i := range ids {
		if i >= b {
			return false
		}
		if ji := r.jobs[i]; ji.args.Key == jb.args.Key && ji.inserted.Equal(jb.inserted) {
			return true
		}
	}
	return false
}

// grantKeptWhileCompleting is when job id of kind was granted a slot or a
// start in [from, to] while its parking or its step back completed
// (grantedWhileCompleting), if that grant was taken back by nothing but a
// change of the kind's limits (in the change's own transaction) before
// River's completion wrote the parking (ok false: no such grant).
func (r *record) grantKeptWhileCompleting(kind string, id int64, from, to time.Time) (time.Time, bool) {
	g, ok := r.grantedWhileCompleting(id, from, to)
	if !ok {
		return time.Time{}, false
	}
	back := to
	for _, c := range r.changes[id] {
		if c.at.After(g) && c.to == "pending" {
			back = c.at
			break
		}
	}
	if _, other := r.grantTakenBack(kind, id, g, back); other {
		return time.Time{}, false
	}
	return g, true
}
