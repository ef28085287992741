package limiter

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/sluice-dev/sluice/db"
)

// releaseBatch writes, in one transaction that locks the kinds' limit rows
// first, the slots handed over in memory (handover.go), frees the slots of
// jobs that ended and of jobs that gave up waiting (ReleaseJobs), and runs
// a grant round for each kind that has free room and jobs in its line (or,
// for a kind whose slots were handed over, tops up its lookahead); the
// grants it claimed for jobs waiting in this worker wake them once it
// committed. A request without a job (a recheck after a parking, a rate
// window freeing a start) only runs the grant round. A kind whose limit row
// is gone lets its line go. When the transaction fails (the database is
// unreachable), the kinds are cleaned up again in the background
// (retryRelease).
//
// Locking first matters: a statement that waits for a row lock still reads
// the snapshot it started with, so a grant that committed meanwhile (a slot
// reserved for a job that just gave up waiting, or that was handed a slot)
// would be missed and stay taken.
func (l *Limiter) releaseBatch(batch []*releaseRequest) {
	p := db.ReleaseJobsParams{
		Kinds:     distinctKinds(len(batch), func(i int) string { return batch[i].kind }),
		JobIds:    []int64{},
		ForgetIds: []int64{},
		WorkerID:  l.workerID,
	}
	var chain handOverChain
	var handKinds []string
	var handedIDs []int64
	for _, r := range batch {
		switch {
		case r.job == nil:
		case r.to != nil:
			chain.add(r.job.ID, r.to.ID)
			handedIDs = append(handedIDs, r.to.ID)
			if !slices.Contains(handKinds, r.kind) {
				handKinds = append(handKinds, r.kind)
			}
		case r.forget:
			p.ForgetIds = append(p.ForgetIds, r.job.ID)
		default:
			id, handed := chain.release(r.job.ID)
			p.JobIds = append(p.JobIds, id)
			if handed {
				// It held a slot handed over in this batch: the slot's own
				// row goes, and it leaves the waiters.
				p.ForgetIds = append(p.ForgetIds, r.job.ID)
			}
		}
	}
	// Jobs that held a handed-over slot and handed it on leave the waiters.
	p.ForgetIds = append(p.ForgetIds, chain.ended...)
	var local map[int64]admission
	var wakes map[string]time.Duration
	err := l.withBatchTx(batch[0].ctx, func(ctx context.Context, q *db.Queries) error {
		// A kind without a limit row (its limits were cleared) may be
		// given one meanwhile, counting the slots this batch frees: wait
		// for it (LockLimitRowCreation, for every kind: which have a row
		// is not known before the rows are locked), so that the release
		// lowers it. Then the rows are locked, by a statement of their own
		// (see above). Both travel with the release (db.Pipeline).
		l.prefetchReleaseFront(q, batch, p, len(chain.holder) > 0)
		if err := q.LockLimitRowCreation(ctx, p.Kinds); err != nil {
			return fmt.Errorf("lock limit row creation: %w", err)
		}
		if err := q.LockLimitRows(ctx, p.Kinds); err != nil {
			return fmt.Errorf("lock limits: %w", err)
		}
		if len(chain.holder) > 0 {
			h := db.HandOverSlotsParams{WorkerID: l.workerID}
			for from, to := range chain.holder {
				h.FromIds, h.ToIds = append(h.FromIds, from), append(h.ToIds, to)
			}
			if _, err := q.HandOverSlots(ctx, h); err != nil {
				return fmt.Errorf("write slots handed over: %w", err)
			}
		}
		rows, err := q.ReleaseJobs(ctx, p)
		if err != nil {
			return fmt.Errorf("release slots: %w", err)
		}
		// The kinds' limits and counts, locked, as the release left them.
		counts := make(map[string]*kindCounts, len(rows))
		for _, row := range rows {
			counts[row.Kind] = newKindCounts(row.MaxConcurrency, row.Admitted, row.HasParked, row.PartitionFields,
				row.KeyMax, row.RateMax, row.RatePeriodMs, row.RatePerKey)
			l.seen.set(row.Kind, counts[row.Kind])
		}
		turnover := map[string][]string{}
		for _, kind := range handKinds {
			// The lookahead follows the slots that turn over.
			turnover[kind] = []string{""}
		}
		var grantKinds []string
		limited := map[string]bool{}
		for _, row := range rows {
			limited[row.Kind] = true
			if len(row.FreedKeys) > 0 || turnover[row.Kind] == nil {
				turnover[row.Kind] = row.FreedKeys
			}
			if row.MaxConcurrency == 0 && !row.Keyed && !row.AnyWaiting && row.Admitted == 0 {
				// Its limits were cleared while jobs of it held slots: the
				// last one gone, so goes the row.
				if _, err := q.DeleteEmptyLimit(ctx, row.Kind); err != nil {
					return fmt.Errorf("remove the limit row: %w", err)
				}
				continue
			}
			free := row.MaxConcurrency >= 0 && (row.MaxConcurrency == 0 || row.Admitted < row.MaxConcurrency)
			switch {
			case (free || slices.Contains(handKinds, row.Kind)) && row.AnyWaiting:
				// Room to grant; or slots handed over, the lookahead to top up.
				grantKinds = append(grantKinds, row.Kind)
			case (row.HasParked || row.HasTurns) && !row.AnyWaiting:
				// The line emptied (its last jobs took slots handed over, or
				// claimed their grants after the round that gave them): the
				// round clears the kind's flag and forgets the keys' turns,
				// reading every key that has one.
				grantKinds = append(grantKinds, row.Kind)
				turnover[row.Kind] = nil
			}
		}
		// A recheck of a kind whose limit row is gone (an operator deleted
		// it): whatever it held goes.
		for _, r := range batch {
			if r.job == nil && !limited[r.kind] && !slices.Contains(grantKinds, r.kind) {
				grantKinds = append(grantKinds, r.kind)
			}
		}
		if len(grantKinds) == 0 {
			return nil
		}
		sort.Strings(grantKinds)
		local, wakes, err = l.grantKinds(ctx, q, grantKinds, counts, turnover)
		return err
	})
	l.waits.written(handedIDs)
	if err != nil {
		l.logger.Error("concurrency slots not released; retrying", "error", err)
		ids := append(p.JobIds, p.ForgetIds...)
		for origin := range chain.holder {
			ids = append(ids, origin)
		}
		l.retryRelease(p.Kinds, ids)
		return
	}
	l.waits.grant(local)
	for kind, d := range wakes {
		l.wakes.after(kind, d)
	}
}

// grantKinds runs a grant round for each of kinds (sorted) in the
// transaction of q (counts: the kinds' limit rows, locked; turnover: the keys whose slots the release freed, per
// kind), or lets the line of a kind without limits go, and returns the
// grants claimed for jobs waiting in this worker and when rate windows
// next free a start.
func (l *Limiter) grantKinds(ctx context.Context, q *db.Queries, kinds []string, counts map[string]*kindCounts,
	turnover map[string][]string) (map[int64]admission, map[string]time.Duration, error) {
	local, wakes := map[int64]admission{}, map[string]time.Duration{}
	for _, kind := range kinds {
		c, ok := counts[kind]
		if !ok || c.unlimited() {
			if _, err := l.letGo(ctx, q, kind); err != nil {
				return nil, nil, err
			}
			if ok {
				c.setHasParked(false)
				if _, err := q.DeleteEmptyLimit(ctx, kind); err != nil {
					return nil, nil, fmt.Errorf("remove the limit row: %w", err)
				}
			}
			continue
		}
		// A recheck frees no slot: its round reads every key.
		within := turnover[kind]
		if len(within) == 0 {
			within = nil
		}
		res, err := l.grantRound(ctx, q, kind, c, nil, turnover[kind], within)
		if err != nil {
			return nil, nil, err
		}
		for id, d := range res.local {
			local[id] = d
		}
		if res.wakeIn > 0 {
			wakes[kind] = res.wakeIn
		}
	}
	return local, wakes, saveCounts(ctx, q, counts)
}
