package limiter

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/sluice-dev/sluice/db"
)

// Grant round bounds.
const (
	// maxGrants caps the slots one grant round gives.
	maxGrants = 1000
	// maxTurnKeys caps the keys one grant round looks at, in the round's
	// order (the next round starts with those it did not serve).
	maxTurnKeys = 256
	// maxFront caps the jobs a grant round reads per key.
	maxFront = 64
	// MaxLookahead caps the jobs of a kind resumed ahead of free slots.
	MaxLookahead = 32
	// MinLookahead is the fewest jobs of a kind under a per-kind limit
	// resumed ahead of free slots: enough for a worker to hand the slots
	// of short jobs over in memory while the next ones are resumed and
	// fetched (P12).
	MinLookahead = 32
	// rateRetry is how soon a grant round runs again for a kind whose
	// line waits while its rate window has room and its slots are free.
	rateRetry = 10 * time.Millisecond
)

// grantResult is what a grant round did.
type grantResult struct {
	// local are the grants claimed at once by jobs waiting in this worker:
	// how each runs (admitSlot, or admitRun under a rate alone).
	local map[int64]admission
	// resumed counts the parked jobs it made available.
	resumed int
	// wakeIn is when a rate window next frees a start for jobs still
	// waiting for one (0: none).
	wakeIn time.Duration
}

// lookahead is how many jobs of a kind a grant round keeps resumed ahead of
// its free slots, and how many per key: parked jobs made available without
// a slot, which wait fetched in the workers and take the next slots that
// free, sparing the resume and the fetch a slot would otherwise wait for.
// Only under a concurrency limit and no rate (a job waiting for a rate
// window would wait for long): per kind at least MinLookahead and the
// kind's limit (MaxLookahead under a per-key limit alone), per key the
// key's limit, at most MaxLookahead.
func lookahead(c *kindCounts) (perKind, perKey int) {
	perKind = MaxLookahead
	if c.limit > 0 {
		perKind = min(max(MinLookahead, int(c.limit)), MaxLookahead)
	}
	switch {
	case c.rateMax > 0 || c.limit < 0:
		return 0, 0
	case c.fields == nil && c.limit > 0:
		return perKind, perKind
	case c.fields != nil && c.keyMax > 0:
		return perKind, min(int(c.keyMax), MaxLookahead)
	}
	return 0, 0
}

// grantEntry is a job at the front of a key's line.
type grantEntry struct {
	*db.LineFrontRow
	claimed bool // granted to a job waiting in this worker: claimed at once
}

// grantRound gives kind's free room (c locked) to the front of its line:
// within a key oldest first, across keys round-robin (the keys served
// longest ago first, a key not served since it started waiting first of
// all), every grant within the kind's and the key's limits and rate
// windows. A job waiting in a worker gets a slot reserved for it, which it
// claims at its worker's next poll (at once when it waits in this worker);
// a parked job is resumed with its slot reserved; a job resumed ahead
// keeps the slot reserved until it is fetched. Then parked jobs are
// resumed ahead (lookahead) so that the next slots to free find a job
// ready — only for the keys whose slots just turned over (turnover: the
// keys of the slots a release freed, "" without a partition; nil: none),
// so that the lookahead goes to kinds whose jobs end often, not to a key
// held by a job that runs for an hour. hold names, per key, an undecided
// job that no grant may go ahead of (nil: none known). It records the
// turns of the keys served and the kind's flag, and changes the counts in
// c. Under per-key limits alone (independentKeys) a key's room is its own:
// within, when not nil, names the only keys that can have gained room
// (those whose slots the release freed, or of the jobs just decided), and
// the round reads only those.
func (l *Limiter) grantRound(ctx context.Context, q *db.Queries, kind string, c *kindCounts, hold map[string]int64,
	turnover, within []string) (grantResult, error) {
	res := grantResult{local: map[int64]admission{}}
	if c.limit < 0 {
		return res, nil
	}
	capacity := maxGrants
	if f := c.kindFree(); f >= 0 {
		capacity = min(capacity, int(f))
	}
	kindRate := c.rateMax > 0 && !c.ratePerKey
	if kindRate {
		rw, err := q.RateWindow(ctx, db.RateWindowParams{Kind: kind, PeriodMs: c.ratePeriod.Milliseconds()})
		if err != nil {
			return res, fmt.Errorf("rate window of %s: %w", kind, err)
		}
		capacity = min(capacity, max(int(c.rateMax-rw.Starts), 0))
	}
	perKind, perKeyAhead := lookahead(c)
	if len(turnover) == 0 {
		perKind, perKeyAhead = 0, 0
	}
	have := int32(-1) // jobs of the kind ahead already (-1: not read)
	if capacity == 0 && perKind > 0 {
		// No room: only the lookahead may be topped up, if it is short.
		var err error
		if have, err = q.CountAhead(ctx, kind); err != nil {
			return res, fmt.Errorf("jobs of %s ahead: %w", kind, err)
		}
		if int(have) >= perKind {
			perKind = 0
		}
	}
	if capacity == 0 && perKind == 0 {
		err := l.afterGrants(ctx, q, kind, c, nil, within, &res)
		return res, err
	}

	keys := []string{""}
	switch {
	case c.fields != nil && within != nil && c.independentKeys():
		keys = within
	case c.fields != nil:
		var err error
		if keys, err = q.TurnKeys(ctx, db.TurnKeysParams{Kind: kind, MaxKeys: maxTurnKeys}); err != nil {
			return res, fmt.Errorf("keys of %s in turn: %w", kind, err)
		}
	}
	if len(keys) == 0 {
		err := l.afterGrants(ctx, q, kind, c, nil, within, &res)
		return res, err
	}
	var lines map[string]keyLine
	if c.rateMax > 0 && c.ratePerKey {
		// The keys' own room, their rate windows with it.
		var err error
		if lines, err = keyLines(ctx, q, kind, c, keys); err != nil {
			return res, err
		}
	}
	fronts, err := lineFronts(ctx, q, kind, keys, frontDepth(c, capacity, perKind, perKeyAhead), c.keyMax)
	if err != nil {
		return res, err
	}
	if lines == nil && c.keyMax > 0 {
		// The keys' own room: the slots each holds, read with its front
		// (a key with nothing waiting, or without room or parked jobs,
		// has no row, and is given nothing).
		lines = make(map[string]keyLine, len(fronts))
		for key, front := range fronts {
			lines[key] = keyLine{slots: front[0].KeySlots}
		}
	}

	// The room of each key, and where its front stands.
	room := map[string]int{}
	next := map[string]int{}
	for _, key := range keys {
		r := capacity
		ks := lines[key]
		if c.keyMax > 0 {
			r = min(r, int(c.keyMax-ks.slots))
		}
		if c.rateMax > 0 && c.ratePerKey {
			left := int(c.rateMax - ks.starts)
			if left <= 0 && len(fronts[key]) > 0 && (res.wakeIn == 0 || ks.freesIn < res.wakeIn) {
				res.wakeIn = ks.freesIn // its window frees a start then
			}
			r = min(r, left)
		}
		room[key] = r
	}
	// Rounds: one job per key per turn, while the kind has room. A job
	// this worker handed a slot in memory, not written yet, is no longer
	// in the line.
	var picks []*grantEntry
	picked := map[int64]bool{}
	for _, front := range fronts {
		for _, e := range front {
			if l.waits.wasHanded(e.JobID) {
				picked[e.JobID] = true
			}
		}
	}
	lastTurn := map[string]int{}
	for capacity > 0 {
		progress := false
		for _, key := range keys {
			if capacity == 0 {
				break
			}
			if room[key] <= 0 {
				continue
			}
			e := nextReady(fronts[key], &next, key, picked)
			if e == nil || (hold[key] != 0 && hold[key] < e.JobID) {
				continue
			}
			picks = append(picks, &grantEntry{LineFrontRow: e})
			picked[e.JobID] = true
			lastTurn[key] = len(picks)
			room[key]--
			capacity--
			progress = true
		}
		if !progress {
			break
		}
	}
	// Lookahead: parked jobs next in line, resumed without a slot.
	var ahead []*db.LineFrontRow
	if perKind > 0 && have < 0 && !resumableFront(fronts, turnover, picked) {
		perKind = 0 // nothing parked to resume ahead: no need to count
	}
	if perKind > 0 {
		if have < 0 {
			var err error
			if have, err = q.CountAhead(ctx, kind); err != nil {
				return res, fmt.Errorf("jobs of %s ahead: %w", kind, err)
			}
		}
		for _, p := range picks {
			if !p.Parked {
				have-- // a waiter granted now is no longer ahead
			}
		}
		budget := perKind - int(have)
		for _, key := range keys {
			if !slices.Contains(turnover, key) {
				continue
			}
			keyBudget := perKeyAhead
			for _, e := range fronts[key] {
				if budget <= 0 || keyBudget <= 0 {
					break
				}
				if picked[e.JobID] {
					continue
				}
				if !e.Parked {
					keyBudget-- // already ahead, or waiting in a worker
					continue
				}
				if !e.Ready {
					break // still completing its parking: the younger wait
				}
				if e.Resumable && !e.Ahead {
					ahead = append(ahead, e)
					keyBudget--
					budget--
				}
			}
		}
	}
	if err := l.writeGrants(ctx, q, kind, c, picks, ahead, &res); err != nil {
		return res, err
	}
	// The keys served, in the order of their last turn: the next round
	// starts with those served longest ago.
	var served []string
	for _, key := range keys {
		if _, ok := lastTurn[key]; ok {
			served = append(served, key)
		}
	}
	slices.SortFunc(served, func(a, b string) int { return lastTurn[a] - lastTurn[b] })
	err = l.afterGrants(ctx, q, kind, c, served, within, &res)
	return res, err
}

// frontDepth is how deep a grant round reads each key's front: its most
// grants (capacity, within the key's limits) and the lookahead (perKind,
// perKeyAhead).
func frontDepth(c *kindCounts, capacity, perKind, perKeyAhead int) int32 {
	depth := capacity + perKind
	if c.fields != nil {
		most := capacity
		if c.keyMax > 0 {
			most = min(most, int(c.keyMax))
		}
		if c.rateMax > 0 && c.ratePerKey {
			most = min(most, int(c.rateMax))
		}
		depth = min(most+perKeyAhead, maxFront)
	}
	return int32(max(depth, 1))
}

// lineFronts reads the fronts of the lines of kind's keys, depth jobs deep
// ("": the one line of a kind without a partition, or the rows without a
// key of one that has one now); under a per-key limit (keyMax > 0) a
// named key without parked jobs only as deep as its free slots
// (LineFront).
func lineFronts(ctx context.Context, q *db.Queries, kind string, keys []string, depth, keyMax int32) (map[string][]*db.LineFrontRow, error) {
	fronts := map[string][]*db.LineFrontRow{}
	named, unkeyed := splitKeys(keys)
	if len(named) > 0 {
		rows, err := q.LineFront(ctx, db.LineFrontParams{Kind: kind, Keys: named, PerKey: depth, KeyMax: keyMax})
		if err != nil {
			return nil, fmt.Errorf("front of the %s line: %w", kind, err)
		}
		for _, row := range rows {
			fronts[row.Key] = append(fronts[row.Key], row)
		}
	}
	if unkeyed {
		rows, err := q.KindLineFront(ctx, db.KindLineFrontParams{Kind: kind, PerKey: depth})
		if err != nil {
			return nil, fmt.Errorf("front of the %s line: %w", kind, err)
		}
		for _, row := range rows {
			fronts[""] = append(fronts[""], &db.LineFrontRow{JobID: row.JobID, Parked: row.Parked, WorkerID: row.WorkerID,
				Ready: row.Ready, Resumable: row.Resumable, Queue: row.Queue, Reason: row.Reason, Ahead: row.Ahead,
				KeySlots: row.KeySlots})
		}
	}
	return fronts, nil
}

// resumableFront reports whether the fronts of the keys turnover hold a
// parked job that the lookahead could resume (not picked already).
func resumableFront(fronts map[string][]*db.LineFrontRow, turnover []string, picked map[int64]bool) bool {
	for _, key := range turnover {
		for _, e := range fronts[key] {
			if e.Parked && e.Ready && e.Resumable && !e.Ahead && !picked[e.JobID] {
				return true
			}
		}
	}
	return false
}

// nextReady is the next job of a key's front that a grant may go to (nil:
// none): in job-id order, past those picked. A parked job still completing
// its parking (its worker committed the parking; River has not moved it to
// pending yet) cannot be resumed yet, and holds up the younger jobs of its
// key, under a per-kind limit alone too (a younger job granted meanwhile
// would start before it: torture seed 399460107); the rechecks after a
// parking grant it once it is pending. One late in completing it (its
// worker is gone: it waits for a rescue) is passed over.
func nextReady(front []*db.LineFrontRow, next *map[string]int, key string, picked map[int64]bool) *db.LineFrontRow {
	for i := (*next)[key]; i < len(front); i++ {
		e := front[i]
		(*next)[key] = i + 1
		switch {
		case picked[e.JobID]:
		case !e.Ready:
			(*next)[key] = i // holds up its key until it is parked
			return nil
		case e.Parked && !e.Resumable:
			// Late in completing its parking: skipped.
		default:
			return e
		}
	}
	return nil
}

// writeGrants writes the grants picks and the resumes ahead: reserved slot
// rows (claimed at once for jobs waiting in this worker) and reserved
// starts, parked jobs made available, jobs resumed ahead recorded as
// waiters without a worker, and the River producers of their queues woken.
func (l *Limiter) writeGrants(ctx context.Context, q *db.Queries, kind string, c *kindCounts, picks []*grantEntry,
	ahead []*db.LineFrontRow, res *grantResult) error {
	if len(picks) == 0 && len(ahead) == 0 {
		return nil
	}
	// Parked jobs granted a slot, and those resumed ahead, become available.
	var resume []int64
	for _, p := range picks {
		if p.Parked {
			resume = append(resume, p.JobID)
		}
	}
	for _, e := range ahead {
		resume = append(resume, e.JobID)
	}
	resumed := map[int64]string{}
	if len(resume) > 0 {
		rows, err := q.ResumeJobsByID(ctx, resume)
		if err != nil {
			return fmt.Errorf("resume parked %s jobs: %w", kind, err)
		}
		for _, row := range rows {
			resumed[row.ID] = row.Queue
		}
	}
	var grant db.ReserveGrantsParams
	grant.Kind = kind
	var reservedStarts, claimedStarts, claimed []int64
	var sKeysR, sKeysC []string
	notify := grantNotes{}
	for _, p := range picks {
		if p.Parked {
			if _, ok := resumed[p.JobID]; !ok {
				continue // taken meanwhile (cancelled, deleted, retried by hand)
			}
		}
		worker := ""
		if p.WorkerID != nil {
			worker = *p.WorkerID
		}
		p.claimed = worker == l.workerID
		switch {
		case p.claimed || p.Parked:
			// Claimed at once; or resumed, and claimed when fetched.
		case worker == "":
			// Resumed ahead: a worker may be taking it (TakeAheadWaiters).
			notify.add(anyWorker, p.JobID)
		default:
			notify.add(worker, p.JobID)
		}
		grant.JobIds = append(grant.JobIds, p.JobID)
		grant.Keys = append(grant.Keys, p.Key)
		grant.WorkerIds = append(grant.WorkerIds, worker)
		grant.Claimed = append(grant.Claimed, p.claimed)
		if c.rateMax > 0 {
			if p.claimed {
				claimedStarts, sKeysC = append(claimedStarts, p.JobID), append(sKeysC, p.Key)
			} else {
				reservedStarts, sKeysR = append(reservedStarts, p.JobID), append(sKeysR, p.Key)
			}
		}
		if p.claimed {
			claimed = append(claimed, p.JobID)
			res.local[p.JobID] = admitRun
			if c.slotted() {
				res.local[p.JobID] = admitSlot
			}
		}
	}
	if c.slotted() && len(grant.JobIds) > 0 {
		// It raises the kind's count by the rows it adds.
		if err := q.ReserveGrants(ctx, grant); err != nil {
			return fmt.Errorf("grant %s slots: %w", kind, err)
		}
		c.taken += int32(len(grant.JobIds))
	}
	if len(reservedStarts) > 0 {
		if err := q.InsertConcurrencyStarts(ctx, db.InsertConcurrencyStartsParams{
			Kind: kind, JobIds: reservedStarts, Keys: sKeysR, Reserved: true,
		}); err != nil {
			return fmt.Errorf("grant %s starts: %w", kind, err)
		}
	}
	if len(claimedStarts) > 0 {
		if err := q.InsertConcurrencyStarts(ctx, db.InsertConcurrencyStartsParams{
			Kind: kind, JobIds: claimedStarts, Keys: sKeysC, Reserved: false,
		}); err != nil {
			return fmt.Errorf("log %s starts: %w", kind, err)
		}
	}
	if len(notify) > 0 {
		// Their workers' line pollers claim them as soon as this commits.
		if err := q.NotifyGrants(ctx, notify.payloads()); err != nil {
			return fmt.Errorf("notify the workers of %s grants: %w", kind, err)
		}
	}
	if len(claimed) > 0 {
		if err := q.DeleteWaiters(ctx, claimed); err != nil {
			return fmt.Errorf("take granted %s jobs out of the waiters: %w", kind, err)
		}
	}
	var w db.UpsertWaitersParams
	w.Kind = kind
	for _, e := range ahead {
		if _, ok := resumed[e.JobID]; ok {
			w.JobIds = append(w.JobIds, e.JobID)
			w.Keys = append(w.Keys, e.Key)
			w.Reasons = append(w.Reasons, e.Reason)
		}
	}
	if len(w.JobIds) > 0 {
		if err := q.UpsertWaiters(ctx, w); err != nil {
			return fmt.Errorf("%s jobs resumed ahead: %w", kind, err)
		}
	}
	if len(resumed) > 0 {
		var queues []string
		for _, queue := range resumed {
			if !slices.Contains(queues, queue) {
				queues = append(queues, queue)
			}
		}
		if err := q.NotifyRiverInsert(ctx, queues); err != nil {
			return fmt.Errorf("notify queues of resumed %s jobs: %w", kind, err)
		}
		l.metrics.Resumed.WithLabelValues(kind).Add(float64(len(resumed)))
		res.resumed = len(resumed)
	}
	return nil
}

// afterGrants records the turns of the keys served (in the order served),
// forgets the keys with nothing waiting, sets the kind's flag, and, under a
// rate, when jobs still wait, sets res.wakeIn to when a window frees a
// start next (at the latest a period from now: a start granted now is
// claimed a moment later). Under per-key limits alone, a round that read
// only some keys (within) leaves the turns as they are: each key's room is
// its own, so the turns order only the rounds that read every key (a
// recheck, a change of the limits, the round that finds the line empty),
// which record and forget them (two statements less under the kind's lock
// for every release, P10).
func (l *Limiter) afterGrants(ctx context.Context, q *db.Queries, kind string, c *kindCounts, served, within []string, res *grantResult) error {
	if c.fields != nil && (within == nil || !c.independentKeys()) {
		if len(served) > 0 {
			now := time.Now()
			ats := make([]time.Time, len(served))
			for i := range served {
				ats[i] = now.Add(time.Duration(i) * time.Microsecond)
			}
			if err := q.UpsertKeyTurns(ctx, db.UpsertKeyTurnsParams{Kind: kind, Keys: served, ServedAts: ats}); err != nil {
				return fmt.Errorf("record the turns of %s keys: %w", kind, err)
			}
		}
		if err := q.DeleteIdleKeyTurns(ctx, kind); err != nil {
			return fmt.Errorf("forget idle %s keys: %w", kind, err)
		}
	}
	if c.hasParked || !c.independentKeys() {
		// Under per-key limits alone no job waits for the kind: the flag
		// is only cleared, once what waited under earlier limits is gone.
		has, err := q.HasKindLine(ctx, kind)
		if err != nil {
			return fmt.Errorf("look at the %s line: %w", kind, err)
		}
		c.setHasParked(has)
	}
	if c.rateMax > 0 {
		waiting, err := q.HasAnyLine(ctx, kind)
		if err != nil {
			return fmt.Errorf("look at the %s line: %w", kind, err)
		}
		if !waiting {
			res.wakeIn = 0
			return nil
		}
		wake := c.ratePeriod // per key: look again a period on at the latest
		if !c.ratePerKey {
			rw, err := q.RateWindow(ctx, db.RateWindowParams{Kind: kind, PeriodMs: c.ratePeriod.Milliseconds()})
			if err != nil {
				return fmt.Errorf("rate window of %s: %w", kind, err)
			}
			if rw.Starts < c.rateMax {
				if c.kindFree() == 0 {
					// The kind's slots hold them: a release grants.
					return nil
				}
				// Room again already (the window moved on), or the front
				// still completing its parking: look again soon.
				wake = rateRetry
			}
			wake = min(wake, time.Duration(rw.FreesInMs)*time.Millisecond)
		}
		if res.wakeIn > 0 {
			wake = min(wake, res.wakeIn)
		}
		res.wakeIn = max(wake, minRateWake)
	}
	return nil
}

// letGo lets every job of kind's line go, its limits gone: parked jobs
// become available (oldest first, MaxResumeBatch at a time) and the
// waiters leave the line (those waiting in a worker, seeing their place
// gone, are decided again and run). It returns how many it resumed.
func (l *Limiter) letGo(ctx context.Context, q *db.Queries, kind string) (int, error) {
	total := 0
	for {
		rows, err := q.ResumeParkedJobs(ctx, db.ResumeParkedJobsParams{Kind: kind, MaxRows: MaxResumeBatch})
		if err != nil {
			return total, fmt.Errorf("resume parked %s jobs: %w", kind, err)
		}
		var queues []string
		for _, r := range rows {
			if !slices.Contains(queues, r.Queue) {
				queues = append(queues, r.Queue)
			}
		}
		if len(queues) > 0 {
			if err := q.NotifyRiverInsert(ctx, queues); err != nil {
				return total, fmt.Errorf("notify queues of resumed %s jobs: %w", kind, err)
			}
		}
		total += len(rows)
		if len(rows) < MaxResumeBatch {
			break
		}
	}
	if err := q.DeleteKindWaiters(ctx, kind); err != nil {
		return total, fmt.Errorf("let %s waiters go: %w", kind, err)
	}
	if total > 0 {
		l.metrics.Resumed.WithLabelValues(kind).Add(float64(total))
	}
	return total, nil
}
