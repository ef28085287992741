package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/sluice-dev/sluice/db"
)

// JobMetadata is what the dispatcher (and `sluice schedule trigger`) puts
// in the metadata of every job it inserts, so that a job names the schedule
// and the due time it stands for:
//
//	SELECT * FROM river_job WHERE metadata->>'schedule' = 'NAME';
type JobMetadata struct {
	// Schedule is the schedule's name.
	Schedule string `json:"schedule"`
	// ScheduleID is schedules.id.
	ScheduleID int64 `json:"schedule_id"`
	// DueAt is the due time the job stands for (for a trigger: its time).
	DueAt time.Time `json:"due_at"`
	// Trigger is true for a run started by `sluice schedule trigger`.
	Trigger bool `json:"trigger,omitempty"`
	// Missed counts the due times before this one that the misfire policy
	// did not run (counted up to 10,000).
	Missed int `json:"missed,omitempty"`
}

// maxErrorLen bounds schedules.last_error.
const maxErrorLen = 2000

// initialiseBatch computes next_run_at (the first due time after now) for a
// batch of rows where it is NULL, without dispatching anything. A row whose
// cron or zone is invalid records a failure instead.
func (d *Dispatcher) initialiseBatch(ctx context.Context, set *dispatchSettings, res *TickResult) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, batchTimeout)
	defer cancel()
	tx, err := d.cfg.Pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("scheduler: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	q := d.q.WithTx(tx)
	rows, err := q.ClaimUninitialisedSchedules(ctx, db.ClaimUninitialisedSchedulesParams{Now: d.claimNow(), MaxRows: int32(d.cfg.BatchSize)})
	if err != nil {
		return 0, fmt.Errorf("scheduler: claim rows to initialise: %w", err)
	}
	if len(rows) == 0 {
		return 0, nil
	}
	var set1 db.SetScheduleNextRunsParams
	var fails failures
	for _, r := range rows {
		c, err := d.cron(r.Cron, r.Timezone)
		var next time.Time
		if err == nil {
			if next = c.Next(r.Now); next.IsZero() {
				err = &FieldError{Field: "cron", Value: r.Cron, Reason: errNoFutureTime.Error()}
			}
		}
		if err != nil {
			fails.add(r.ID, err, r.Now.Add(set.backoff(int(r.FailureCount)+1)))
			continue
		}
		set1.Ids = append(set1.Ids, r.ID)
		set1.NextRunAts = append(set1.NextRunAts, next)
	}
	if len(set1.Ids) > 0 {
		if err := q.SetScheduleNextRuns(ctx, set1); err != nil {
			return 0, fmt.Errorf("scheduler: set next runs: %w", err)
		}
	}
	failed, err := fails.record(ctx, q)
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("scheduler: commit: %w", err)
	}
	res.Initialised += len(set1.Ids)
	res.Failed += len(failed)
	d.reportFailures(failed, fails)
	return len(rows), nil
}

// plan is what the dispatch of one claimed row does.
type plan struct {
	row    *db.ClaimDueSchedulesRow
	params []river.InsertManyParams
	dues   []time.Time
	next   time.Time
	missed int
	exact  bool
	jobIDs []int64
	// err is why the dispatch failed: an invalid row or a failed insert.
	err error
}

// dispatchBatch claims a batch of due rows and, in one transaction, inserts
// their jobs and records the dispatches (or the failures).
func (d *Dispatcher) dispatchBatch(ctx context.Context, set *dispatchSettings, res *TickResult) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, batchTimeout)
	defer cancel()
	tx, err := d.cfg.Pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("scheduler: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	q := d.q.WithTx(tx)
	rows, err := q.ClaimDueSchedules(ctx, db.ClaimDueSchedulesParams{Now: d.claimNow(), MaxRows: int32(d.cfg.BatchSize)})
	if err != nil {
		return 0, fmt.Errorf("scheduler: claim due rows: %w", err)
	}
	if len(rows) == 0 {
		return 0, nil
	}
	plans := make([]*plan, len(rows))
	for i, r := range rows {
		plans[i] = d.plan(r, set)
	}
	if err := d.insert(ctx, tx, plans); err != nil {
		return 0, err
	}

	var done db.RecordScheduleDispatchesParams
	var fails failures
	for _, p := range plans {
		if p.err != nil {
			fails.add(p.row.ID, p.err, p.row.Now.Add(set.backoff(int(p.row.FailureCount)+1)))
			continue
		}
		var lastRun time.Time
		var lastJob int64
		if n := len(p.dues); n > 0 {
			lastRun, lastJob = p.dues[n-1], p.jobIDs[n-1]
		}
		done.Ids = append(done.Ids, p.row.ID)
		done.NextRunAts = append(done.NextRunAts, p.next)
		done.LastRunAts = append(done.LastRunAts, lastRun)
		done.LastJobIds = append(done.LastJobIds, lastJob)
		done.Runs = append(done.Runs, int64(len(p.dues)))
	}
	if len(done.Ids) > 0 {
		if err := q.RecordScheduleDispatches(ctx, done); err != nil {
			return 0, fmt.Errorf("scheduler: record dispatches: %w", err)
		}
	}
	failed, err := fails.record(ctx, q)
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("scheduler: commit: %w", err)
	}

	committed := d.wallNow()
	for _, p := range plans {
		if p.err != nil {
			continue
		}
		res.Dispatched++
		res.Jobs += len(p.dues)
		name := p.row.Name
		if len(p.dues) > 0 {
			d.metrics.Dispatched.Add(float64(len(p.dues)))
		}
		for _, due := range p.dues {
			d.metrics.Lag.Observe(committed.Sub(due).Seconds())
		}
		if p.missed > 0 {
			d.metrics.Skipped.Add(float64(p.missed))
			more := ""
			if !p.exact {
				more = "+"
			}
			d.logger.Warn("schedule missed due times", "schedule", name, "misfire", p.row.Misfire,
				"missed", fmt.Sprint(p.missed, more), "runs", len(p.dues), "next_run_at", p.next)
		}
		d.logger.Debug("schedule dispatched", "schedule", name, "jobs", p.jobIDs, "next_run_at", p.next)
	}
	res.Failed += len(failed)
	d.reportFailures(failed, fails)
	return len(rows), nil
}

// plan works out the dispatch of row r: validate it, list the due times the
// misfire policy runs, and build their inserts.
func (d *Dispatcher) plan(r *db.ClaimDueSchedulesRow, set *dispatchSettings) *plan {
	p := &plan{row: r}
	c, err := d.cron(r.Cron, r.Timezone)
	if err != nil {
		p.err = err
		return p
	}
	jobArgs, err := set.decode(d.registry, r.Kind, r.Args)
	if err != nil {
		p.err = err
		return p
	}
	queue := ""
	if r.Queue != nil {
		queue = *r.Queue
		if err := checkQueue(queue); err != nil {
			p.err = err
			return p
		}
	}
	now := r.Now
	first := firstDue(*r.NextRunAt, r.RetryDueAt)
	if p.next, err = c.After(first, now); err != nil {
		p.err = &FieldError{Field: "cron", Value: r.Cron, Reason: err.Error(), Err: err}
		return p
	}
	k := 1
	if r.Misfire == MisfireRunAll {
		k = set.runAllLimit()
	}
	dues, total, exact := c.DueTimes(first, now, k)
	if r.Misfire == MisfireSkip && len(dues) > 0 && now.Sub(dues[len(dues)-1]) > set.misfireGrace() {
		dues = nil
	}
	p.dues, p.missed, p.exact = dues, total-len(dues), exact
	for i, due := range dues {
		md := JobMetadata{Schedule: r.Name, ScheduleID: r.ID, DueAt: due.UTC()}
		if i == 0 {
			md.Missed = p.missed
		}
		raw, err := json.Marshal(md)
		if err != nil {
			p.err = fmt.Errorf("encode job metadata: %w", err)
			return p
		}
		p.params = append(p.params, river.InsertManyParams{
			Args:       jobArgs,
			InsertOpts: jobInsertOpts(queue, r.Priority, r.MaxAttempts, r.Tags, raw),
		})
	}
	return p
}

// jobInsertOpts are the insert options of a schedule's job: its row's
// queue, priority, max attempts and tags (empty and NULL: the kind's own)
// and the job metadata md.
func jobInsertOpts(queue string, priority *int16, maxAttempts *int32, tags []string, md []byte) *river.InsertOpts {
	opts := &river.InsertOpts{Queue: queue, Tags: tags, Metadata: md}
	if priority != nil {
		opts.Priority = int(*priority)
	}
	if maxAttempts != nil {
		opts.MaxAttempts = int(*maxAttempts)
	}
	return opts
}

// insert inserts the jobs of every valid plan: all in one InsertManyTx
// under a savepoint, and if that fails, plan by plan under savepoints of
// their own, so that one failing insert (which aborts a transaction) fails
// only its own row. An error means the transaction itself is unusable.
func (d *Dispatcher) insert(ctx context.Context, tx pgx.Tx, plans []*plan) error {
	var todo []*plan
	var all []river.InsertManyParams
	for _, p := range plans {
		if p.err == nil && len(p.params) > 0 {
			todo = append(todo, p)
			all = append(all, p.params...)
		}
	}
	if len(all) == 0 {
		return nil
	}
	ids, err := d.insertSavepoint(ctx, tx, all)
	if err == nil {
		for _, p := range todo {
			if err := p.assignJobIDs(ids); err != nil {
				return err
			}
		}
		return nil
	}
	var txErr *txError
	if errors.As(err, &txErr) {
		return txErr.err
	}
	for _, p := range todo {
		ids, err := d.insertSavepoint(ctx, tx, p.params)
		if errors.As(err, &txErr) {
			return txErr.err
		}
		if err != nil {
			p.err = fmt.Errorf("insert job: %w", err)
			continue
		}
		if err := p.assignJobIDs(ids); err != nil {
			return err
		}
	}
	return nil
}

// jobKey identifies an inserted job by the schedule and due time in its
// metadata (results are matched by key, not by position).
type jobKey struct {
	scheduleID int64
	due        int64 // unix nanoseconds
}

// assignJobIDs looks up the ids of the plan's jobs.
func (p *plan) assignJobIDs(ids map[jobKey]int64) error {
	for _, due := range p.dues {
		id, ok := ids[jobKey{p.row.ID, due.UnixNano()}]
		if !ok {
			return fmt.Errorf("scheduler: the insert returned no job for schedule %q due %s", p.row.Name, due.UTC().Format(time.RFC3339Nano))
		}
		p.jobIDs = append(p.jobIDs, id)
	}
	return nil
}

// txError marks a failure of the transaction itself (not of an insert).
type txError struct{ err error }

func (e *txError) Error() string { return e.err.Error() }

// insertSavepoint inserts params under a savepoint and returns the job ids
// by schedule and due time.
// An insert error rolls back to the savepoint and is returned as is;
// savepoint errors come back as *txError.
func (d *Dispatcher) insertSavepoint(ctx context.Context, tx pgx.Tx, params []river.InsertManyParams) (map[jobKey]int64, error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, &txError{fmt.Errorf("scheduler: savepoint: %w", err)}
	}
	results, err := d.cfg.Client.InsertManyTx(ctx, sp, params)
	if err != nil {
		if rbErr := sp.Rollback(ctx); rbErr != nil {
			return nil, &txError{fmt.Errorf("scheduler: rollback to savepoint after %v: %w", err, rbErr)}
		}
		if ctx.Err() != nil {
			return nil, &txError{fmt.Errorf("scheduler: insert jobs: %w", err)}
		}
		return nil, err
	}
	if err := sp.Commit(ctx); err != nil {
		return nil, &txError{fmt.Errorf("scheduler: release savepoint: %w", err)}
	}
	ids := make(map[jobKey]int64, len(results))
	for _, r := range results {
		var md JobMetadata
		if err := json.Unmarshal(r.Job.Metadata, &md); err != nil {
			return nil, &txError{fmt.Errorf("scheduler: read metadata of job %d: %w", r.Job.ID, err)}
		}
		ids[jobKey{md.ScheduleID, md.DueAt.UnixNano()}] = r.Job.ID
	}
	return ids, nil
}

// failures collects the failed dispatches of a batch.
type failures struct {
	params db.RecordScheduleFailuresParams
	errs   map[int64]string
}

func (f *failures) add(id int64, err error, retryAt time.Time) {
	msg := strings.Join(strings.Fields(err.Error()), " ")
	if len(msg) > maxErrorLen {
		msg = msg[:maxErrorLen] + "…"
	}
	if f.errs == nil {
		f.errs = map[int64]string{}
	}
	f.params.Ids = append(f.params.Ids, id)
	f.params.Errors = append(f.params.Errors, msg)
	f.params.RetryAts = append(f.params.RetryAts, retryAt)
	f.errs[id] = msg
}

func (f *failures) record(ctx context.Context, q *db.Queries) ([]*db.RecordScheduleFailuresRow, error) {
	if len(f.params.Ids) == 0 {
		return nil, nil
	}
	rows, err := q.RecordScheduleFailures(ctx, f.params)
	if err != nil {
		return nil, fmt.Errorf("scheduler: record failures: %w", err)
	}
	return rows, nil
}

// reportFailures logs and counts committed failures.
func (d *Dispatcher) reportFailures(rows []*db.RecordScheduleFailuresRow, f failures) {
	for _, r := range rows {
		d.metrics.Failures.Inc()
		if r.Status == StatusFailed {
			d.logger.Error("schedule failed: no longer dispatched until `sluice schedule enable`",
				"schedule", r.Name, "failures", r.FailureCount, "max_retries", r.MaxRetries, "error", f.errs[r.ID])
			continue
		}
		d.logger.Warn("schedule dispatch failed; retrying with backoff",
			"schedule", r.Name, "failures", r.FailureCount, "max_retries", r.MaxRetries, "error", f.errs[r.ID])
	}
}
