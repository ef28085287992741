package ledger

import (
	"context"
	"fmt"

	"github.com/sluice-dev/sluice/db"
)

// SwapOutcome is what Swap did with a held slot.
type SwapOutcome int

const (
	// SwapNone: nothing moved (from holds no slot of this worker's any
	// more: the reaper, a change of limits took it; or to holds one).
	SwapNone SwapOutcome = iota
	// SwapMoved: to holds from's slot, and from waits in the line.
	SwapMoved
	// SwapGaveBack: a job of the line older than to waits elsewhere, so
	// from gave its slot back and waits in the line, as to does: the
	// caller runs a grant round, which gives the slot to the front.
	SwapGaveBack
)

// Swap moves the slot of from (under a rate alone, its start), a job of
// this worker that was granted or admitted one and has not started (held
// back: an older job of its key in this worker was deciding), to to, that
// older job, which its decision put in the line: to starts in its place,
// and from waits in the line in this worker, held for reason. When a job of the line older than to waits
// elsewhere (in the line, parked, or fetched and not decided yet), the
// slot is that job's: from gives it back instead; and so when the kind has
// a rate now and from took its slot with no start (decided before the rate
// was set): to would start on it uncounted. It runs under the
// kind's lock (a grant round never sees to both waiting and holding the
// slot).
func (l *Ledger) Swap(ctx context.Context, kind string, from, to int64, reason string) (SwapOutcome, error) {
	out := SwapNone
	err := l.run(ctx, []lock{{kind: kind}}, func(tx *Tx) error {
		out = SwapNone
		row, err := tx.q.LedgerSwapSlot(tx.ctx, db.LedgerSwapSlotParams{FromID: from, ToID: to, WorkerID: l.worker, Reason: reason})
		switch {
		case err != nil:
			return err
		case row.Swapped:
			out = SwapMoved
		case row.GaveBack:
			out = SwapGaveBack
			if row.FreedSlot {
				tx.counts.addSlots(kind, row.Key, -1)
			}
			tx.counts.setWaiting(kind, row.Key, true)
		}
		return nil
	})
	if err != nil {
		return SwapNone, fmt.Errorf("hand the slot of %s job %d to job %d: %w", kind, from, to, err)
	}
	return out, nil
}
