package ledger

import (
	"context"
	"fmt"

	"github.com/sluice-dev/sluice/db"
)

// Grant is what the line holds for a job waiting in this worker, as
// GrantedTo reads it.
type Grant struct {
	Job int64
	// Slot: it was granted a slot; Start: a start only (a rate alone).
	Slot, Start bool
	// OutOfLine: it is no longer in the line, and holds no grant (its
	// place went: its limits were cleared, or the safety net dropped it).
	OutOfLine bool
	// Behind: it came ahead of a free slot, and an older job of its line
	// (or, under a kind-wide limit with every slot taken, a job of another
	// key) holds a grant and waits to be fetched (it steps back).
	Behind bool
	// Ahead: the line holds it as come ahead of a free slot (its wait has
	// no deadline); a change that sets a rate takes that away.
	Ahead bool
}

// GrantedTo reads what the line holds for jobs ids, waiting in this
// worker (without a lock: a grant, once written, is the job's), one Grant
// each: a look for the grants whose notifications the worker missed.
func (l *Ledger) GrantedTo(ctx context.Context, ids []int64) ([]Grant, error) {
	rows, err := db.New(l.pool).LedgerGrantedTo(ctx, db.LedgerGrantedToParams{WorkerID: l.worker, JobIds: ids})
	if err != nil {
		return nil, fmt.Errorf("look for grants: %w", err)
	}
	out := make([]Grant, 0, len(rows))
	for _, r := range rows {
		out = append(out, Grant{Job: r.JobID, Slot: r.Slot, Start: r.Start && !r.Slot, OutOfLine: r.OutOfLine && !r.Slot && !r.Start,
			Behind: r.Behind && !r.Slot && !r.Start, Ahead: r.Ahead})
	}
	return out, nil
}

// LineLeft reports whether jobs of kind's line still wait (parked, or in a
// worker), in the transaction.
func (tx *Tx) LineLeft(kind string) (bool, error) {
	left, err := tx.q.LedgerLineLeft(tx.ctx, kind)
	if err != nil {
		return false, fmt.Errorf("look at the %s line: %w", kind, err)
	}
	return left, nil
}

// ClaimStarts logs now the starts reserved for jobs ids (granted while
// they waited in a worker), which begin, or logged at their decisions in
// this attempt: outside any lock (a start moved later only makes its
// window end later). It returns the jobs whose starts were there: a
// reserved start taken back before its claim (an older job of its line
// took it, a change did) is not its job's to start on.
func (l *Ledger) ClaimStarts(ctx context.Context, ids []int64) ([]int64, error) {
	claimed, err := db.New(l.pool).LedgerClaimStarts(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("log starts: %w", err)
	}
	return claimed, nil
}
