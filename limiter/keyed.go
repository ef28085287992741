package limiter

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/db"
)

// Park reasons. The first four hold up the whole kind (new jobs of the kind
// wait behind the parked ones); the key reasons hold up only the job's key.
const (
	reasonLimit    = "limit"     // the per-kind limit is reached
	reasonFIFO     = "fifo"      // older jobs of the kind wait
	reasonBreaker  = "breaker"   // the per-kind limit is a circuit breaker
	reasonRate     = "rate"      // the kind's rate window is full
	reasonKeyLimit = "key_limit" // the key's limit is reached
	reasonKeyFIFO  = "key_fifo"  // older jobs of the key wait
	reasonKeyRate  = "key_rate"  // the key's rate window is full
)

// keyReason reports whether a job parked for reason waits for its key only.
func keyReason(reason string) bool {
	return reason == reasonKeyLimit || reason == reasonKeyFIFO || reason == reasonKeyRate
}

// rateReason reports whether a job parked for reason waits for a rate
// window.
func rateReason(reason string) bool { return reason == reasonRate || reason == reasonKeyRate }

// keyedBatch admits or parks a batch of jobs of kinds with per-key or rate
// limits, in one transaction that locks their limit rows (in kind order),
// reads the state of the jobs' keys and rate windows, decides job by job
// in job-id order (FIFO within a kind and within a key), and writes the
// slots, starts and parkings it decided. Unlike the per-kind fast path
// (AdmitJobs), every decision here is exact, in Go, under the lock.
func (l *Limiter) keyedBatch(batch []*admitRequest) {
	for len(batch) > 0 {
		n := min(len(batch), parkChunk*4)
		l.keyedChunk(batch[:n])
		batch = batch[n:]
	}
}

func (l *Limiter) keyedChunk(batch []*admitRequest) {
	var parkedKinds []string
	wakes := map[string]time.Time{}
	for _, r := range batch {
		r.decision, r.wait = admitRun, false
	}
	// Reservations are made by resumes before the jobs are fetched: read
	// outside the kind's lock.
	ids := make([]int64, len(batch))
	for i, r := range batch {
		ids[i] = r.job.ID
	}
	var resv map[int64]*db.KeyedReservationsRow
	err := func() error {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(batch[0].ctx), batchTimeout)
		defer cancel()
		var err error
		resv, err = reservationsOf(ctx, l.q, ids)
		return err
	}()
	if err == nil {
		err = l.withBatchTx(batch[0].ctx, func(ctx context.Context, tx pgx.Tx) error {
			q := db.New(tx)
			kinds := distinctKinds(len(batch), func(i int) string { return batch[i].job.Kind })
			counts, err := lockKinds(ctx, q, kinds)
			if err != nil {
				return err
			}
			var toPark []*admitRequest
			var reasons []string
			for _, kind := range kinds {
				var reqs []*admitRequest
				for _, r := range batch {
					if r.job.Kind == kind {
						reqs = append(reqs, r)
					}
				}
				c, ok := counts[kind]
				if !ok {
					for _, r := range reqs {
						r.decision = admitRun // the limit went meanwhile
					}
					continue
				}
				park, why, wake, err := l.decideKeyed(ctx, q, kind, c, reqs, false, resv)
				if err != nil {
					return err
				}
				toPark = append(toPark, park...)
				reasons = append(reasons, why...)
				if !wake.IsZero() {
					wakes[kind] = wake
				}
			}
			if l.neverPark && len(toPark) > 0 {
				for _, r := range toPark {
					r.decision, r.err = admitRun, ErrNoSlot
				}
				toPark, reasons = nil, nil
			}
			parked, err := l.park(ctx, q, toPark, reasons, counts)
			if err != nil {
				return err
			}
			parkedKinds = parked
			for i, r := range toPark {
				if rateReason(reasons[i]) {
					l.metrics.RateDelayed.WithLabelValues(r.job.Kind).Inc()
				}
			}
			return saveCounts(ctx, q, counts)
		})
	}
	for _, r := range batch {
		switch {
		case err != nil:
			r.decision, r.err = admitRun, err
		case r.wait:
			// Its key's slots are all taken, by running jobs: it waits in
			// the worker for one (key_wait.go).
			l.addWaiter(r)
			continue
		case r.decision == admitSlot && r.key != "":
			l.holding(r.job.ID, kindKey{r.job.Kind, r.key}, 0)
		case r.decision == admitParked:
			l.metrics.Parked.WithLabelValues(r.job.Kind).Inc()
			l.parkedTotal.Add(1)
		}
		close(r.done)
	}
	if err != nil {
		return
	}
	if len(parkedKinds) > 0 {
		l.recheck(parkedKinds)
	}
	for kind, at := range wakes {
		l.wakes.at(kind, at)
	}
}

// mayWait reports whether r may wait in its worker for a slot of its key
// rather than park: not for longer than the park-after time since it first
// waited, not after its context ended, not while the limiter stops.
func (l *Limiter) mayWait(r *admitRequest, now time.Time) bool {
	if l.neverPark || r.ctx.Err() != nil {
		return false
	}
	l.recheckMu.Lock()
	stopped := l.stopped
	l.recheckMu.Unlock()
	if stopped {
		return false
	}
	if r.waitUntil.IsZero() {
		r.waitUntil = now.Add(l.leases.parkAfter)
	}
	return now.Before(r.waitUntil)
}

// keyState is what the keyed admission and resume know of one key.
type keyState struct {
	slots   int32 // slots taken (admitted and reserved)
	waiting bool  // jobs of the key are parked: later ones queue behind them
	starts  int32 // starts in the rate window (and reserved)
	oldest  time.Time
}

// decideKeyed decides the jobs reqs of kind (c locked): a resumed job
// claims what its resume reserved; any other job is admitted if every
// limit of the kind lets it start, else parked. It writes the admissions
// (slots with their keys, starts) and returns the jobs to park with their
// reasons, and when a rate window frees a start for them (zero: none
// waits for a rate). With reserve, the admissions are reservations (a
// slot and start held for a job not fetched yet: sluice run), which the
// job's own admission claims.
func (l *Limiter) decideKeyed(ctx context.Context, q *db.Queries, kind string, c *kindCounts, reqs []*admitRequest, reserve bool,
	resv map[int64]*db.KeyedReservationsRow) ([]*admitRequest, []string, time.Time, error) {
	sort.Slice(reqs, func(i, j int) bool { return reqs[i].job.ID < reqs[j].job.ID })
	ids := make([]int64, len(reqs))
	for i, r := range reqs {
		ids[i] = r.job.ID
	}
	if err := setPartitionKeys(ctx, q, kind, c.fields, reqs); err != nil {
		return nil, nil, time.Time{}, err
	}
	if resv == nil {
		var err error
		if resv, err = reservationsOf(ctx, q, ids); err != nil {
			return nil, nil, time.Time{}, err
		}
	}

	// The window a new start must fit: the starts since the earliest
	// attempted_at of the batch minus the period count (conservative for
	// the later jobs), with the reserved ones.
	now := time.Now()
	earliest := now
	for _, r := range reqs {
		if at := startedAt(r, now); at.Before(earliest) {
			earliest = at
		}
	}
	since := earliest.Add(-c.ratePeriod)
	var kindStarts int32
	var kindOldest time.Time
	if c.rateMax > 0 {
		rw, err := q.RateWindow(ctx, db.RateWindowParams{Kind: kind, Since: since, Cutoff: now.Add(-c.ratePeriod - time.Second)})
		if err != nil {
			return nil, nil, time.Time{}, fmt.Errorf("rate window of %s: %w", kind, err)
		}
		kindStarts, kindOldest = rw.Starts, fromMicros(rw.OldestUs)
	}
	keys := map[string]*keyState{}
	if c.fields != nil {
		var list []string
		for _, r := range reqs {
			if _, ok := keys[r.key]; !ok && resv[r.job.ID] == nil {
				keys[r.key] = nil
				list = append(list, r.key)
			}
		}
		if err := readKeyStates(ctx, q, kind, list, since, keys); err != nil {
			return nil, nil, time.Time{}, err
		}
	}

	var claimSlots []int64
	var claimStarts []int64
	var claimAt []time.Time
	var slotIDs, startIDs []int64
	var slotKeys, startKeys []string
	var startAts []time.Time
	var toPark []*admitRequest
	var reasons []string
	var wake time.Time
	parkedAhead := false
	keyAhead := map[string]bool{}     // an older job of the key parks in this batch
	keyWaitAhead := map[string]bool{} // an older job of the key waits in the worker

	for _, r := range reqs {
		if rv := resv[r.job.ID]; rv != nil {
			// A resumed job: its resume reserved its slot and start.
			if rv.Slot {
				claimSlots = append(claimSlots, r.job.ID)
				r.decision = admitSlot
			} else {
				r.decision = admitRun
			}
			if rv.Start {
				claimStarts = append(claimStarts, r.job.ID)
				claimAt = append(claimAt, startedAt(r, now))
			}
			continue
		}
		ks := keys[r.key]
		reason := ""
		switch {
		case c.limit < 0:
			reason = reasonBreaker
		case c.hasParked || parkedAhead:
			reason = reasonFIFO
		case c.limit > 0 && c.taken >= c.limit:
			reason = reasonLimit
		case c.rateMax > 0 && !c.ratePerKey && kindStarts >= c.rateMax:
			reason = reasonRate
			wake = earliestOf(wake, windowFrees(kindOldest, c.ratePeriod, now))
		case ks != nil && (ks.waiting || keyAhead[r.key]):
			reason = reasonKeyFIFO
		case ks != nil && c.keyMax > 0 && (ks.slots >= c.keyMax || keyWaitAhead[r.key]):
			reason = reasonKeyLimit
		case ks != nil && c.ratePerKey && ks.starts >= c.rateMax:
			reason = reasonKeyRate
			wake = earliestOf(wake, windowFrees(ks.oldest, c.ratePeriod, now))
		}
		if reason == reasonKeyLimit && !reserve && c.rateMax == 0 && l.mayWait(r, now) {
			// The key's slots are taken by running jobs (none of the key
			// is parked): a 0-ms job's slot frees in a moment, and waiting
			// in the worker for it costs less than a parking and a resume.
			r.wait = true
			keyWaitAhead[r.key] = true
			continue
		}
		if reason != "" {
			r.decision = admitParked
			toPark = append(toPark, r)
			reasons = append(reasons, reason)
			if r.key != "" {
				keyAhead[r.key] = true
			}
			if !keyReason(reason) {
				parkedAhead = true
			}
			continue
		}
		r.decision = admitRun
		if c.slotted() {
			r.decision = admitSlot
			slotIDs = append(slotIDs, r.job.ID)
			slotKeys = append(slotKeys, r.key)
			c.taken++
			if ks != nil {
				ks.slots++
			}
		}
		if c.rateMax > 0 {
			startIDs = append(startIDs, r.job.ID)
			startKeys = append(startKeys, r.key)
			startAts = append(startAts, startedAt(r, now))
			kindStarts++
			if ks != nil {
				ks.starts++
			}
		}
	}

	if len(claimSlots) > 0 {
		if err := q.ClaimReservedSlots(ctx, db.ClaimReservedSlotsParams{WorkerID: &l.workerID, JobIds: claimSlots}); err != nil {
			return nil, nil, time.Time{}, fmt.Errorf("claim reserved %s slots: %w", kind, err)
		}
	}
	if len(claimStarts) > 0 {
		if err := q.ClaimReservedStarts(ctx, db.ClaimReservedStartsParams{JobIds: claimStarts, StartedAts: claimAt}); err != nil {
			return nil, nil, time.Time{}, fmt.Errorf("claim reserved %s starts: %w", kind, err)
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
			return nil, nil, time.Time{}, fmt.Errorf("admit %s jobs: %w", kind, err)
		}
	}
	if len(startIDs) > 0 {
		if err := q.InsertConcurrencyStarts(ctx, db.InsertConcurrencyStartsParams{
			Kind: kind, JobIds: startIDs, Keys: startKeys, StartedAts: startAts, Reserved: reserve,
		}); err != nil {
			return nil, nil, time.Time{}, fmt.Errorf("log %s starts: %w", kind, err)
		}
	}
	return toPark, reasons, wake, nil
}

// setPartitionKeys sets the partition key of each request (fields nil: the
// kind has no partition, every key ”): from the job's args as River
// fetched them (jsonb's text, so the JSON text of a value is a slice of
// it), or, for a job without them, from its River row.
func setPartitionKeys(ctx context.Context, q *db.Queries, kind string, fields []string, reqs []*admitRequest) error {
	var fromDB []int64
	for _, r := range reqs {
		r.key = ""
		if fields == nil {
			continue
		}
		key, ok := partitionKey(r.job.EncodedArgs, fields)
		if !ok {
			fromDB = append(fromDB, r.job.ID)
			continue
		}
		r.key = key
	}
	if len(fromDB) == 0 {
		return nil
	}
	rows, err := q.JobPartitionKeys(ctx, db.JobPartitionKeysParams{Fields: fields, JobIds: fromDB})
	if err != nil {
		return fmt.Errorf("partition keys of %s jobs: %w", kind, err)
	}
	byID := make(map[int64]string, len(rows))
	for _, row := range rows {
		byID[row.JobID] = row.Key
	}
	for _, r := range reqs {
		if k, ok := byID[r.job.ID]; ok {
			r.key = k
		}
	}
	return nil
}

// partitionKey is sluice_partition_key of args (jsonb text): the JSON text
// of the field's value (null when missing), or the array of the values
// for several fields, as jsonb writes it. ok is false when args is not a
// JSON object.
func partitionKey(args []byte, fields []string) (string, bool) {
	if len(args) == 0 {
		return "", false
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(args, &obj); err != nil || obj == nil {
		return "", false
	}
	value := func(f string) string {
		if v, ok := obj[f]; ok {
			return string(v)
		}
		return "null"
	}
	if len(fields) == 1 {
		return value(fields[0]), true
	}
	parts := make([]string, len(fields))
	for i, f := range fields {
		parts[i] = value(f)
	}
	return "[" + strings.Join(parts, ", ") + "]", true
}

// reservationsOf reads which of the jobs ids hold a reservation made when
// they were resumed.
func reservationsOf(ctx context.Context, q *db.Queries, ids []int64) (map[int64]*db.KeyedReservationsRow, error) {
	rows, err := q.KeyedReservations(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("reservations of jobs: %w", err)
	}
	out := make(map[int64]*db.KeyedReservationsRow, len(rows))
	for _, row := range rows {
		out[row.JobID] = row
	}
	return out, nil
}

// readKeyStates reads the state of keys of kind into into.
func readKeyStates(ctx context.Context, q *db.Queries, kind string, keys []string, since time.Time, into map[string]*keyState) error {
	if len(keys) == 0 {
		return nil
	}
	rows, err := q.KeyStates(ctx, db.KeyStatesParams{Kind: kind, Keys: keys, Since: since})
	if err != nil {
		return fmt.Errorf("key states of %s: %w", kind, err)
	}
	for _, row := range rows {
		into[row.Key] = &keyState{slots: row.Slots, waiting: row.Waiting, starts: row.Starts, oldest: fromMicros(row.OldestUs)}
	}
	return nil
}

// startedAt is when the job's execution started: River's attempted_at.
func startedAt(r *admitRequest, now time.Time) time.Time {
	if r.job.AttemptedAt != nil {
		return *r.job.AttemptedAt
	}
	return now
}

func fromMicros(us int64) time.Time {
	if us == 0 {
		return time.Time{}
	}
	return time.UnixMicro(us)
}

// windowFrees is when a full rate window of period frees a start again:
// when its oldest start (not reserved) leaves it, or — every start in it
// reserved, by resumes whose jobs have not started yet — a period from now
// at the latest.
func windowFrees(oldest time.Time, period time.Duration, now time.Time) time.Time {
	if oldest.IsZero() || oldest.After(now) {
		return now.Add(period)
	}
	return oldest.Add(period)
}

// earliestOf returns the earlier of two times, zero meaning none.
func earliestOf(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// resumeKeyed resumes parked jobs of kind (c locked), which has per-key or
// rate limits, into what every limit leaves free: the kind's free slots and
// rate window, and per key its free slots and rate window. Jobs of one key
// resume in job-id order; across keys in rounds, one job per key per turn,
// the keys least recently served first (concurrency_key_turns keeps the
// round in SQL, across workers). Each resumed job gets a reserved slot and
// start, which its admission claims. It asks the rate waker to come back
// when a rate window next frees a start for jobs it could not resume.
func (l *Limiter) resumeKeyed(ctx context.Context, q *db.Queries, kind string, c *kindCounts) (int, error) {
	n, wake, err := l.resumeKeyedInto(ctx, q, kind, c)
	if err != nil {
		return 0, err
	}
	// The kind's flag says whether jobs still wait for the kind itself.
	has, err := q.HasParkedJobs(ctx, kind)
	if err != nil {
		return 0, fmt.Errorf("look for parked %s jobs: %w", kind, err)
	}
	if has != c.hasParked {
		c.hasParked, c.dirty = has, true
	}
	if !wake.IsZero() {
		l.wakes.at(kind, wake)
	}
	return n, nil
}

func (l *Limiter) resumeKeyedInto(ctx context.Context, q *db.Queries, kind string, c *kindCounts) (int, time.Time, error) {
	var wake time.Time
	if c.limit < 0 {
		return 0, wake, nil
	}
	now := time.Now()
	free := int32(MaxResumeBatch)
	if c.limit > 0 {
		free = c.limit - c.taken
	}
	since := now.Add(-c.ratePeriod)
	refill := func(oldest time.Time) time.Time { return windowFrees(oldest, c.ratePeriod, now) }
	kindRate := c.rateMax > 0 && !c.ratePerKey
	var kindLeft int32
	var kindOldest time.Time
	if c.rateMax > 0 {
		rw, err := q.RateWindow(ctx, db.RateWindowParams{Kind: kind, Since: since, Cutoff: now.Add(-c.ratePeriod - time.Second)})
		if err != nil {
			return 0, wake, fmt.Errorf("rate window of %s: %w", kind, err)
		}
		if kindRate {
			kindLeft, kindOldest = c.rateMax-rw.Starts, fromMicros(rw.OldestUs)
			free = min(free, kindLeft)
		}
	}
	if free <= 0 {
		if kindRate && kindLeft <= 0 {
			wake = refill(kindOldest)
		}
		return 0, wake, nil
	}

	var picked []int64
	keyOf := map[int64]string{}
	if c.fields == nil {
		rows, err := q.ResumeParkedJobs(ctx, db.ResumeParkedJobsParams{Kind: kind, MaxRows: free})
		if err != nil {
			return 0, wake, fmt.Errorf("resume parked %s jobs: %w", kind, err)
		}
		if kindRate && int32(len(rows)) >= kindLeft {
			wake = refill(kindOldest) // the window is full again
		}
		return l.reserveResumed(ctx, q, kind, c, rowsOf(rows), keyOf, nil, now, wake)
	}
	perKey := free
	if c.keyMax > 0 {
		perKey = min(perKey, c.keyMax)
	}
	if c.ratePerKey {
		perKey = min(perKey, c.rateMax)
	}
	cands, err := q.ParkedKeyCandidates(ctx, db.ParkedKeyCandidatesParams{Kind: kind, PerKey: perKey})
	if err != nil {
		return 0, wake, fmt.Errorf("parked %s jobs per key: %w", kind, err)
	}
	if len(cands) == 0 {
		return 0, wake, nil
	}
	keys := map[string]*keyState{}
	var list []string
	for _, cand := range cands {
		if _, ok := keys[cand.Key]; !ok {
			keys[cand.Key] = nil
			list = append(list, cand.Key)
		}
	}
	if err := readKeyStates(ctx, q, kind, list, since, keys); err != nil {
		return 0, wake, err
	}
	keyFree := make(map[string]int32, len(keys))
	for key, ks := range keys {
		f := int32(math.MaxInt32)
		if c.keyMax > 0 {
			f = c.keyMax - ks.slots
		}
		if c.ratePerKey {
			f = min(f, c.rateMax-ks.starts)
		}
		keyFree[key] = f
	}
	// The candidates come in rounds (rn), keys least recently served first.
	lastPick := map[string]int{}
	kindFull := false
	for _, cand := range cands {
		if free == 0 {
			kindFull = true
			break
		}
		if cand.Rn > keyFree[cand.Key] {
			continue
		}
		lastPick[cand.Key] = len(picked)
		picked = append(picked, cand.JobID)
		keyOf[cand.JobID] = cand.Key
		keys[cand.Key].starts++
		free--
	}
	// A full rate window holds jobs back: come back when it frees a start.
	if kindRate && (kindFull || int32(len(picked)) >= kindLeft) {
		wake = earliestOf(wake, refill(kindOldest))
	}
	if c.ratePerKey {
		for _, ks := range keys {
			if ks.starts >= c.rateMax {
				wake = earliestOf(wake, refill(ks.oldest))
			}
		}
	}
	// The keys served, in the order of their last turn: the next round
	// starts with those served longest ago.
	served := make([]string, 0, len(lastPick))
	for key := range lastPick {
		served = append(served, key)
	}
	sort.Slice(served, func(i, j int) bool { return lastPick[served[i]] < lastPick[served[j]] })
	if len(picked) == 0 {
		return 0, wake, nil
	}
	rows, err := q.ResumeJobsByID(ctx, picked)
	if err != nil {
		return 0, wake, fmt.Errorf("resume parked %s jobs: %w", kind, err)
	}
	resumed := make([]resumedJob, len(rows))
	for i, row := range rows {
		resumed[i] = resumedJob{id: row.ID, queue: row.Queue}
	}
	return l.reserveResumed(ctx, q, kind, c, resumed, keyOf, served, now, wake)
}

// resumedJob is a job a resume made available again.
type resumedJob struct {
	id    int64
	queue string
}

func rowsOf(rows []*db.ResumeParkedJobsRow) []resumedJob {
	out := make([]resumedJob, len(rows))
	for i, r := range rows {
		out[i] = resumedJob{id: r.ID, queue: r.Queue}
	}
	return out
}

// reserveResumed reserves a slot (when the kind counts slots) and a start
// (when it has a rate) for each resumed job, with its key, records the
// turns of the keys served (in the order served), wakes the River
// producers of the jobs' queues, and returns how many resumed.
func (l *Limiter) reserveResumed(ctx context.Context, q *db.Queries, kind string, c *kindCounts, resumed []resumedJob,
	keyOf map[int64]string, served []string, now time.Time, wake time.Time) (int, time.Time, error) {
	if len(resumed) == 0 {
		return 0, wake, nil
	}
	ids := make([]int64, len(resumed))
	keys := make([]string, len(resumed))
	var queues []string
	for i, r := range resumed {
		ids[i], keys[i] = r.id, keyOf[r.id]
		if !slices.Contains(queues, r.queue) {
			queues = append(queues, r.queue)
		}
	}
	if c.slotted() {
		if err := insertSlots(ctx, q, map[string]*kindCounts{kind: c}, db.InsertConcurrencyExecutionsParams{
			JobIds: ids, Kinds: slices.Repeat([]string{kind}, len(ids)), Keys: keys, Reserved: true,
		}); err != nil {
			return 0, wake, fmt.Errorf("reserve slots for resumed %s jobs: %w", kind, err)
		}
		c.taken += int32(len(ids))
	}
	if c.rateMax > 0 {
		if err := q.InsertConcurrencyStarts(ctx, db.InsertConcurrencyStartsParams{
			Kind: kind, JobIds: ids, Keys: keys, StartedAts: slices.Repeat([]time.Time{now}, len(ids)), Reserved: true,
		}); err != nil {
			return 0, wake, fmt.Errorf("reserve starts for resumed %s jobs: %w", kind, err)
		}
	}
	if c.fields != nil {
		if len(served) > 0 {
			ats := make([]time.Time, len(served))
			for i := range served {
				ats[i] = now.Add(time.Duration(i) * time.Microsecond)
			}
			if err := q.UpsertKeyTurns(ctx, db.UpsertKeyTurnsParams{Kind: kind, Keys: served, ServedAts: ats}); err != nil {
				return 0, wake, fmt.Errorf("record the turns of %s keys: %w", kind, err)
			}
		}
		if err := q.DeleteIdleKeyTurns(ctx, kind); err != nil {
			return 0, wake, fmt.Errorf("forget idle %s keys: %w", kind, err)
		}
	}
	if err := q.NotifyRiverInsert(ctx, queues); err != nil {
		return 0, wake, fmt.Errorf("notify queues of resumed %s jobs: %w", kind, err)
	}
	l.metrics.Resumed.WithLabelValues(kind).Add(float64(len(resumed)))
	return len(resumed), wake, nil
}
