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
// limit row locked: it frees the slots of jobs no longer running (and those
// reserved for resumed jobs not fetched in time) and expired leases,
// recounts the kind's slots, and resumes parked jobs into the free ones. It
// returns how many jobs it resumed and whether jobs remain parked; who
// names the caller in the log lines.
func (l *Limiter) cleanUpKind(ctx context.Context, kind string, logger *slog.Logger, who string) (resumed int, remaining bool, err error) {
	err = pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		q := db.New(tx)
		counts, err := lockKinds(ctx, q, []string{kind})
		if err != nil {
			return err
		}
		c, limited := counts[kind]
		if limited && c.limit < 0 {
			logger.Info(who+": circuit breaker is on; nothing resumed", "limit", c.limit)
			return nil
		}
		stale, err := q.DeleteStaleConcurrencyExecutions(ctx, db.DeleteStaleConcurrencyExecutionsParams{
			Kind: kind, ReservedTtlMs: ReservedSlotTTL.Milliseconds(),
		})
		if err != nil {
			return fmt.Errorf("clean up stale slots: %w", err)
		}
		if len(stale) > 0 {
			logger.Warn(who+": freed slots of jobs no longer running, or reserved and not started", "job_ids", stale)
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
		} else {
			// Unlimited (no row): resume in batches of MaxResumeBatch,
			// whatever the jobs waited for.
			has, err := q.HasAnyParkedJobs(ctx, kind)
			if err != nil {
				return fmt.Errorf("look for parked jobs: %w", err)
			}
			c = &kindCounts{hasParked: has}
		}
		waiting := c.hasParked
		if c.keyed() {
			// Jobs may wait for their keys only.
			if waiting, err = q.HasAnyParkedJobs(ctx, kind); err != nil {
				return fmt.Errorf("look for parked jobs: %w", err)
			}
		}
		if !waiting {
			return nil
		}
		logger.Info(who, "limit", c.limit, "current", c.taken)
		if resumed, err = l.resumeInto(ctx, q, kind, c); err != nil {
			return err
		}
		// Fresh either way: resumeInto looked again after resuming, and
		// when it had no slot to fill, the recount just did.
		remaining = c.hasParked
		if c.keyed() {
			if remaining, err = q.HasAnyParkedJobs(ctx, kind); err != nil {
				return fmt.Errorf("look for parked jobs: %w", err)
			}
		}
		if limited {
			return saveCounts(ctx, q, map[string]*kindCounts{kind: c})
		}
		return nil
	})
	return resumed, remaining, err
}
