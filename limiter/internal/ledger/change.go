package ledger

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/sluice-dev/sluice/db"
)

// MaxResumeBatch caps how many parked jobs one transaction resumes when a
// kind has no limit left.
const MaxResumeBatch = 5000

// RecheckHold is how long after a change of limits a running job that
// holds less than the new limits ask holds its line, as a job fetched and
// not decided does (LedgerMarkRechecks): its worker decides it again
// before it begins, within a moment of hearing of the change, and no
// younger job of its line takes the new room meanwhile. A job that began
// already (its worker leaves it be) holds its line no longer than this.
const RecheckHold = 250 * time.Millisecond

// Change changes kind's limits in one transaction that holds the kind's
// lock, exclusive: edit writes them (the caller's part: the row, its
// sources, the declarations); the ledger then ends the waits without a
// deadline of the jobs resumed ahead when a rate is set where there was
// none (LedgerEndAheadWaits), sets the keys of the kind's
// slots and waiting jobs again when the partition changed (and takes back
// every grant not claimed yet: it was given in the old lines' order), marks
// the running jobs that hold less than the new limits ask as fetched and not
// decided for RecheckHold (their workers decide them again before they
// begin: the round below passes none of their lines' younger jobs ahead of
// them; where the kind had no limit, every job of it fetched within the
// marks' two seconds that holds nothing), and, with no
// limit left, lets every job of the line go (its leases, reservations and
// row go with it); else it takes back the grants not claimed yet that the
// new limits no longer allow, recounts, and gives the room to the front of
// the line, over every key (the resume rule: only what the new limits let
// start, each with a slot reserved). then runs last, with the limits in
// force (the caller schedules the safety net). The transaction is a plain
// one (Tx.Pgx), for River's InsertTx.
func (l *Ledger) Change(ctx context.Context, kind string, edit func(tx *Tx) error, then func(tx *Tx, lim Limits) error) (*Granted, error) {
	var out *Granted
	err := l.runOn(ctx, []lock{{kind: kind}}, true, func(tx *Tx) error {
		// No fetch parks jobs behind the kind's lines meanwhile (ParkAhead).
		if err := tx.q.LedgerLockChange(tx.ctx, kind); err != nil {
			return fmt.Errorf("lock out parkings ahead: %w", err)
		}
		before, err := tx.readLimits([]string{kind})
		if err != nil {
			return err
		}
		if err := edit(tx); err != nil {
			return err
		}
		after, err := tx.readLimits([]string{kind})
		if err != nil {
			return err
		}
		c := after[kind]
		if before[kind].Regime() == Leased && c.Regime() != Leased {
			// The jobs waiting for a leased slot go to the line, each decided
			// by its worker once it hears of the change: until then they are
			// older jobs fetched and not decided, for every worker.
			if err := tx.q.LedgerUnleaseFetches(tx.ctx, kind); err != nil {
				return fmt.Errorf("mark the jobs waiting for leased slots: %w", err)
			}
		}
		if before[kind].RateMax == 0 && c.RateMax > 0 {
			if err := tx.q.LedgerEndAheadWaits(tx.ctx, kind); err != nil {
				return fmt.Errorf("end the waits of jobs resumed ahead: %w", err)
			}
		}
		if !slices.Equal(before[kind].Fields, c.Fields) {
			if err := tx.q.LedgerRepartition(tx.ctx, kind); err != nil {
				return fmt.Errorf("set the keys of waiting jobs: %w", err)
			}
			// Grants not claimed yet were given in the old lines' order: they
			// go back, and the round below gives the room in the new order.
			if _, err := tx.q.LedgerRevokeAllGrants(tx.ctx, kind); err != nil {
				return fmt.Errorf("take back grants: %w", err)
			}
		}
		if c.Regime() != Unlimited && c.Max >= 0 {
			if err := tx.q.LedgerMarkRechecks(tx.ctx, db.LedgerMarkRechecksParams{Kind: kind, HoldMs: RecheckHold.Milliseconds(),
				WasUnlimited: before[kind].Regime() == Unlimited}); err != nil {
				return fmt.Errorf("mark the jobs decided again: %w", err)
			}
		}
		if c.Regime() == Unlimited {
			out = newGranted()
			n, err := tx.liftLimits(kind)
			out.Resumed[kind] = n
			if err != nil {
				return err
			}
		} else if out, err = tx.settle(kind); err != nil {
			return err
		}
		if then != nil {
			return then(tx, c)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// settle recounts kind (under its exclusive lock), takes back the grants
// not claimed yet that its limits no longer allow, of the kind and of each
// key, slots and starts (their jobs wait in the line again), and runs a
// grant round over its whole line.
func (tx *Tx) settle(kind string) (*Granted, error) {
	if err := tx.q.LedgerRecount(tx.ctx, kind); err != nil {
		return nil, fmt.Errorf("recount: %w", err)
	}
	lims, err := tx.readLimits([]string{kind})
	if err != nil {
		return nil, err
	}
	c := lims[kind]
	excess := int32(0)
	switch {
	case c.Max < 0:
		excess = c.Admitted
	case c.Max > 0 && c.Admitted > c.Max:
		excess = c.Admitted - c.Max
	}
	revoked := 0
	if excess > 0 {
		ids, err := tx.q.RevokeGrants(tx.ctx, revokeParams(kind, excess))
		if err != nil {
			return nil, fmt.Errorf("take back grants: %w", err)
		}
		revoked += len(ids)
	}
	if c.KeyMax > 0 {
		ids, err := tx.q.LedgerRevokeKeyGrants(tx.ctx, db.LedgerRevokeKeyGrantsParams{Kind: kind, KeyMax: c.KeyMax})
		if err != nil {
			return nil, fmt.Errorf("take back grants of keys: %w", err)
		}
		revoked += len(ids)
	}
	if c.RateMax > 0 {
		ids, err := tx.q.LedgerRevokeRateGrants(tx.ctx, kind)
		if err != nil {
			return nil, fmt.Errorf("take back starts beyond the rate: %w", err)
		}
		revoked += len(ids)
	}
	if revoked > 0 {
		if err := tx.q.LedgerRecount(tx.ctx, kind); err != nil {
			return nil, fmt.Errorf("recount: %w", err)
		}
	}
	return tx.grantKinds([]lock{{kind: kind}}, nil, []string{kind}, nil, []string{kind}, nil, maxTurnKeys)
}

// liftLimits lets every job of kind's line go, its limits gone (under its
// exclusive lock): parked jobs become available (oldest first,
// MaxResumeBatch at a time), its waiters leave the line, its leases and
// reservations go (workers find them gone and stop using them), and its
// row goes once nothing of the kind is held (slot rows of running jobs keep
// it, limitless, until they end). It returns how many it resumed.
func (tx *Tx) liftLimits(kind string) (int, error) {
	total := 0
	for {
		row, err := tx.q.LedgerLetGo(tx.ctx, letGoParams(kind))
		if err != nil {
			return total, fmt.Errorf("let the %s line go: %w", kind, err)
		}
		total += int(row.Resumed)
		if row.Resumed < MaxResumeBatch {
			break
		}
	}
	for _, step := range []struct {
		what string
		fn   func() error
	}{
		{"drop the leases", func() error { return tx.q.DeleteLimitLeases(tx.ctx, kind) }},
		{"drop the reserved starts", func() error { return tx.q.DeleteReservedStarts(tx.ctx, kind) }},
		{"drop the reserved slots", func() error { return tx.q.DeleteReservedSlots(tx.ctx, kind) }},
		{"recount", func() error { return tx.q.LedgerRecount(tx.ctx, kind) }},
		{"remove the limit row", func() error { _, err := tx.q.DeleteEmptyLimit(tx.ctx, kind); return err }},
	} {
		if err := step.fn(); err != nil {
			return total, fmt.Errorf("%s of %s: %w", step.what, kind, err)
		}
	}
	return total, nil
}

func revokeParams(kind string, n int32) db.RevokeGrantsParams {
	return db.RevokeGrantsParams{Kind: kind, N: n}
}

func letGoParams(kind string) db.LedgerLetGoParams {
	return db.LedgerLetGoParams{Kind: kind, MaxRows: MaxResumeBatch}
}
