package ledger

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/sluice-dev/sluice/db"
)

// CleanUp is the safety net's work on kind (concurrency_limit.resume, and
// a worker after a failed release), in one transaction that holds the
// kind's lock, exclusive: it frees the slots of jobs no longer running
// (a worker's slot when an earlier run, staleGrace before at least, found
// it so too: the worker may be handing it over; and grants whose job was
// cancelled, deleted, or not fetched within reservedTTL), the leases not renewed within leaseTTL whose holder is not
// a live worker, stale starts, fetch marks no decision reads, and
// waiters whose job no longer waits;
// gives rows left without a key theirs; recounts; and gives the free room
// to the front of the line (a kind without limits lets its line go, and
// loses its row once nothing of it is left). It returns how many jobs it
// resumed, whether jobs remain in the line (never under a circuit breaker), and its grants; who names the
// caller in the log lines.
func (l *Ledger) CleanUp(ctx context.Context, kind string, reservedTTL, staleGrace, leaseTTL time.Duration,
	who string) (resumed int, remaining bool, out *Granted, err error) {
	logger := l.logger.With("kind", kind)
	err = l.run(ctx, []lock{{kind: kind}}, func(tx *Tx) error {
		resumed, remaining = 0, false
		before, err := tx.readLimits([]string{kind})
		if err != nil {
			return err
		}
		c := before[kind]
		if err := tx.dropStale(kind, c, reservedTTL, staleGrace, leaseTTL, logger, who); err != nil {
			return err
		}
		if c.Keyed() {
			if err := tx.q.LedgerBackfillKeys(tx.ctx, kind); err != nil {
				return fmt.Errorf("backfill partition keys: %w", err)
			}
		}
		switch c.Regime() {
		case Unlimited:
			if resumed, err = tx.liftLimits(kind); err != nil {
				return err
			}
			out = newGranted()
		case Breaker:
			// Nothing resumes until the breaker is lifted, which grants what
			// the new limit lets start.
			if err := tx.q.LedgerRecount(tx.ctx, kind); err != nil {
				return fmt.Errorf("recount: %w", err)
			}
			logger.Info(who+": circuit breaker is on; nothing resumed", "limit", c.Max)
			out = newGranted()
			return nil // nothing to come back for: lifting the breaker grants what it lets start
		default:
			if out, err = tx.settle(kind); err != nil {
				return err
			}
			resumed = out.Resumed[kind]
		}
		if resumed > 0 {
			logger.Info(who, "resumed", resumed, "limit", c.Max)
		}
		remaining, err = tx.q.LedgerLineLeft(tx.ctx, kind)
		if err != nil {
			return fmt.Errorf("look at the line: %w", err)
		}
		return nil
	})
	if err != nil {
		return 0, false, nil, fmt.Errorf("clean up %s: %w", kind, err)
	}
	return resumed, remaining, out, nil
}

// dropStale deletes, under kind's lock (its limits c), what the ledger
// keeps for jobs and workers gone: slots of jobs no longer running (or
// granted and not started within reservedTTL), expired leases, starts out
// of the rate's window, fetch marks, waiters whose jobs no longer wait.
func (tx *Tx) dropStale(kind string, c Limits, reservedTTL, staleGrace, leaseTTL time.Duration, logger *slog.Logger, who string) error {
	stale, err := tx.q.DeleteStaleConcurrencyExecutions(tx.ctx, db.DeleteStaleConcurrencyExecutionsParams{
		Kind: kind, ReservedTtlMs: reservedTTL.Milliseconds(), StaleGraceMs: staleGrace.Milliseconds()})
	if err != nil {
		return fmt.Errorf("clean up stale slots: %w", err)
	}
	if len(stale) > 0 {
		logger.Warn(who+": freed slots of jobs no longer running, or granted and not started", "job_ids", stale)
	}
	expired, err := tx.q.DeleteStaleLeases(tx.ctx, db.DeleteStaleLeasesParams{Kind: kind, TtlMs: leaseTTL.Milliseconds()})
	if err != nil {
		return fmt.Errorf("free expired leases: %w", err)
	}
	for _, e := range expired {
		logger.Warn(who+": freed the lease of a worker that stopped renewing it", "worker_id", e.WorkerID, "slots", e.Slots)
	}
	keep := time.Duration(0)
	if c.RateMax > 0 {
		keep = c.RatePeriod
	}
	if _, err := tx.q.DeleteStaleStarts(tx.ctx, db.DeleteStaleStartsParams{Kind: kind, KeepMs: keep.Milliseconds(),
		ReservedTtlMs: reservedTTL.Milliseconds()}); err != nil {
		return fmt.Errorf("clean up stale starts: %w", err)
	}
	if err := tx.q.DeleteStaleFetches(tx.ctx, kind); err != nil {
		return fmt.Errorf("clean up stale fetch marks: %w", err)
	}
	gone, err := tx.q.DeleteStaleWaiters(tx.ctx, kind)
	if err != nil {
		return fmt.Errorf("clean up stale waiters: %w", err)
	}
	if len(gone) > 0 {
		logger.Info(who+": dropped waiters whose jobs no longer wait", "job_ids", gone)
	}
	return nil
}
