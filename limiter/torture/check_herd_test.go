package torture

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// lookaheadOf is how many jobs beyond what l lets start a resume may make
// available, per kind and per key: the README's stated lookahead, written
// here rather than taken from the code (32 per kind under a concurrency
// limit and no rate; per key the key's limit, at most 32; none under a
// rate or a breaker).
func lookaheadOf(l limits) (perKind, perKey int) {
	switch {
	case !l.present || l.rateMax > 0 || l.max < 0:
		return 0, 0
	case len(l.fields) == 0 && l.max > 0:
		return kindLookahead, kindLookahead
	case len(l.fields) > 0 && l.keyMax > 0:
		return kindLookahead, min(int(l.keyMax), kindLookahead)
	}
	return 0, 0
}

// capPlus is capacity c plus n (unlimited stays unlimited).
func capPlus(c, n int) int {
	if c == unlimited {
		return c
	}
	return c + n
}

// resumeOf reports whether job id's change c made it available again from
// pending by a resume (not the test's JobRetry).
func (r *record) isResume(id int64, c change) bool {
	return c.from == "pending" && c.to == "available" && !r.retriedAt(id, c.at)
}

// tightened reports whether kind's limits were tightened in [t0, t1]: a
// limit lowered, set where there was none (a breaker included), a rate
// made stricter, or the partition changed.
func (r *record) tightened(kind string, t0, t1 time.Time) bool {
	// In order, each change kept: limitsDuring keeps each limits once, and
	// a breaker raised and set again in [t0, t1] would read as raised only.
	ls := r.possible(kind, "", t0)
	for _, c := range r.limits[kind] {
		if c.at.After(t0) && !c.at.After(t1) {
			ls = append(ls, c.limits)
		}
	}
	for i := 1; i < len(ls); i++ {
		a, b := ls[i-1], ls[i]
		switch {
		case b.kindCap() < a.kindCap(), b.keyCap() < a.keyCap(), !slices.Equal(a.fields, b.fields):
			return true
		case b.hasRate() && (!a.hasRate() || b.rateMax < a.rateMax || b.ratePeriod > a.ratePeriod || b.ratePerKey != a.ratePerKey):
			return true
		}
	}
	return false
}

// checkHerd: no thundering herd. A job resumed (made available from
// pending) is not parked again before it runs, unless its kind's limits
// were tightened meanwhile or the worker that fetched it stopped or died;
// and at no moment do more resumed jobs of a kind wait unstarted than its
// limits let start plus the lookahead (per kind, and per key), under a
// rate too. Jobs resumed under earlier limits (before the last change
// committed, by another transaction: a resume in the change's own
// transaction follows it) wait on, and are not counted against the new
// ones. A resumed job whose slot an older job of
// its line took (one the resume could not see: fetched as the resume ran,
// or after it) waits on as a job of the line from that job's start. Every
// resume is judged; one when every limit was cleared (nothing holds the
// job) is exempt.
func checkHerd(r *record, vs *violations, cov coverage) {
	type event struct {
		at  time.Time
		job int64
		in  bool
		tx  int64 // a resume's transaction
	}
	for _, kind := range kinds {
		var events []event
		for _, id := range r.kindJobs(kind) {
			cs := r.changes[id]
			for i, c := range cs {
				if !r.isResume(id, c) {
					continue
				}
				if !r.limitsAt(kind, c.at).limited() {
					continue // every limit cleared: nothing holds it
				}
				cov.judge("herd")
				events = append(events, event{at: c.at, job: id, in: true, tx: c.tx})
				// It leaves the resumed set at its next start, or at its next
				// change other than its fetch: a parking from its fetch up to
				// parkCompletion before River shows it (the worker decided it
				// then, and the line went on).
				out := r.nextStart(id, c.at)
				for j, d := range cs[i+1:] {
					if d.to != "running" && (out.IsZero() || d.at.Before(out)) {
						out = d.at
						if d.to == "pending" && d.from == "running" && j > 0 {
							out = d.at.Add(-parkCompletion)
							if fetch := cs[i+j].at; out.Before(fetch) {
								out = fetch
							}
						}
						break
					}
				}
				// An older job of its line that came to the line as the resume
				// ran takes its slot (order within a line comes first): it
				// waits on as a job of the line, no longer a resumed one.
				if t, ok := r.olderTookItsSlot(kind, id, c.at, out); ok {
					out = t
					cov.excuse("herd", "its slot taken by an older job of its line that came as it was resumed")
				}
				if !out.IsZero() {
					events = append(events, event{at: out, job: id})
				}
				r.checkReparked(kind, id, c, cs[i+1:], vs)
			}
		}
		sort.Slice(events, func(i, j int) bool {
			if events[i].at.Equal(events[j].at) {
				return !events[i].in
			}
			return events[i].at.Before(events[j].at)
		})
		type resumed struct{ at, regime time.Time }
		set := map[int64]resumed{} // resumed jobs not started yet: when, and under which limits' regime
		for _, e := range events {
			if !e.in {
				delete(set, e.job)
				continue
			}
			regimeAt := r.regimeOf(kind, e.at, e.tx)
			set[e.job] = resumed{at: e.at, regime: regimeAt}
			// A resume decides with its limits as committed; a change
			// within changeWindow may not have reached it.
			window := r.possible(kind, "", e.at)
			kindCap, keyCap := 0, 0
			for _, l := range window {
				ahead, keyAhead := lookaheadOf(l)
				kindCap = max(kindCap, capPlus(min(l.kindCap(), kindRateCap(l)), ahead))
				keyCap = max(keyCap, capPlus(min(l.keyCap(), keyRateCap(l)), keyAhead))
			}
			n, nKey := 0, 0
			key := r.jobs[e.job].args.Key
			for id, x := range set {
				if x.regime.Before(regimeAt) {
					continue
				}
				n++
				if r.jobs[id].args.Key == key {
					nKey++
				}
			}
			if n > kindCap || nKey > keyCap {
				var who []string
				for id, x := range set {
					if !x.regime.Before(regimeAt) {
						who = append(who, fmt.Sprintf("resumed at %s: %s", x.at.Format("05.000000"), r.lineAt(id, e.at)))
					}
				}
				slices.Sort(who)
				vs.add("herd", "%s: %d resumed jobs waiting to start (%d of key %s) at %s, limits and lookahead allow %d (%d per key; limits %s; %s): %s",
					kind, n, nKey, key, e.at.Format(time.StampMicro), kindCap, keyCap, r.limitsAt(kind, e.at), r.recentLimits(kind, e.at),
					strings.Join(who, "; "))
			}
		}
	}
}

// olderTookItsSlot is the first start, after id's resume at at and before
// until (zero: no end), under a strict order (a per-key or rate limit),
// of a job older than id in its line (its key's, under a partition; its
// kind's, without) that the resume could not see:
// fetched less than fetchTolerance before the resume (the limiter learns
// of a fetch when it commits) or after it, and not by a resume of its own
// (snoozed, retried or inserted). Its decision takes the slot
// reserved for id, younger in its line (the order promise), and id waits
// on in the line.
func (r *record) olderTookItsSlot(kind string, id int64, at, until time.Time) (time.Time, bool) {
	l := r.limitsAt(kind, at)
	if !l.strict() {
		return time.Time{}, false // by fetch: an older job fetched later starts in its own turn, not in this one's
	}
	key := r.jobs[id].args.Key
	var first time.Time
	for _, x := range r.kindRuns(kind) {
		if x.job >= id || (len(l.fields) > 0 && x.key != key) || !x.start.After(at) || (!until.IsZero() && !x.start.Before(until)) {
			continue
		}
		if f, ok := r.fetchOf(x); ok && f.at.After(at.Add(-fetchTolerance)) && !r.resumedBefore(x.job, f) &&
			(first.IsZero() || x.start.Before(first)) {
			first = x.start
		}
	}
	return first, !first.IsZero()
}

// resumedBefore reports whether job id came to fetch f by a resume: such a
// job has a slot of its own reserved, and takes no other job's.
func (r *record) resumedBefore(id int64, f change) bool {
	var prev change
	for _, c := range r.changes[id] {
		if !c.at.Before(f.at) {
			break
		}
		prev = c
	}
	return r.isResume(id, prev)
}

// keyRateCap is a per-key rate's starts per window (unlimited: none).
func keyRateCap(l limits) int {
	if l.hasRate() && l.ratePerKey {
		return int(l.rateMax)
	}
	return unlimited
}

// checkReparked reports a job resumed by c that was fetched and parked
// again (rest: its changes after c) before it ran, but when its kind's
// limits were tightened meanwhile or the worker that fetched it stopped
// or died.
func (r *record) checkReparked(kind string, id int64, c change, rest []change, vs *violations) {
	if len(rest) < 2 || rest[0].to != "running" || rest[1].from != "running" || rest[1].to != "pending" {
		return
	}
	fetch, park := rest[0], rest[1]
	if r.startedSince(id, fetch.at, park.at) {
		return
	}
	if r.tightened(kind, c.at, park.at) {
		return
	}
	if gone := r.gone(fetch.client); !gone.IsZero() && !gone.Before(fetch.at.Add(-killTolerance)) &&
		!park.at.After(gone.Add(rescueTime)) {
		return
	}
	vs.add("herd", "%s: job %d, resumed at %s and fetched by %s at %s, parked again at %s before it ran (limits %s; %s); %s; limiter's rows: %s",
		kind, id, c.at.Format(time.StampMicro), fetch.client, fetch.at.Format(time.StampMicro), park.at.Format(time.StampMicro),
		r.limitsAt(kind, park.at), r.recentLimits(kind, park.at), r.history(id), r.lineAt(id, park.at))
}

// regimeOf names the limits that a resume at t by transaction tx followed,
// by the commit of their change: the change whose own transaction made it
// (it acts on its new limits before its commit), else the last change
// committed by t (another transaction sees a change once it committed, and
// a round that holds the kind's lock as a change begins resumes under the
// limits before it); zero: no change.
func (r *record) regimeOf(kind string, t time.Time, tx int64) time.Time {
	var at time.Time
	for _, c := range r.limits[kind] {
		if tx != 0 && c.tx == tx {
			return c.at
		}
		if !c.at.After(t) {
			at = c.at
		}
	}
	return at
}
