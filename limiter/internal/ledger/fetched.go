package ledger

import (
	"context"
	"fmt"

	"github.com/sluice-dev/sluice/db"
)

// Fetched is a job of a limited kind that this worker fetched and has not
// decided yet, with its key (from its args, by its kind's partition; ""
// without one).
type Fetched struct {
	ID   int64
	Kind string
	Key  string
	// Leased: a first attempt on the leased path, which the worker's
	// memory decides: for the other workers' leases it waits until this
	// worker publishes what waits (PublishWaiting).
	Leased bool
}

// MarkFetched marks jobs this worker fetched and has not decided yet, on
// tx: the transaction of River's fetch, so that the jobs are never seen
// running without the mark. Until the job's decision (Decide) deletes it,
// no decision or grant round of any worker lets a younger job of its line
// start; a mark older than two seconds holds nothing up (its worker died,
// or decided it without the ledger).
func (l *Ledger) MarkFetched(ctx context.Context, tx db.DBTX, jobs []Fetched) error {
	if len(jobs) == 0 {
		return nil
	}
	p := db.LedgerMarkFetchedParams{WorkerID: l.worker}
	for _, j := range jobs {
		p.JobIds, p.Kinds, p.Keys, p.Leaseds = append(p.JobIds, j.ID), append(p.Kinds, j.Kind), append(p.Keys, j.Key),
			append(p.Leaseds, j.Leased)
	}
	if err := db.New(tx).LedgerMarkFetched(ctx, p); err != nil {
		return fmt.Errorf("mark fetched jobs: %w", err)
	}
	return nil
}
