package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/kinds"
)

// NotFoundError reports an unknown schedule name.
type NotFoundError struct{ Name string }

// Error describes the error.
func (e *NotFoundError) Error() string { return fmt.Sprintf("no schedule named %q", e.Name) }

// ExistsError reports a schedule name already taken.
type ExistsError struct{ Name string }

// Error describes the error.
func (e *ExistsError) Error() string {
	return fmt.Sprintf("a schedule named %q already exists (change it with `sluice schedule update %s`)", e.Name, e.Name)
}

// InvalidRowError reports a stored row that cannot be enabled or triggered
// as it is (a row written with plain SQL); it wraps the *FieldError.
type InvalidRowError struct {
	Name string
	Err  error
}

// Error describes the error.
func (e *InvalidRowError) Error() string {
	return fmt.Sprintf("schedule %q: %v (fix it with `sluice schedule update %s`)", e.Name, e.Err, e.Name)
}

// Unwrap returns the underlying error.
func (e *InvalidRowError) Unwrap() error { return e.Err }

// Store is the Go API behind `sluice schedule`: every change is validated
// before anything is written and runs in one transaction, with the row
// locked (FOR UPDATE) so that it never interleaves with a dispatch.
type Store struct {
	pool     *pgxpool.Pool
	registry *kinds.Registry
}

// NewStore returns a Store on pool; registry decodes and validates the
// schedules' job args.
func NewStore(pool *pgxpool.Pool, registry *kinds.Registry) *Store {
	return &Store{pool: pool, registry: registry}
}

// Add validates d and inserts it, with next_run_at computed from the
// database's now.
func (s *Store) Add(ctx context.Context, d Definition) (*db.Schedule, error) {
	c, err := Validate(s.registry, d)
	if err != nil {
		return nil, err
	}
	q := db.New(s.pool)
	now, err := q.DBNow(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the database clock: %w", err)
	}
	next := c.Cron.Next(now)
	row, err := q.InsertSchedule(ctx, db.InsertScheduleParams{
		Name:       c.Name,
		Cron:       c.Definition.Cron,
		Timezone:   c.Timezone,
		Kind:       c.Kind,
		Args:       c.Args,
		Queue:      optional(c.Queue),
		Enabled:    c.Enabled,
		Misfire:    c.Misfire,
		MaxRetries: int32(c.MaxRetries),
		NextRunAt:  &next,
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return nil, &ExistsError{Name: d.Name}
	}
	if err != nil {
		return nil, fmt.Errorf("insert schedule %q: %w", d.Name, err)
	}
	return row, nil
}

// Patch is an update of some fields of a schedule; nil fields are left as
// they are. Queue set to "" means the kind's own queue.
type Patch struct {
	Cron       *string
	Timezone   *string
	Kind       *string
	Args       *json.RawMessage
	Queue      *string
	Misfire    *string
	MaxRetries *int
	Enabled    *bool
}

// Empty reports whether p changes nothing.
func (p Patch) Empty() bool {
	return p.Cron == nil && p.Timezone == nil && p.Kind == nil && p.Args == nil &&
		p.Queue == nil && p.Misfire == nil && p.MaxRetries == nil && p.Enabled == nil
}

// Update applies p to the schedule named name. The whole resulting
// definition is validated; a new cron or zone, or enabling a disabled row,
// recomputes next_run_at from now (and ends a retry). The status is left
// alone: `enable` makes a failed schedule active again.
func (s *Store) Update(ctx context.Context, name string, p Patch) (*db.Schedule, error) {
	var out *db.Schedule
	err := s.withRow(ctx, name, func(q *txQueries, row *db.Schedule, now time.Time) error {
		d := definitionOf(row)
		setIf(&d.Cron, p.Cron)
		setIf(&d.Timezone, p.Timezone)
		setIf(&d.Kind, p.Kind)
		setIf(&d.Args, p.Args)
		setIf(&d.Queue, p.Queue)
		setIf(&d.Misfire, p.Misfire)
		setIf(&d.MaxRetries, p.MaxRetries)
		setIf(&d.Enabled, p.Enabled)
		c, err := Validate(s.registry, d)
		if err != nil {
			return err
		}
		next, retryDue := row.NextRunAt, row.RetryDueAt
		if c.Definition.Cron != row.Cron || c.Timezone != row.Timezone || (c.Enabled && !row.Enabled) || next == nil {
			n := c.Cron.Next(now)
			next, retryDue = &n, nil
		}
		out, err = q.UpdateSchedule(ctx, db.UpdateScheduleParams{
			ID:         row.ID,
			Cron:       c.Definition.Cron,
			Timezone:   c.Timezone,
			Kind:       c.Kind,
			Args:       c.Args,
			Queue:      optional(c.Queue),
			Enabled:    c.Enabled,
			Misfire:    c.Misfire,
			MaxRetries: int32(c.MaxRetries),
			NextRunAt:  next,
			RetryDueAt: retryDue,
		})
		if err != nil {
			return fmt.Errorf("update schedule %q: %w", name, err)
		}
		if out.NextRunAt == nil && next != nil {
			// The new cadence's next time equals the old one: the
			// table's trigger took the unchanged next_run_at for "not
			// set" and cleared it. Set it again.
			if err := q.SetScheduleNextRuns(ctx, db.SetScheduleNextRunsParams{Ids: []int64{row.ID}, NextRunAts: []time.Time{*next}}); err != nil {
				return fmt.Errorf("update schedule %q: %w", name, err)
			}
			out.NextRunAt = next
		}
		return nil
	})
	return out, err
}

// Remove deletes the schedule named name. Jobs it inserted stay. A
// schedule declared in Go is refused (*DeclaredRemoveError): disable it.
func (s *Store) Remove(ctx context.Context, name string) error {
	declared, err := s.IsDeclared(ctx, name)
	if err != nil {
		return err
	}
	if declared {
		return &DeclaredRemoveError{Name: name}
	}
	_, err = db.New(s.pool).DeleteSchedule(ctx, name)
	if errors.Is(err, pgx.ErrNoRows) {
		return &NotFoundError{Name: name}
	}
	if err != nil {
		return fmt.Errorf("remove schedule %q: %w", name, err)
	}
	return nil
}

// Enable enables the schedule named name and makes a failed one active
// again (failure_count 0, last_error cleared); its cadence starts afresh
// from now. changed is false when it was enabled and active already (then
// nothing is written).
func (s *Store) Enable(ctx context.Context, name string) (row *db.Schedule, changed bool, err error) {
	err = s.withRow(ctx, name, func(q *txQueries, cur *db.Schedule, now time.Time) error {
		if cur.Enabled && cur.Status == StatusActive {
			row = cur
			return nil
		}
		d := definitionOf(cur)
		d.Enabled = true
		c, err := compile(s.registry, d)
		if err != nil {
			return &InvalidRowError{Name: name, Err: err}
		}
		next := c.Cron.Next(now)
		row, err = q.EnableSchedule(ctx, db.EnableScheduleParams{ID: cur.ID, NextRunAt: &next})
		if err != nil {
			return fmt.Errorf("enable schedule %q: %w", name, err)
		}
		changed = true
		return nil
	})
	return row, changed, err
}

// Disable disables the schedule named name; changed is false when it was
// disabled already.
func (s *Store) Disable(ctx context.Context, name string) (row *db.Schedule, changed bool, err error) {
	err = s.withRow(ctx, name, func(q *txQueries, cur *db.Schedule, _ time.Time) error {
		if !cur.Enabled {
			row = cur
			return nil
		}
		row, err = q.DisableSchedule(ctx, cur.ID)
		if err != nil {
			return fmt.Errorf("disable schedule %q: %w", name, err)
		}
		changed = true
		return nil
	})
	return row, changed, err
}

// Trigger inserts one run of the schedule named name now, in one
// transaction with the row's last_run_at, last_job_id, last_dispatched_at
// and run_count. The cadence (next_run_at), the retry state and the status
// are left alone, and a disabled or failed schedule can be triggered too.
// The job's metadata has trigger: true and due_at: now.
func (s *Store) Trigger(ctx context.Context, client *river.Client[pgx.Tx], name string) (jobID int64, err error) {
	err = s.withRow(ctx, name, func(q *txQueries, row *db.Schedule, now time.Time) error {
		jobArgs, err := decodeArgs(s.registry, row.Kind, row.Args)
		if err == nil && row.Queue != nil {
			err = checkQueue(*row.Queue)
		}
		if err != nil {
			return &InvalidRowError{Name: name, Err: err}
		}
		md, err := json.Marshal(JobMetadata{Schedule: row.Name, ScheduleID: row.ID, DueAt: now.UTC(), Trigger: true})
		if err != nil {
			return fmt.Errorf("encode job metadata: %w", err)
		}
		queue := ""
		if row.Queue != nil {
			queue = *row.Queue
		}
		opts := jobInsertOpts(queue, row.Priority, row.MaxAttempts, row.Tags, md)
		res, err := client.InsertTx(ctx, q.Tx(), jobArgs, opts)
		if err != nil {
			return fmt.Errorf("insert %s job for schedule %q: %w", row.Kind, name, err)
		}
		jobID = res.Job.ID
		if _, err := q.RecordScheduleTrigger(ctx, db.RecordScheduleTriggerParams{ID: row.ID, DueAt: &now, JobID: &jobID}); err != nil {
			return fmt.Errorf("record trigger of schedule %q: %w", name, err)
		}
		return nil
	})
	return jobID, err
}

// Listed is a schedule as List returns it: the row, and its next due time.
type Listed struct {
	*db.Schedule
	// NextDueAt is the row's next due time after the database's now
	// (NextDue, the dispatcher's computation); nil when the row is
	// disabled or failed (it is not dispatched) or invalid.
	NextDueAt *time.Time `json:"next_due_at"`
	// NextDueErr is why an enabled, active row has no NextDueAt: its cron
	// or zone is invalid for this binary (a *FieldError).
	NextDueErr error `json:"-"`
}

// List returns every schedule, by name, with its next due time.
func (s *Store) List(ctx context.Context) ([]*Listed, error) {
	q := db.New(s.pool)
	rows, err := q.ListSchedules(ctx)
	if err != nil {
		return nil, fmt.Errorf("list schedules: %w", err)
	}
	now, err := q.DBNow(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the database clock: %w", err)
	}
	out := make([]*Listed, len(rows))
	for i, row := range rows {
		out[i] = &Listed{Schedule: row}
		if !row.Enabled || row.Status != StatusActive {
			continue
		}
		next, err := NextDue(row, now)
		if err != nil {
			out[i].NextDueErr = err
			continue
		}
		out[i].NextDueAt = &next
	}
	return out, nil
}

// withRow runs fn in a transaction holding the row of name (FOR UPDATE),
// with the database's now; fn's error rolls everything back.
func (s *Store) withRow(ctx context.Context, name string, fn func(q *txQueries, row *db.Schedule, now time.Time) error) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	q := &txQueries{Queries: db.New(tx), tx: tx}
	row, err := q.GetScheduleForUpdate(ctx, name)
	if errors.Is(err, pgx.ErrNoRows) {
		return &NotFoundError{Name: name}
	}
	if err != nil {
		return fmt.Errorf("look up schedule %q: %w", name, err)
	}
	now, err := q.DBNow(ctx)
	if err != nil {
		return fmt.Errorf("read the database clock: %w", err)
	}
	if err := fn(q, row, now); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// txQueries are queries on a transaction that also hands out the
// transaction (for River's InsertTx).
type txQueries struct {
	*db.Queries
	tx pgx.Tx
}

// Tx is the transaction.
func (q *txQueries) Tx() pgx.Tx { return q.tx }

func definitionOf(row *db.Schedule) Definition {
	d := Definition{
		Name:       row.Name,
		Cron:       row.Cron,
		Timezone:   row.Timezone,
		Kind:       row.Kind,
		Args:       row.Args,
		Misfire:    row.Misfire,
		MaxRetries: int(row.MaxRetries),
		Enabled:    row.Enabled,
	}
	if row.Queue != nil {
		d.Queue = *row.Queue
	}
	return d
}

func setIf[T any](dst *T, v *T) {
	if v != nil {
		*dst = *v
	}
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
