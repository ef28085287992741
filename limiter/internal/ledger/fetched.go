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
	// memory decides: for the other workers' leases and for the kind's
	// line it waits until this worker publishes what waits (PublishWaiting),
	// and then as a job published waiting.
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

// Fetching marks tx, a fetch's transaction, as a fetch in flight until it
// ends (before River's statement): LeaseState counts one in flight for
// longer than FetchInFlight as holding jobs fetched at its start.
func (l *Ledger) Fetching(ctx context.Context, tx db.DBTX) error {
	if err := db.New(tx).LedgerFetching(ctx); err != nil {
		return fmt.Errorf("mark the fetch in flight: %w", err)
	}
	return nil
}

// ParkAhead parks, on tx (the transaction of River's fetch, before it),
// the next available jobs of queue, at most scan of limits' kinds looked
// at in River's fetch order, that a decision at their fetch would park
// because their line is long already: at least their kind's WaitCap of
// older jobs of the line are parked (slots: the worker's River slots for
// queue, as WaitCap takes them). Each joins its line, parked, without
// being fetched; the fetch after it reaches the jobs behind them. A kind
// whose limits are being changed (Change) is left to the next fetch (a
// fetch never waits for a change), and a change waits for a parking under
// way. It returns the jobs parked.
func (l *Ledger) ParkAhead(ctx context.Context, tx db.DBTX, queue string, limits map[string]Limits, scan, slots int) ([]int64, error) {
	if len(limits) == 0 {
		return nil, nil
	}
	kinds := make([]string, 0, len(limits))
	for kind := range limits {
		kinds = append(kinds, kind)
	}
	q := db.New(tx)
	// The kinds no change of limits holds or waits for: every change of
	// theirs committed before the pick's snapshot, none runs until the
	// fetch's transaction ends. The others wait for the next fetch.
	free, err := q.LedgerTryLockChanges(ctx, kinds)
	if err != nil {
		return nil, fmt.Errorf("lock out changes of limits: %w", err)
	}
	if len(free) == 0 {
		return nil, nil
	}
	pick := db.LedgerParkAheadPickParams{Queue: queue, MaxJobs: int32(scan)}
	for _, kind := range free {
		pick.Kinds, pick.Caps = append(pick.Kinds, kind), append(pick.Caps, int32(limits[kind].WaitCap(slots)))
	}
	plan, err := q.LedgerPlanIndexes(ctx)
	if err != nil {
		return nil, fmt.Errorf("plan the pick of the jobs behind long lines: %w", err)
	}
	picked, err := q.LedgerParkAheadPick(ctx, pick)
	if err != nil {
		return nil, fmt.Errorf("pick the jobs behind long lines: %w", err)
	}
	if err := q.LedgerPlanRestore(ctx, db.LedgerPlanRestoreParams{Seqscan: plan.Seqscan, Bitmapscan: plan.Bitmapscan}); err != nil {
		return nil, fmt.Errorf("restore the plan settings after the pick: %w", err)
	}
	if len(picked) == 0 {
		return nil, nil
	}
	p := db.LedgerParkAheadParams{WorkerID: l.worker}
	for _, j := range picked {
		p.JobIds, p.Kinds, p.Keys, p.Reasons = append(p.JobIds, j.ID), append(p.Kinds, j.Kind), append(p.Keys, j.Key),
			append(p.Reasons, j.Reason)
	}
	parked, err := q.LedgerParkAhead(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("park the jobs behind long lines: %w", err)
	}
	return parked, nil
}
