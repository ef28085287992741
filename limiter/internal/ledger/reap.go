package ledger

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/pgkit"
)

// Reaping is the release of a dead worker's slots in the reaper's own
// transaction (which rescues the worker's jobs), as a release frees the
// slots of jobs that end.
type Reaping struct {
	tx     *Tx
	worker string
	kinds  []string
	parked map[string]int
}

// ReapResult is what a reaping did, per kind.
type ReapResult struct {
	// Released counts the slots freed: slot rows deleted and leased slots.
	Released map[string]int
	// Resumed counts the parked jobs made available again.
	Resumed map[string]int
	// Parked counts the jobs the worker had waiting, parked again.
	Parked map[string]int
}

// Reap starts the release of worker's slots in ptx, before its jobs are
// rescued: it takes the locks of kinds (the kinds of its running jobs, its
// slots and its leases), exclusive and in kind order, the order every
// ledger transaction takes them before it touches a job; and parks the
// jobs the worker had waiting for a slot: they never ran, and the rescue's
// update turns each back into a pending job with its attempt undone.
func (l *Ledger) Reap(ctx context.Context, ptx pgx.Tx, worker string, kinds []string) (*Reaping, error) {
	kinds = slices.Clone(kinds)
	slices.Sort(kinds)
	kinds = slices.Compact(kinds)
	// Its grants are noted to every worker, this one included: they are
	// told once the reaper's transaction commits.
	tx := &Tx{ctx: ctx, q: db.New(pgkit.CustomPlans(ptx)), pgx: ptx, l: &Ledger{pool: l.pool, logger: l.logger}}
	locks := make([]lock, len(kinds))
	for i, k := range kinds {
		locks[i] = lock{kind: k}
	}
	if err := tx.lock(locks); err != nil {
		return nil, err
	}
	parked, err := tx.q.ParkWorkerWaiters(ctx, worker)
	if err != nil {
		return nil, fmt.Errorf("park the waiting jobs of worker %s: %w", worker, err)
	}
	r := &Reaping{tx: tx, worker: worker, kinds: kinds, parked: map[string]int{}}
	for _, p := range parked {
		r.parked[p.Kind]++
	}
	return r, nil
}

// Release deletes the slots of jobIDs (the jobs rescued from the worker),
// every other slot recorded for the worker (grants to its waiting jobs
// included) and its leases; recounts the kinds, and gives the room to the
// front of their lines (the grants go to waiting jobs of live workers, and
// to parked jobs, resumed).
func (r *Reaping) Release(jobIDs []int64) (ReapResult, error) {
	tx := r.tx
	res := ReapResult{Released: map[string]int{}, Resumed: map[string]int{}, Parked: r.parked}
	if jobIDs == nil {
		jobIDs = []int64{}
	}
	released, err := tx.q.DeleteWorkerSlots(tx.ctx, db.DeleteWorkerSlotsParams{JobIds: jobIDs, WorkerID: r.worker})
	if err != nil {
		return res, fmt.Errorf("release slots of worker %s: %w", r.worker, err)
	}
	leases, err := tx.q.DeleteWorkerLeases(tx.ctx, r.worker)
	if err != nil {
		return res, fmt.Errorf("release leases of worker %s: %w", r.worker, err)
	}
	for _, row := range released {
		res.Released[row.Kind]++
	}
	for _, row := range leases {
		if row.Slots > 0 {
			res.Released[row.Kind] += int(row.Slots)
		}
	}
	for kind := range res.Released {
		if !slices.Contains(r.kinds, kind) {
			// Not expected (a dead worker takes no slot any more): the
			// counts of a kind not locked are left to the safety net.
			tx.l.logger.Warn("reaper: a slot of a kind not locked; the safety net recounts it", "kind", kind, "worker_id", r.worker)
		}
	}
	for _, kind := range r.kinds {
		lims, err := tx.readLimits([]string{kind})
		if err != nil {
			return res, err
		}
		if lims[kind].Regime() == Unlimited {
			n, err := tx.liftLimits(kind)
			res.Resumed[kind] += n
			if err != nil {
				return res, err
			}
			continue
		}
		g, err := tx.settle(kind)
		if err != nil {
			return res, err
		}
		res.Resumed[kind] += g.Resumed[kind]
	}
	if err := tx.counts.save(tx.ctx, tx.q); err != nil {
		return res, err
	}
	return res, nil
}
