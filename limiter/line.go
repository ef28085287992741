package limiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/riverqueue/river/rivertype"

	"github.com/sluice-dev/sluice/db"
)

// follow carries out the line's decision for req: while it is to wait,
// the job waits in the worker for a grant (waiters.go) and is decided again
// when its wait is over. It returns how the job runs (admitRun, admitSlot)
// or that it parked. A job whose context ends while it waits parks: a stop
// or a timeout leaves it waiting in the line, its attempt undone; a
// JobCancel cancels it in its parking (it never ran: no attempt, no error).
func (l *Limiter) follow(req *admitRequest) (admission, error) {
	for {
		if req.err != nil {
			return admitRun, req.err
		}
		if req.decision != admitWait {
			return req.decision, nil
		}
		switch l.waits.wait(req) {
		case waitGranted:
			return req.decision, nil
		case waitGone:
			// Its place in the line went (the limits were cleared): decide
			// again.
		case waitTimedOut:
			req.timedOut = true
		case waitCancelled:
			// JobCancel: it parks, and its parking cancels it. A stop or a
			// timeout: it parks, its attempt undone.
			req.cancelled = errors.Is(context.Cause(req.ctx), rivertype.ErrJobCancelledRemotely)
			req.timedOut = true
		}
		req.done = make(chan struct{})
		l.decided.inTransit(req)
		l.line.submit(req, req.done)
	}
}

// lineAction is what a line transaction does with a job.
type lineAction int

const (
	actTake  lineAction = iota // it already holds what it needs (a grant it claimed)
	actClaim                   // it claims the grant it got
	actAdmit                   // it starts now, taking a slot and logging a start as its limits need
	actWait                    // it waits in the line, in its worker
	actPark                    // it parks now (the breaker, or its wait is over and no grant came)
	actFail                    // it cannot start and may not wait (sluice run)
)

// lineStep is the decision for one job of a line transaction.
type lineStep struct {
	r      *admitRequest
	action lineAction
	slot   bool // take, claim, admit: with a slot
	start  bool // claim, admit: with a start
	// parkUnlessGranted: its wait is over; a grant round of this same
	// transaction may still give it a slot, else it parks.
	parkUnlessGranted bool
	member            bool // it already was in the line's waiters
	// giveBack: it does not run, and gives back what it holds (a grant).
	giveBack bool
	// extend: its park-after time passed while its key's line moves
	// (kindCounts.keyMoving): it waits a park-after time more.
	extend bool
}

// keyLine is what a decision knows of one key's line.
type keyLine struct {
	slots   int32         // slots held (admitted and reserved)
	starts  int32         // starts in the rate window (and reserved)
	freesIn time.Duration // until the window frees a start
	oldest  int64         // the oldest job waiting in the line (0: none)
	// admittedAgo is how long ago the key last admitted a job to a slot it
	// still holds (negative: it holds none).
	admittedAgo time.Duration
}

// keyMoving reports whether a job held by reason waits for a line of its
// key (ks) that moves: only for its key's slots or turn (not a rate
// window), while the key admitted a job within the last within, or has
// room (older jobs of the key take it first). Such a job keeps waiting in
// its worker past its park-after time: parking it would only make it
// fetched again a moment later, behind the younger jobs of its key that
// took its place in the workers (the cascade of parkings P10 measured).
func (c *kindCounts) keyMoving(reason string, ks keyLine, within time.Duration) bool {
	if reason != reasonKeyLimit && reason != reasonKeyFIFO {
		return false
	}
	return (ks.admittedAgo >= 0 && ks.admittedAgo < within) || (c.keyMax > 0 && ks.slots < c.keyMax)
}

// lineBatch decides a batch of requests, lineChunk jobs per transaction.
func (l *Limiter) lineBatch(batch []*admitRequest) {
	for len(batch) > 0 {
		n := min(len(batch), lineChunk)
		l.lineChunk(batch[:n])
		batch = batch[n:]
	}
}

// lineOutcome is what a line transaction leaves to do once it committed.
type lineOutcome struct {
	parkedKinds []string
	wakes       map[string]time.Duration
	// local are grants a grant round of the transaction claimed for jobs
	// waiting in this worker outside the batch.
	local map[int64]admission
}

// lineChunk decides requests in one transaction that locks their kinds'
// limit rows (in kind order), reads what the line holds for each job and
// each key, decides kind by kind in job-id order, and writes the claims,
// slots, starts, waiters and parkings it decided.
func (l *Limiter) lineChunk(batch []*admitRequest) {
	var out lineOutcome
	err := l.withBatchTx(batch[0].ctx, func(ctx context.Context, q *db.Queries) error {
		out = lineOutcome{wakes: map[string]time.Duration{}, local: map[int64]admission{}}
		for _, r := range batch {
			r.decision, r.reason, r.err, r.giveBack = admitRun, "", nil, false
		}
		kinds := distinctKinds(len(batch), func(i int) string { return batch[i].job.Kind })
		// The lock travels with the reading of the jobs' records and their
		// kinds' limits, which it precedes (db.Pipeline), and so, most
		// likely, does the reading of their keys' lines: one round trip.
		l.prefetchKeyLines(q, batch, kinds)
		if err := q.LockLimitRows(ctx, kinds); err != nil {
			return fmt.Errorf("lock limits: %w", err)
		}
		recs, err := l.lineRecords(ctx, q, batch)
		if err != nil {
			return err
		}
		counts := make(map[string]*kindCounts, len(kinds))
		for _, rec := range recs {
			if _, ok := counts[rec.Kind]; !ok && rec.Limited {
				counts[rec.Kind] = newKindCounts(rec.MaxConcurrency, rec.Admitted, rec.HasParked, rec.PartitionFields,
					rec.KeyMax, rec.RateMax, rec.RatePeriodMs, rec.RatePerKey)
				l.seen.set(rec.Kind, counts[rec.Kind])
			}
		}
		var toPark []*admitRequest
		for _, kind := range kinds {
			var reqs []*admitRequest
			for _, r := range batch {
				if r.job.Kind == kind {
					reqs = append(reqs, r)
				}
			}
			c, ok := counts[kind]
			if !ok || c.unlimited() {
				// No limit (any more): they run, and what the line holds
				// for them (a grant claimed or reserved before the limits
				// were cleared, a place) goes back: a job running without
				// a slot never releases one.
				for _, r := range reqs {
					if rec := recs[r.job.ID]; rec != nil && (rec.SlotHeld || rec.SlotReserved || rec.StartReserved || rec.Waiter) {
						r.giveBack = true
					}
				}
				continue
			}
			park, err := l.decideLine(ctx, q, kind, c, reqs, recs, &out)
			if err != nil {
				return err
			}
			toPark = append(toPark, park...)
		}
		parked, err := l.park(ctx, q, toPark, counts)
		if err != nil {
			return err
		}
		out.parkedKinds = parked
		return saveCounts(ctx, q, counts)
	})
	for _, r := range batch {
		if err == nil && r.giveBack {
			// What it held (a grant it claimed, or one reserved for it)
			// goes back.
			l.forget(r)
		}
		switch {
		case err != nil:
			r.decision, r.err = admitRun, err
		case r.cancelled:
			// Its parking cancels it: not counted as a parking.
		case r.decision == admitParked:
			l.metrics.Parked.WithLabelValues(r.job.Kind).Inc()
			if rateReason(r.reason) {
				l.metrics.RateDelayed.WithLabelValues(r.job.Kind).Inc()
			}
			l.parkedTotal.Add(1)
		}
		close(r.done)
	}
	if err != nil {
		return
	}
	l.waits.grant(out.local)
	if len(out.parkedKinds) > 0 {
		l.recheck(out.parkedKinds)
	}
	for kind, d := range out.wakes {
		l.wakes.after(kind, d)
	}
}

// lineRecords reads what the limiter holds for the jobs of batch, and
// their kinds' limit rows.
func (l *Limiter) lineRecords(ctx context.Context, q *db.Queries, batch []*admitRequest) (map[int64]*db.LineRecordsRow, error) {
	p := db.LineRecordsParams{WorkerID: l.workerID}
	for _, r := range batch {
		p.JobIds = append(p.JobIds, r.job.ID)
		p.Kinds = append(p.Kinds, r.job.Kind)
		at := time.Time{}
		if r.job.AttemptedAt != nil {
			at = *r.job.AttemptedAt
		}
		p.AttemptedAts = append(p.AttemptedAts, at)
	}
	rows, err := q.LineRecords(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("read the line of jobs: %w", err)
	}
	out := make(map[int64]*db.LineRecordsRow, len(rows))
	for _, row := range rows {
		out[row.JobID] = row
	}
	return out, nil
}

// decideLine decides the jobs reqs of kind (c locked) and writes what it
// decided; it returns the jobs to park. A job holding a grant claims it. A
// new job starts if every limit of the kind has room and no job waits ahead
// of it: none of its key older than it in the line or undecided in a worker
// (a job fetched at the same moment by another worker), and, unless only
// its key is limited, none of the kind waiting for the kind's own limits;
// else it waits in the line, in its worker until its park-after time, and
// parks. A job already in the line starts only by a grant: when room is
// free, a grant round of this same transaction gives it to the front of
// the line, round-robin across keys.
func (l *Limiter) decideLine(ctx context.Context, q *db.Queries, kind string, c *kindCounts, reqs []*admitRequest,
	recs map[int64]*db.LineRecordsRow, out *lineOutcome) ([]*admitRequest, error) {
	sort.Slice(reqs, func(i, j int) bool { return reqs[i].job.ID < reqs[j].job.ID })
	if err := setPartitionKeys(ctx, q, kind, c.fields, reqs); err != nil {
		return nil, err
	}
	var keys []string
	for _, r := range reqs {
		if !slices.Contains(keys, r.key) {
			keys = append(keys, r.key)
		}
	}
	lines, err := keyLines(ctx, q, kind, c, keys)
	if err != nil {
		return nil, err
	}
	kindStarts, kindFreesIn := int32(0), time.Duration(0)
	if c.rateMax > 0 && !c.ratePerKey {
		rw, err := q.RateWindow(ctx, db.RateWindowParams{Kind: kind, PeriodMs: c.ratePeriod.Milliseconds()})
		if err != nil {
			return nil, fmt.Errorf("rate window of %s: %w", kind, err)
		}
		kindStarts, kindFreesIn = rw.Starts, time.Duration(rw.FreesInMs)*time.Millisecond
	}
	now := time.Now()
	plan := l.planLine(*c, reqs, recs, lines, kindStarts, kindFreesIn, nil, now)
	var undecided map[string]int64
	if c.keyed() && (plan.admits > 0 || plan.grant) {
		// A job of the key fetched by another worker at the same moment,
		// and not decided yet, goes first: neither a job of the batch nor
		// a grant round starts a job of its key before it.
		if undecided, err = undecidedOlder(ctx, q, kind, c, reqs, reqs[len(reqs)-1].job.ID); err != nil {
			return nil, err
		}
		if len(undecided) > 0 {
			plan = l.planLine(*c, reqs, recs, lines, kindStarts, kindFreesIn, undecided, now)
		}
	}
	return l.writeLine(ctx, q, kind, c, plan, keys, undecided, out)
}

// keyLines reads the lines of kind's keys ("": the one line of a kind
// without a partition, or the rows without a key of one that has one now).
func keyLines(ctx context.Context, q *db.Queries, kind string, c *kindCounts, keys []string) (map[string]keyLine, error) {
	out := make(map[string]keyLine, len(keys))
	period := c.ratePeriod.Milliseconds()
	named, unkeyed := splitKeys(keys)
	if len(named) > 0 {
		rows, err := q.KeyLines(ctx, db.KeyLinesParams{Kind: kind, Keys: named, PeriodMs: period})
		if err != nil {
			return nil, fmt.Errorf("lines of %s keys: %w", kind, err)
		}
		for _, row := range rows {
			out[row.Key] = newKeyLine(row.Slots, row.Starts, row.FreesInMs, row.Oldest, row.AdmittedAgoMs)
		}
	}
	if unkeyed {
		row, err := q.KindLine(ctx, db.KindLineParams{Kind: kind, PeriodMs: period})
		if err != nil {
			return nil, fmt.Errorf("line of %s: %w", kind, err)
		}
		out[""] = newKeyLine(row.Slots, row.Starts, row.FreesInMs, row.Oldest, row.AdmittedAgoMs)
	}
	return out, nil
}

// splitKeys separates the partition keys of keys from "" (the line of rows
// without a key), which KindLine and KindLineFront read.
func splitKeys(keys []string) (named []string, unkeyed bool) {
	named = slices.DeleteFunc(slices.Clone(keys), func(k string) bool { return k == "" })
	return named, len(named) < len(keys)
}

// newKeyLine is the keyLine of a row of KeyLines or KindLine.
func newKeyLine(slots, starts int32, freesInMs, oldest, admittedAgoMs int64) keyLine {
	return keyLine{slots: slots, starts: starts, freesIn: time.Duration(freesInMs) * time.Millisecond, oldest: oldest,
		admittedAgo: time.Duration(admittedAgoMs) * time.Millisecond}
}

// undecidedOlder reads, per key, the oldest running job of kind older than
// maxID that no decision covers yet (fetched by a worker whose limiter has
// not decided it), but the jobs of reqs.
func undecidedOlder(ctx context.Context, q *db.Queries, kind string, c *kindCounts, reqs []*admitRequest, maxID int64) (map[string]int64, error) {
	except := make([]int64, len(reqs))
	for i, r := range reqs {
		except[i] = r.job.ID
	}
	rows, err := q.UndecidedOlder(ctx, db.UndecidedOlderParams{Kind: kind, Fields: c.fields, MaxID: maxID, ExceptIds: except})
	if err != nil {
		return nil, fmt.Errorf("undecided %s jobs: %w", kind, err)
	}
	out := map[string]int64{}
	for _, row := range rows {
		if old, ok := out[row.Key]; !ok || row.ID < old {
			out[row.Key] = row.ID
		}
	}
	return out, nil
}

// linePlan is the decisions of one kind's jobs, before they are written.
type linePlan struct {
	steps  []lineStep
	admits int
	// grant: room is free while jobs wait for their turn only: a grant
	// round gives it to the front of the line.
	grant  bool
	wakeIn time.Duration // a rate window frees a start for a waiting job (0: none)
}

// planLine decides the jobs reqs (in job-id order) from the kind's counts
// c, the lines of their keys, the kind's rate window, and the undecided
// jobs of their keys that go first (nil: none known); it changes nothing.
func (l *Limiter) planLine(c kindCounts, reqs []*admitRequest, recs map[int64]*db.LineRecordsRow, lines map[string]keyLine,
	kindStarts int32, kindFreesIn time.Duration, undecided map[string]int64, now time.Time) linePlan {
	lines = cloneLines(lines)
	var p linePlan
	for _, r := range reqs {
		rec := recs[r.job.ID]
		if rec == nil {
			rec = &db.LineRecordsRow{JobID: r.job.ID}
		}
		ks := lines[r.key]
		step := lineStep{r: r, member: rec.Waiter}

		switch {
		case r.cancelled:
			// Cancelled while it waited: it parks whatever it holds (its
			// parking cancels it; what it holds is given back).
			step.action, r.reason, step.giveBack = actPark, reasonLimit, true
		case rec.SlotHeld || rec.StartHeld:
			step.action, step.slot = actTake, rec.SlotHeld
		case (rec.SlotReserved || rec.StartReserved) && c.limit < 0:
			// Granted before the kind became a circuit breaker: the grant
			// goes back, and the job parks (or, in sluice run, fails).
			step.action, r.reason, step.giveBack = actPark, reasonBreaker, true
			if r.reserve || l.neverPark {
				step.action = actFail
			}
		case rec.SlotReserved || rec.StartReserved:
			step.action, step.slot, step.start = actClaim, rec.SlotReserved, rec.StartReserved
		default:
			reason, orderOnly := c.blocker(r, rec.Waiter, ks, kindStarts, undecided)
			if reason == "" {
				step.action, step.slot, step.start = actAdmit, c.slotted(), c.rateMax > 0
				if step.slot {
					c.taken++
					ks.slots++
				}
				if step.start {
					kindStarts++
					ks.starts++
				}
				p.admits++
				break
			}
			r.reason = reason
			if orderOnly {
				p.grant = true
			}
			freesIn := time.Duration(0)
			switch reason {
			case reasonRate:
				freesIn = kindFreesIn
			case reasonKeyRate:
				freesIn = ks.freesIn
			}
			if freesIn > 0 && (p.wakeIn == 0 || freesIn < p.wakeIn) {
				p.wakeIn = freesIn
			}
			switch {
			case r.reserve || l.neverPark:
				step.action = actFail
			case reason == reasonBreaker:
				step.action = actPark
			case (r.timedOut || !now.Before(r.deadline)) && r.ctx.Err() == nil && !r.cancelled && c.keyMoving(reason, ks, l.parkAfter):
				// Its park-after time passed, but its key's line moves: it
				// waits on, from now.
				step.action, step.extend = actWait, true
			case r.timedOut || !now.Before(r.deadline) || (freesIn > 0 && now.Add(freesIn).After(r.deadline)):
				// No time left to wait (or the window frees too late): it
				// parks, unless a grant round of this transaction gives it
				// a slot.
				step.action, step.parkUnlessGranted = actWait, true
			default:
				step.action = actWait
			}
			if step.action != actFail {
				// Younger jobs of its key, and of the kind when it waits for
				// the kind, queue behind it.
				if ks.oldest == 0 || r.job.ID < ks.oldest {
					ks.oldest = r.job.ID
				}
				if !keyReason(reason) {
					c.hasParked = true
				}
			}
		}
		lines[r.key] = ks
		p.steps = append(p.steps, step)
	}
	return p
}

func cloneLines(in map[string]keyLine) map[string]keyLine {
	out := make(map[string]keyLine, len(in))
	for k, v := range in {
		out[k] = v
	}
	return out
}

// blocker is what holds job r (member: in the line already) from starting
// now ("": nothing), and whether only its turn does (every limit has room,
// so a grant round gives the room to the front of the line).
func (c *kindCounts) blocker(r *admitRequest, member bool, ks keyLine, kindStarts int32, undecided map[string]int64) (reason string, orderOnly bool) {
	if c.limit < 0 {
		return reasonBreaker, false
	}
	capacity := ""
	switch {
	case c.limit > 0 && c.taken >= c.limit:
		capacity = reasonLimit
	case c.rateMax > 0 && !c.ratePerKey && kindStarts >= c.rateMax:
		capacity = reasonRate
	case c.keyMax > 0 && ks.slots >= c.keyMax:
		capacity = reasonKeyLimit
	case c.rateMax > 0 && c.ratePerKey && ks.starts >= c.rateMax:
		capacity = reasonKeyRate
	}
	keyFIFO := reasonKeyFIFO
	if c.fields == nil {
		keyFIFO = reasonFIFO
	}
	if member {
		// In the line already: it starts by a grant, at its turn.
		if capacity != "" {
			return capacity, false
		}
		return keyFIFO, true
	}
	order := ""
	switch {
	case c.hasParked:
		order = reasonFIFO // jobs of the kind wait for the kind: round-robin
	case ks.oldest != 0 && ks.oldest < r.job.ID:
		order = keyFIFO
	case undecided[r.key] != 0 && undecided[r.key] < r.job.ID:
		order = keyFIFO
	}
	switch {
	case order == "" && capacity == "":
		return "", false
	case capacity == "":
		return order, true
	case order != "" && !keyReason(capacity):
		return order, false
	}
	return capacity, false
}

// writeLine writes the decisions of plan for kind (c locked) and answers
// the requests; it returns the jobs to park. When room is free while jobs
// wait for their turn, it runs a grant round, which may give a slot to
// jobs of plan (claimed at once: they wait in this worker) or to other
// jobs of the line, but not ahead of the undecided jobs of a key (keys:
// those of plan's jobs, all the round reads under per-key limits alone).
func (l *Limiter) writeLine(ctx context.Context, q *db.Queries, kind string, c *kindCounts, plan linePlan, keys []string, undecided map[string]int64,
	out *lineOutcome) ([]*admitRequest, error) {
	var claimSlots, claimStarts, unwait []int64
	var slotIDs, startIDs, waitIDs []int64
	var slotKeys, startKeys, waitKeys, waitReasons, turnKeys []string
	reserve := false
	for _, s := range plan.steps {
		r := s.r
		r.decision = admitRun
		switch s.action {
		case actTake, actClaim:
			if s.slot {
				r.decision = admitSlot
			}
			if s.action == actClaim && s.slot {
				claimSlots = append(claimSlots, r.job.ID)
			}
			if s.action == actClaim && s.start {
				claimStarts = append(claimStarts, r.job.ID)
			}
			if s.member {
				unwait = append(unwait, r.job.ID)
			}
		case actAdmit:
			reserve = r.reserve
			if s.slot {
				r.decision = admitSlot
				slotIDs, slotKeys = append(slotIDs, r.job.ID), append(slotKeys, r.key)
			}
			if s.start {
				startIDs, startKeys = append(startIDs, r.job.ID), append(startKeys, r.key)
			}
		case actWait:
			r.decision = admitWait
			if s.extend {
				if r.since.IsZero() {
					r.since = r.deadline.Add(-l.parkAfter)
				}
				r.timedOut, r.deadline = false, time.Now().Add(l.parkAfter)
			}
			waitIDs, waitKeys, waitReasons = append(waitIDs, r.job.ID), append(waitKeys, r.key), append(waitReasons, r.reason)
			if c.fields != nil && !slices.Contains(turnKeys, r.key) {
				turnKeys = append(turnKeys, r.key)
			}
			if !keyReason(r.reason) {
				c.setHasParked(true)
			}
		case actPark:
			r.decision = admitParked
		case actFail:
			if !r.reserve {
				r.err = ErrNoSlot
			}
		}
		r.giveBack = s.giveBack
	}
	if len(claimSlots) > 0 {
		if err := q.ClaimReservedSlots(ctx, db.ClaimReservedSlotsParams{WorkerID: &l.workerID, JobIds: claimSlots}); err != nil {
			return nil, fmt.Errorf("claim granted %s slots: %w", kind, err)
		}
	}
	if len(claimStarts) > 0 {
		if err := q.ClaimReservedStarts(ctx, claimStarts); err != nil {
			return nil, fmt.Errorf("claim granted %s starts: %w", kind, err)
		}
	}
	if len(slotIDs) > 0 {
		// insertSlots raises the kind's count by the rows it adds.
		p := db.InsertConcurrencyExecutionsParams{
			JobIds: slotIDs, Kinds: slices.Repeat([]string{kind}, len(slotIDs)), Keys: slotKeys, WorkerID: &l.workerID,
		}
		if reserve {
			p.WorkerID, p.Reserved = nil, true
		}
		if err := insertSlots(ctx, q, map[string]*kindCounts{kind: c}, p); err != nil {
			return nil, fmt.Errorf("admit %s jobs: %w", kind, err)
		}
		c.taken += int32(len(slotIDs))
	}
	if len(startIDs) > 0 {
		if err := q.InsertConcurrencyStarts(ctx, db.InsertConcurrencyStartsParams{
			Kind: kind, JobIds: startIDs, Keys: startKeys, Reserved: reserve,
		}); err != nil {
			return nil, fmt.Errorf("log %s starts: %w", kind, err)
		}
	}
	if len(unwait) > 0 {
		if err := q.DeleteWaiters(ctx, unwait); err != nil {
			return nil, fmt.Errorf("take %s jobs out of the waiters: %w", kind, err)
		}
	}
	if len(waitIDs) > 0 {
		if err := q.UpsertWaiters(ctx, db.UpsertWaitersParams{Kind: kind, JobIds: waitIDs, Keys: waitKeys, Reasons: waitReasons,
			WorkerID: &l.workerID}); err != nil {
			return nil, fmt.Errorf("%s jobs wait: %w", kind, err)
		}
	}
	if len(turnKeys) > 0 {
		if err := q.EnsureKeyTurns(ctx, db.EnsureKeyTurnsParams{Kind: kind, Keys: turnKeys}); err != nil {
			return nil, fmt.Errorf("give waiting %s keys a turn: %w", kind, err)
		}
	}
	wakeIn := plan.wakeIn
	if plan.grant {
		res, err := l.grantRound(ctx, q, kind, c, undecided, nil, keys)
		if err != nil {
			return nil, err
		}
		for _, s := range plan.steps {
			if dec, ok := res.local[s.r.job.ID]; ok {
				s.r.decision = dec
				delete(res.local, s.r.job.ID)
			}
		}
		for id, dec := range res.local {
			out.local[id] = dec
		}
		if res.wakeIn > 0 && (wakeIn == 0 || res.wakeIn < wakeIn) {
			wakeIn = res.wakeIn
		}
	}
	if wakeIn > 0 {
		out.wakes[kind] = wakeIn
	}
	var toPark []*admitRequest
	for _, s := range plan.steps {
		if s.action == actPark || (s.parkUnlessGranted && s.r.decision == admitWait) {
			s.r.decision = admitParked
			toPark = append(toPark, s.r)
		}
	}
	return toPark, nil
}
