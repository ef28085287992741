package ledger

import (
	"context"
	"fmt"

	"github.com/sluice-dev/sluice/db"
)

// Swap moves the slot of from, a job of this worker that was granted or
// admitted one and has not started (held back: an older job of its key in
// this worker was deciding), to to, that older job, which its decision put
// in the line: to starts in its place, and from waits in the line in this
// worker, held for reason. It runs under the kind's lock (a grant round
// never sees to both waiting and holding the slot), and reports whether
// the slot moved: not when from holds no slot of this worker's any more
// (the reaper, a change of limits took it), or to holds one.
func (l *Ledger) Swap(ctx context.Context, kind string, from, to int64, reason string) (bool, error) {
	swapped := false
	err := l.run(ctx, []lock{{kind: kind}}, func(tx *Tx) error {
		var err error
		swapped, err = tx.q.LedgerSwapSlot(tx.ctx, db.LedgerSwapSlotParams{FromID: from, ToID: to, WorkerID: l.worker, Reason: reason})
		return err
	})
	if err != nil {
		return false, fmt.Errorf("hand the slot of %s job %d to job %d: %w", kind, from, to, err)
	}
	return swapped, nil
}
