package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/db"
)

// LeaseState is a leased kind as a worker holding or wanting its slots
// sees it (read without a lock).
type LeaseState struct {
	// Present is false when the kind has no limit row (its leases went
	// with it).
	Present bool
	// Max is the kind's per-kind limit; Admitted its slots taken.
	Max, Admitted int32
	// OffPath: jobs of the kind's line wait, slots are reserved for resumed
	// jobs, or it has a per-key or rate limit: its jobs go through the line.
	OffPath bool
	// Keyed: it has a per-key or rate limit (no slot of its line is handed
	// over in memory).
	Keyed bool
	// Own is the slots this worker's lease holds.
	Own int32
	// Others is how many other workers hold slots of the kind or want some.
	Others int32
	// OldestOther is when the oldest job waiting in another worker for a
	// leased slot, or fetched there and not decided yet, was fetched
	// (zero: none). A fetch of another connection in flight for longer
	// than the ledger's FetchInFlight counts from its start: the jobs it
	// marks show only from its commit, and it may hold jobs fetched well
	// before a younger one here (torture seed 530070960).
	OldestOther time.Time
	// OldestParked, OldestReserved and OldestResumed are the kind's oldest
	// parked job, its oldest job granted a slot it has not claimed yet, and
	// its oldest job resumed ahead and not fetched yet (0: none): they go
	// before any younger job.
	OldestParked, OldestReserved, OldestResumed int64
	// OldestOtherLine is when the oldest job of the kind's line in another
	// worker (waiting in the line there, waiting for a leased slot, or
	// fetched and not decided yet) was fetched (zero: none): it goes before
	// a job fetched more than the fetch tolerance after it.
	OldestOtherLine time.Time
}

// noneWaiting is what LedgerLeaseState says when no job waits in another
// worker.
var noneWaiting = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

// LeaseState reads kind's state for a lease holder.
func (l *Ledger) LeaseState(ctx context.Context, kind string, wantedWindow time.Duration) (LeaseState, error) {
	return l.LeaseStateOn(ctx, l.pool, kind, wantedWindow)
}

// LeaseStateOn reads kind's state for a lease holder on conn (a fetch's
// transaction: the state as the fetch leaves it).
func (l *Ledger) LeaseStateOn(ctx context.Context, conn db.DBTX, kind string, wantedWindow time.Duration) (LeaseState, error) {
	row, err := db.New(conn).LedgerLeaseState(ctx, db.LedgerLeaseStateParams{Kind: kind, WorkerID: l.worker,
		WantedWindowMs: wantedWindow.Milliseconds(), InFlightMs: l.inFlight.Milliseconds()})
	if errors.Is(err, pgx.ErrNoRows) {
		return LeaseState{}, nil
	}
	if err != nil {
		return LeaseState{}, fmt.Errorf("lease state of %s: %w", kind, err)
	}
	st := LeaseState{Present: true, Max: row.MaxConcurrency, Admitted: row.Admitted, OffPath: row.OffPath, Keyed: row.Keyed, Own: row.Own,
		Others: row.Others, OldestParked: row.OldestParked, OldestReserved: row.OldestReserved, OldestResumed: row.OldestResumed}
	if row.OldestOther.Before(noneWaiting) {
		st.OldestOther = row.OldestOther
	}
	st.OldestOtherLine = st.OldestOther
	if w := row.OldestOtherWaiter; w.Before(noneWaiting) && (st.OldestOtherLine.IsZero() || w.Before(st.OldestOtherLine)) {
		st.OldestOtherLine = w
	}
	return st, nil
}

// Lease leases up to want more slots of kind to this worker, under the
// kind's lock, and returns how many it got, the kind's limit, and whether
// the kind is off the leased path (then it gets none).
func (l *Ledger) Lease(ctx context.Context, kind string, want int32) (granted, limit int32, offPath bool, err error) {
	err = l.run(ctx, []lock{{kind: kind}}, func(tx *Tx) error {
		row, err := tx.q.LedgerLease(tx.ctx, db.LedgerLeaseParams{Kind: kind, WorkerID: l.worker, Want: want})
		if errors.Is(err, pgx.ErrNoRows) {
			granted, limit, offPath = 0, 0, true // no limit row
			return nil
		}
		if err != nil {
			return err
		}
		granted, limit, offPath = row.Granted, row.MaxConcurrency, row.OffPath
		return nil
	})
	if err != nil {
		return 0, 0, false, fmt.Errorf("lease %d %s slots: %w", want, kind, err)
	}
	return granted, limit, offPath, nil
}

// ReturnLease gives back n leased slots of kind, under the kind's lock,
// and gives the room to the front of the kind's line when jobs wait there
// (a grant round, which reads the whole line).
func (l *Ledger) ReturnLease(ctx context.Context, kind string, n int32) (*Granted, error) {
	var out *Granted
	err := l.run(ctx, []lock{{kind: kind}}, func(tx *Tx) error {
		if _, err := tx.q.LedgerReturnLease(tx.ctx, db.LedgerReturnLeaseParams{Kind: kind, WorkerID: l.worker, N: n}); err != nil {
			return err
		}
		var err error
		out, err = tx.grantKinds([]lock{{kind: kind}}, nil, []string{kind}, nil, []string{kind}, nil, maxTurnKeys)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("give back %d %s slots: %w", n, kind, err)
	}
	return out, nil
}

// RenewLease marks this worker's lease of kind alive and returns the slots
// the database counts for it (0 when the lease is gone: expired, or its
// limit removed).
func (l *Ledger) RenewLease(ctx context.Context, kind string) (int32, error) {
	held, err := db.New(l.pool).RenewLease(ctx, db.RenewLeaseParams{WorkerID: l.worker, Kind: kind})
	if err != nil {
		return 0, fmt.Errorf("renew the %s lease: %w", kind, err)
	}
	return held, nil
}

// PublishWaiting writes the jobs waiting in this worker for a leased slot
// of kind to its lease row (for SQL, waiting_jobs; and for the other
// holders, which let older jobs go first), and deletes the leased fetch
// marks of unmark (jobs fetched since the last publication: those still
// waiting are published now).
func (l *Ledger) PublishWaiting(ctx context.Context, kind string, ids, unmark []int64) error {
	if ids == nil {
		ids = []int64{}
	}
	if unmark == nil {
		unmark = []int64{}
	}
	if err := db.New(l.pool).SetLeaseWaiting(ctx, db.SetLeaseWaitingParams{Kind: kind, WorkerID: l.worker, JobIds: ids,
		UnmarkIds: unmark}); err != nil {
		return fmt.Errorf("publish the jobs waiting for %s slots: %w", kind, err)
	}
	return nil
}
