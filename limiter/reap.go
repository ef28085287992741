package limiter

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/db"
)

// SlotRelease frees the concurrency slots of a dead worker inside the
// transaction that rescues its jobs, as the Limiter's release does for a job
// that ends: the limit rows of the kinds are locked first (LockSlotsOf, the
// order every admission and release follows, before the reaper locks the
// jobs), and the jobs the worker had waiting in the line are parked (they
// never ran: the rescue's update turns them back into pending jobs with
// their attempts undone); then Release deletes the slot rows, keeps the
// counts of concurrency_limits equal to the rows, and grants the freed
// slots to the kinds' lines.
type SlotRelease struct {
	l        *Limiter
	tx       pgx.Tx
	workerID string
	counts   map[string]*kindCounts
	parked   map[string]int
}

// SlotReleaseResult is what a Release did, per kind.
type SlotReleaseResult struct {
	// Released counts the slots freed: slot rows deleted and leased slots.
	Released map[string]int
	// Resumed counts the parked jobs made available again.
	Resumed map[string]int
	// Parked counts the jobs the worker had waiting, parked again.
	Parked map[string]int
}

// LockSlotsOf starts the release of workerID's slots in tx by locking the
// limit rows of kinds (the kinds of the worker's running jobs and of its
// slot rows: db.Queries.WorkerJobKinds), and parks the jobs the worker had
// waiting for a slot: call it before the worker's jobs are rescued.
func (l *Limiter) LockSlotsOf(ctx context.Context, tx pgx.Tx, workerID string, kinds []string) (*SlotRelease, error) {
	kinds = slices.Clone(kinds)
	slices.Sort(kinds)
	kinds = slices.Compact(kinds)
	q := db.New(db.CustomPlans(tx))
	// A kind without a limit row may be given one meanwhile, counting the
	// slot rows Release deletes: wait for it (in kind order, before the
	// rows, as a release does).
	if err := q.LockLimitRowCreation(ctx, kinds); err != nil {
		return nil, fmt.Errorf("lock limit row creation: %w", err)
	}
	counts, err := lockKinds(ctx, q, kinds)
	if err != nil {
		return nil, err
	}
	parked, err := q.ParkWorkerWaiters(ctx, workerID)
	if err != nil {
		return nil, fmt.Errorf("park the waiting jobs of worker %s: %w", workerID, err)
	}
	r := &SlotRelease{l: l, tx: tx, workerID: workerID, counts: counts, parked: map[string]int{}}
	for _, p := range parked {
		r.parked[p.Kind]++
	}
	return r, nil
}

// Release deletes the slots of jobIDs (the jobs rescued from the worker),
// every other slot recorded for the worker (grants to its waiting jobs
// included) and its leases, and grants the freed slots to the kinds'
// lines, in the same transaction.
// A kind whose slot turns up although it was not locked (not expected: the
// dead worker cannot take slots any more) is locked late.
func (r *SlotRelease) Release(ctx context.Context, jobIDs []int64) (SlotReleaseResult, error) {
	res := SlotReleaseResult{Released: map[string]int{}, Resumed: map[string]int{}, Parked: r.parked}
	q := db.New(db.CustomPlans(r.tx))
	if jobIDs == nil {
		jobIDs = []int64{}
	}
	released, err := q.DeleteWorkerSlots(ctx, db.DeleteWorkerSlotsParams{JobIds: jobIDs, WorkerID: r.workerID})
	if err != nil {
		return res, fmt.Errorf("release slots of worker %s: %w", r.workerID, err)
	}
	leases, err := q.DeleteWorkerLeases(ctx, r.workerID)
	if err != nil {
		return res, fmt.Errorf("release leases of worker %s: %w", r.workerID, err)
	}
	for _, row := range released {
		res.Released[row.Kind]++
	}
	for _, row := range leases {
		if row.Slots > 0 {
			res.Released[row.Kind] += int(row.Slots)
		}
	}
	var late []string
	for kind := range res.Released {
		if _, ok := r.counts[kind]; !ok {
			late = append(late, kind)
		}
	}
	if len(late) > 0 {
		slices.Sort(late)
		more, err := lockKinds(ctx, q, late)
		if err != nil {
			return res, err
		}
		for kind, c := range more {
			r.counts[kind] = c
		}
	}
	for kind, n := range res.Released {
		if c, ok := r.counts[kind]; ok {
			c.taken -= int32(n)
			c.dAdmit -= int32(n)
		}
	}
	kinds := make([]string, 0, len(r.counts))
	for kind := range r.counts {
		kinds = append(kinds, kind)
	}
	slices.Sort(kinds)
	for _, kind := range kinds {
		c := r.counts[kind]
		if c.unlimited() {
			n, err := r.l.letGo(ctx, q, kind)
			if err != nil {
				return res, err
			}
			if n > 0 {
				res.Resumed[kind] = n
			}
			continue
		}
		// The grants go to waiting jobs of live workers, which take them
		// at their next poll, and to parked jobs, resumed.
		g, err := r.l.grantRound(ctx, q, kind, c, nil, nil, nil)
		if err != nil {
			return res, err
		}
		if g.resumed > 0 {
			res.Resumed[kind] = g.resumed
		}
	}
	if err := saveCounts(ctx, q, r.counts); err != nil {
		return res, err
	}
	return res, nil
}
