package limiter

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river/rivertype"

	"github.com/sluice-dev/sluice/db"
)

// SlotReservation is what ReserveSlot found.
type SlotReservation struct {
	// Needed is false when the kind has no limit (no row, or 0): the job
	// runs without a slot.
	Needed bool
	// Reserved is true when a slot is now reserved for the job.
	Reserved bool
	// Limit and Taken describe the kind when no slot was free: its
	// max_concurrency and the slots taken.
	Limit, Taken int32
	// Parked reports that the kind has parked jobs, which go first.
	Parked bool
	// Why says which limit holds the job when no slot was reserved (a park
	// reason: limit, fifo, breaker, rate, key_limit, key_fifo, key_rate).
	Why string
}

// ReserveSlot reserves a slot of kind for the job jobID (and its start,
// under a rate), as a grant does for a parked job, if the job could start
// now: every limit has room and no job waits ahead of it (older jobs of
// its key, jobs waiting for the kind). The job's admission then claims the
// reservation; one whose job never starts is freed by
// concurrency_limit.resume after ReservedSlotTTL. sluice run uses it to
// take a slot as a worker would, without ever waiting in the line.
func (l *Limiter) ReserveSlot(ctx context.Context, kind string, jobID int64) (SlotReservation, error) {
	var res SlotReservation
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		res = SlotReservation{}
		q := db.New(db.CustomPlans(tx))
		counts, err := lockKinds(ctx, q, []string{kind})
		if err != nil {
			return err
		}
		c, ok := counts[kind]
		if !ok || c.unlimited() {
			return nil
		}
		res = SlotReservation{Needed: true, Limit: c.limit, Taken: c.taken, Parked: c.hasParked}
		req := &admitRequest{ctx: ctx, job: &rivertype.JobRow{ID: jobID, Kind: kind}, reserve: true, deadline: time.Now()}
		out := &lineOutcome{wakes: map[string]time.Duration{}, local: map[int64]admission{}}
		recs := map[int64]*db.LineRecordsRow{}
		if _, err := l.decideLine(ctx, q, kind, c, []*admitRequest{req}, recs, out); err != nil {
			return err
		}
		if req.decision == admitRun && req.reason != "" {
			res.Why = req.reason
			return saveCounts(ctx, q, counts)
		}
		res.Reserved, res.Taken = true, c.taken
		return saveCounts(ctx, q, counts)
	})
	if err != nil {
		return SlotReservation{}, fmt.Errorf("reserve a %s slot: %w", kind, err)
	}
	return res, nil
}
