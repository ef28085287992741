package limiter

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/db"
)

// releaseBatch frees the slots of jobs that ended and of jobs that gave up
// waiting (the fast path, one statement: ReleaseJobs), then runs a grant
// round for each kind that has free room and jobs in its line, in a second
// transaction; the grants it claimed for jobs waiting in this worker wake
// them once it committed. A request without a job (a recheck after a
// parking, a rate window freeing a start) only runs the grant round. A kind
// whose limit row is gone lets its line go. When either step fails (the
// database is unreachable), the kinds are cleaned up again in the
// background (retryRelease).
func (l *Limiter) releaseBatch(batch []*releaseRequest) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(batch[0].ctx), batchTimeout)
	defer cancel()
	p := db.ReleaseJobsParams{
		Kinds:     distinctKinds(len(batch), func(i int) string { return batch[i].kind }),
		JobIds:    []int64{},
		ForgetIds: []int64{},
		WorkerID:  l.workerID,
	}
	for _, r := range batch {
		switch {
		case r.job == nil:
		case r.forget:
			p.ForgetIds = append(p.ForgetIds, r.job.ID)
		default:
			p.JobIds = append(p.JobIds, r.job.ID)
		}
	}
	rows, err := retryDeadlock(func() ([]*db.ReleaseJobsRow, error) { return db.New(db.CustomPlans(l.pool)).ReleaseJobs(ctx, p) })
	if err != nil {
		l.logger.Error("concurrency slots not released; retrying", "error", err)
		l.retryRelease(p.Kinds, append(p.JobIds, p.ForgetIds...))
		return
	}
	var grantKinds []string
	limited := map[string]bool{}
	turnover := map[string][]string{}
	for _, row := range rows {
		limited[row.Kind] = true
		turnover[row.Kind] = row.FreedKeys
		if row.MaxConcurrency == 0 && !row.Keyed && !row.AnyWaiting && row.Admitted == 0 {
			// Its limits were cleared while jobs of it held slots: the
			// last one gone, so goes the row.
			if _, err := l.q.DeleteEmptyLimit(ctx, row.Kind); err != nil {
				l.logger.Warn("limitless row of a kind not removed; concurrency_limit.resume will", "kind", row.Kind, "error", err)
			}
			continue
		}
		free := row.MaxConcurrency >= 0 && (row.MaxConcurrency == 0 || row.Admitted < row.MaxConcurrency)
		if free && row.AnyWaiting {
			grantKinds = append(grantKinds, row.Kind)
		}
	}
	// A recheck of a kind whose limit row is gone (an operator deleted it):
	// whatever it held goes.
	for _, r := range batch {
		if r.job == nil && !limited[r.kind] && !slices.Contains(grantKinds, r.kind) {
			grantKinds = append(grantKinds, r.kind)
		}
	}
	if len(grantKinds) == 0 {
		return
	}
	sort.Strings(grantKinds)
	local, wakes, err := l.grantKinds(batch[0].ctx, grantKinds, turnover)
	if err != nil {
		l.logger.Error("concurrency slots not granted; retrying", "error", err)
		l.retryRelease(grantKinds, nil)
		return
	}
	l.waits.grant(local)
	for kind, d := range wakes {
		l.wakes.after(kind, d)
	}
}

// grantKinds runs a grant round for each of kinds (sorted) in one
// transaction (turnover: the keys whose slots the release freed, per
// kind), or lets the line of a kind without limits go, and returns the
// grants claimed for jobs waiting in this worker and when rate windows
// next free a start.
func (l *Limiter) grantKinds(parent context.Context, kinds []string, turnover map[string][]string) (map[int64]admission, map[string]time.Duration, error) {
	var local map[int64]admission
	var wakes map[string]time.Duration
	err := l.withBatchTx(parent, func(ctx context.Context, tx pgx.Tx) error {
		local, wakes = map[int64]admission{}, map[string]time.Duration{}
		q := db.New(db.CustomPlans(tx))
		counts, err := lockKinds(ctx, q, kinds)
		if err != nil {
			return err
		}
		for _, kind := range kinds {
			c, ok := counts[kind]
			if !ok || c.unlimited() {
				if _, err := l.letGo(ctx, q, kind); err != nil {
					return err
				}
				if ok {
					c.setHasParked(false)
					if _, err := q.DeleteEmptyLimit(ctx, kind); err != nil {
						return fmt.Errorf("remove the limit row: %w", err)
					}
				}
				continue
			}
			// A recheck frees no slot: its round reads every key.
			within := turnover[kind]
			if len(within) == 0 {
				within = nil
			}
			res, err := l.grantRound(ctx, q, kind, c, nil, turnover[kind], within)
			if err != nil {
				return err
			}
			for id, d := range res.local {
				local[id] = d
			}
			if res.wakeIn > 0 {
				wakes[kind] = res.wakeIn
			}
		}
		return saveCounts(ctx, q, counts)
	})
	return local, wakes, err
}
