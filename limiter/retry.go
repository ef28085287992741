package limiter

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/db"
)

// releaseRetries are the delays, one after the other, at which a Limiter
// whose release (or the resume after it) failed on a database error cleans
// up the kinds itself (cleanUpKind) instead of leaving them to
// concurrency_limit.resume, which runs once a minute: until then the job's
// slot stays taken although the job ended, and a slot freed meanwhile is
// not resumed into, so a limited kind with parked jobs may stand still for
// up to a minute after a database restart. The retries go on until the
// jobs' slots are gone (about half a minute at most).
var releaseRetries = []time.Duration{
	100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second,
}

// retryRelease cleans up kinds after a failed release of the slots of
// jobIDs (none: a failed resume), in the background, at each of
// releaseRetries until a clean-up of every kind commits and no slot of
// jobIDs is left; it stops when the limiter is flushed. A slot of one of
// those jobs is freed once the job is no longer running (its completion may
// land after the database comes back); a slot the job took again for a new
// attempt is its own and stays.
func (l *Limiter) retryRelease(kinds []string, jobIDs []int64) {
	l.recheckMu.Lock()
	stopped := l.stopped
	l.recheckMu.Unlock()
	if stopped || len(kinds) == 0 {
		return
	}
	if jobIDs == nil {
		jobIDs = []int64{}
	}
	go func() {
		for _, delay := range releaseRetries {
			select {
			case <-l.stopCh:
				return
			case <-time.After(delay):
			}
			if l.cleanUpAfterFailure(kinds, jobIDs) {
				l.logger.Info("concurrency slots cleaned up after a failed release", "kinds", kinds, "job_ids", jobIDs)
				return
			}
		}
		l.logger.Warn("concurrency slots still not cleaned up after a failed release; concurrency_limit.resume will", "kinds", kinds, "job_ids", jobIDs)
	}()
}

// cleanUpAfterFailure is one try of retryRelease: true once every kind is
// cleaned up and no slot of jobIDs is left.
func (l *Limiter) cleanUpAfterFailure(kinds []string, jobIDs []int64) bool {
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	for _, kind := range kinds {
		if _, _, err := l.cleanUpKind(ctx, kind, l.logger.With("kind", kind), "release retry"); err != nil {
			l.logger.Warn("concurrency slots not cleaned up after a failed release; retrying", "kind", kind, "error", err)
			return false
		}
	}
	left, err := l.q.CountSlotsOf(ctx, jobIDs)
	if err != nil {
		l.logger.Warn("concurrency slots not cleaned up after a failed release; retrying", "error", err)
		return false
	}
	return left == 0
}

// cleanUpKind is the safety net's work on kind (concurrency_limit.resume,
// and a Limiter after a failed release), in one transaction with the kind's
// limit row locked: it frees the slots of jobs no longer running (and
// grants whose job was not fetched in time), expired leases, stale starts
// and waiters whose job no longer waits, recounts the kind's slots, and
// grants the free room to the line (a kind without limits lets its line
// go, and loses its row once nothing of it is left). It returns how many
// jobs it resumed and whether jobs remain in the line; who names the
// caller in the log lines. Grants it claimed for jobs waiting in this
// worker wake them once it committed.
func (l *Limiter) cleanUpKind(ctx context.Context, kind string, logger *slog.Logger, who string) (resumed int, remaining bool, err error) {
	local := map[int64]admission{}
	var wakeIn time.Duration
	err = pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		resumed, remaining, wakeIn = 0, false, 0
		clear(local)
		q := db.New(db.CustomPlans(tx))
		// A kind without a limit row may be given one meanwhile, counting
		// the slot rows this deletes: wait for it, as a release does.
		if err := q.LockLimitRowCreation(ctx, []string{kind}); err != nil {
			return fmt.Errorf("lock limit row creation: %w", err)
		}
		counts, err := lockKinds(ctx, q, []string{kind})
		if err != nil {
			return err
		}
		c, limited := counts[kind]
		stale, err := q.DeleteStaleConcurrencyExecutions(ctx, db.DeleteStaleConcurrencyExecutionsParams{
			Kind: kind, ReservedTtlMs: ReservedSlotTTL.Milliseconds(),
		})
		if err != nil {
			return fmt.Errorf("clean up stale slots: %w", err)
		}
		if len(stale) > 0 {
			logger.Warn(who+": freed slots of jobs no longer running, or granted and not started", "job_ids", stale)
		}
		expired, err := q.DeleteStaleLeases(ctx, db.DeleteStaleLeasesParams{Kind: kind, TtlMs: LeaseTTL.Milliseconds()})
		if err != nil {
			return fmt.Errorf("free expired leases: %w", err)
		}
		for _, e := range expired {
			logger.Warn(who+": freed the lease of a worker that stopped renewing it", "worker_id", e.WorkerID, "slots", e.Slots)
		}
		if _, err := q.DeleteStaleStarts(ctx, db.DeleteStaleStartsParams{
			Kind: kind, KeepMs: startsKeep(c).Milliseconds(), ReservedTtlMs: ReservedSlotTTL.Milliseconds(),
		}); err != nil {
			return fmt.Errorf("clean up stale starts: %w", err)
		}
		gone, err := q.DeleteStaleWaiters(ctx, kind)
		if err != nil {
			return fmt.Errorf("clean up stale waiters: %w", err)
		}
		if len(gone) > 0 {
			logger.Info(who+": dropped waiters whose jobs no longer wait", "job_ids", gone)
		}
		if limited && c.fields != nil {
			if err := q.BackfillPartitionKeys(ctx, kind); err != nil {
				return fmt.Errorf("backfill partition keys: %w", err)
			}
		}
		if limited {
			// The safety net also corrects the count and flag the hot path keeps.
			if err := q.RecountConcurrency(ctx, kind); err != nil {
				return fmt.Errorf("recount: %w", err)
			}
			if counts, err = lockKinds(ctx, q, []string{kind}); err != nil {
				return err
			}
			c = counts[kind]
		}
		switch {
		case !limited || c.unlimited():
			// No limit: whatever waits goes.
			if resumed, err = l.letGo(ctx, q, kind); err != nil {
				return err
			}
			if limited {
				if _, err := q.DeleteEmptyLimit(ctx, kind); err != nil {
					return fmt.Errorf("remove the limit row: %w", err)
				}
			}
		case c.limit < 0:
			// Nothing resumes until the breaker is lifted, which grants
			// what the new limit lets start.
			logger.Info(who+": circuit breaker is on; nothing resumed", "limit", c.limit)
			return saveCounts(ctx, q, counts)
		default:
			res, err := l.grantRound(ctx, q, kind, c, nil, nil, nil)
			if err != nil {
				return err
			}
			resumed, wakeIn = res.resumed, res.wakeIn
			for id, d := range res.local {
				local[id] = d
			}
			if err := saveCounts(ctx, q, counts); err != nil {
				return err
			}
		}
		if resumed > 0 {
			logger.Info(who, "resumed", resumed, "limit", limitOf(c), "slots_taken", takenOf(c))
		}
		remaining, err = q.HasAnyLine(ctx, kind)
		if err != nil {
			return fmt.Errorf("look at the line: %w", err)
		}
		return nil
	})
	if err == nil {
		l.waits.grant(local)
		if wakeIn > 0 {
			l.wakes.after(kind, wakeIn)
		}
	}
	return resumed, remaining, err
}

func limitOf(c *kindCounts) int32 {
	if c == nil {
		return 0
	}
	return c.limit
}

func takenOf(c *kindCounts) int32 {
	if c == nil {
		return 0
	}
	return c.taken
}
