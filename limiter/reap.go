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
// jobs), then Release deletes the slot rows, keeps the counts of
// concurrency_limits equal to the rows, and resumes parked jobs of the kinds
// into the freed slots.
type SlotRelease struct {
	l        *Limiter
	tx       pgx.Tx
	workerID string
	counts   map[string]*kindCounts
}

// SlotReleaseResult is what a Release did, per kind.
type SlotReleaseResult struct {
	// Released counts the slots freed: slot rows deleted and leased slots.
	Released map[string]int
	// Resumed counts the parked jobs made available again.
	Resumed map[string]int
}

// LockSlotsOf starts the release of workerID's slots in tx by locking the
// limit rows of kinds: the kinds of the worker's running jobs and of its
// slot rows (db.Queries.WorkerJobKinds).
func (l *Limiter) LockSlotsOf(ctx context.Context, tx pgx.Tx, workerID string, kinds []string) (*SlotRelease, error) {
	kinds = slices.Clone(kinds)
	slices.Sort(kinds)
	kinds = slices.Compact(kinds)
	counts, err := lockKinds(ctx, db.New(tx), kinds)
	if err != nil {
		return nil, err
	}
	return &SlotRelease{l: l, tx: tx, workerID: workerID, counts: counts}, nil
}

// Release deletes the slots of jobIDs (the jobs rescued from the worker),
// every other slot recorded for the worker and its leases, and resumes
// parked jobs of their kinds into the freed slots, in the same transaction.
// A kind whose slot turns up although it was not locked (not expected: the
// dead worker cannot take slots any more) is locked late.
func (r *SlotRelease) Release(ctx context.Context, jobIDs []int64) (SlotReleaseResult, error) {
	res := SlotReleaseResult{Released: map[string]int{}, Resumed: map[string]int{}}
	q := db.New(r.tx)
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
		n, err := r.l.resumeInto(ctx, q, kind, r.counts[kind])
		if err != nil {
			return res, err
		}
		if n > 0 {
			res.Resumed[kind] = n
		}
	}
	if err := saveCounts(ctx, q, r.counts); err != nil {
		return res, err
	}
	return res, nil
}
