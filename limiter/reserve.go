package limiter

import (
	"context"
	"fmt"

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

// ReserveSlot reserves a slot of kind for the job jobID, as a resume does
// for a parked job, if one is free and no parked job of the kind waits for
// it (they are older: FIFO). The job's admission then takes the reserved
// slot as its own; a reservation whose job never starts is freed by
// concurrency_limit.resume after ReservedSlotTTL. sluice run uses it to
// take a slot as a worker would, without ever parking.
func (l *Limiter) ReserveSlot(ctx context.Context, kind string, jobID int64) (SlotReservation, error) {
	var res SlotReservation
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		q := db.New(tx)
		counts, err := lockKinds(ctx, q, []string{kind})
		if err != nil {
			return err
		}
		c, ok := counts[kind]
		if !ok || (c.limit == 0 && !c.keyed()) {
			return nil
		}
		res = SlotReservation{Needed: true, Limit: c.limit, Taken: c.taken, Parked: c.hasParked}
		if c.keyed() {
			req := &admitRequest{ctx: ctx, job: &rivertype.JobRow{ID: jobID, Kind: kind}}
			held, why, _, err := l.decideKeyed(ctx, q, kind, c, []*admitRequest{req}, true, nil)
			if err != nil {
				return err
			}
			if len(held) > 0 {
				res.Why = why[0]
				return nil
			}
			res.Reserved, res.Taken = true, c.taken
			return saveCounts(ctx, q, counts)
		}
		switch {
		case c.limit < 0:
			res.Why = reasonBreaker
			return nil
		case c.hasParked:
			res.Why = reasonFIFO
			return nil
		case c.taken >= c.limit:
			res.Why = reasonLimit
			return nil
		}
		if err := insertSlots(ctx, q, counts, db.InsertConcurrencyExecutionsParams{
			JobIds: []int64{jobID}, Kinds: []string{kind}, Reserved: true,
		}); err != nil {
			return fmt.Errorf("reserve a slot: %w", err)
		}
		c.taken++
		res.Reserved, res.Taken = true, c.taken
		return saveCounts(ctx, q, counts)
	})
	if err != nil {
		return SlotReservation{}, fmt.Errorf("reserve a %s slot: %w", kind, err)
	}
	return res, nil
}
