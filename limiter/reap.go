package limiter

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/limiter/internal/ledger"
)

// SlotRelease frees the concurrency slots of a dead worker inside the
// transaction that rescues its jobs, as a release does for a job that
// ends (ledger.Reaping).
type SlotRelease struct {
	r *ledger.Reaping
}

// SlotReleaseResult is what a Release did, per kind.
type SlotReleaseResult = ledger.ReapResult

// LockSlotsOf starts the release of workerID's slots in tx: it takes the
// locks of kinds (the kinds of the worker's running jobs, its slots and
// its leases: db.Queries.WorkerJobKinds), in the order every ledger
// transaction takes them, and parks the jobs the worker had waiting for a
// slot. Call it before the worker's jobs are rescued, then Release.
func (l *Limiter) LockSlotsOf(ctx context.Context, tx pgx.Tx, workerID string, kinds []string) (*SlotRelease, error) {
	r, err := l.ledger.Reap(ctx, tx, workerID, kinds)
	if err != nil {
		return nil, err
	}
	return &SlotRelease{r: r}, nil
}

// Release deletes the slots of jobIDs (the jobs rescued from the worker),
// every other slot recorded for the worker (grants to its waiting jobs
// included) and its leases, and gives the freed room to the front of the
// kinds' lines, in the transaction LockSlotsOf was given (ctx: its
// context).
func (s *SlotRelease) Release(_ context.Context, jobIDs []int64) (SlotReleaseResult, error) {
	return s.r.Release(jobIDs)
}
