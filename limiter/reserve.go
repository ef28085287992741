package limiter

import (
	"context"
	"fmt"

	"github.com/riverqueue/river/rivertype"

	"github.com/sluice-dev/sluice/limiter/internal/ledger"
)

// SlotReservation is what ReserveSlot found.
type SlotReservation struct {
	// Needed is false when the kind has no limit: the job runs without a
	// slot.
	Needed bool
	// Reserved is true when a slot (or, under a rate alone, a start) is now
	// reserved for the job.
	Reserved bool
	// Limit and Taken describe the kind when no slot was free: its
	// max_concurrency and the slots taken.
	Limit, Taken int32
	// Parked reports that jobs of the kind wait for the kind, which go
	// first.
	Parked bool
	// Why says which limit holds the job when nothing was reserved (a park
	// reason: limit, fifo, breaker, rate, key_limit, key_fifo, key_rate).
	Why string
}

// ReserveSlot reserves what job (inserted, not fetched yet) would take if
// it could start now: a slot of its kind, and its start under a rate, as a
// grant does for a parked job, if every limit has room and no job waits
// ahead of it (older jobs of its key, jobs waiting for the kind). The
// job's decision, when it is fetched, claims the reservation; one whose
// job never starts is freed by concurrency_limit.resume after
// ReservedSlotTTL. sluice run takes a slot so, as a worker would, without
// ever waiting in the line.
func (l *Limiter) ReserveSlot(ctx context.Context, job *rivertype.JobRow) (SlotReservation, error) {
	decided, err := l.ledger.Decide(ctx, []ledger.Job{{ID: job.ID, Kind: job.Kind, Args: job.EncodedArgs, Reserve: true}},
		l.limits.guess(ctx, []string{job.Kind}), l.parkAfter, nil)
	if err != nil {
		return SlotReservation{}, fmt.Errorf("reserve a %s slot: %w", job.Kind, err)
	}
	lim := decided.Limits[job.Kind]
	if lim.Regime() == ledger.Unlimited {
		return SlotReservation{}, nil
	}
	d := decided.Decisions[0]
	res := SlotReservation{Needed: true, Limit: lim.Max, Taken: lim.Admitted, Parked: lim.HasParked}
	switch d.Action {
	case ledger.Run, ledger.Slot:
		res.Reserved = true
		if d.Action == ledger.Slot && lim.Max > 0 {
			res.Taken++
		}
	default:
		res.Why = d.Reason
	}
	return res, nil
}
