package scheduler

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/pgkit"
)

// Sources of a schedule's definition (schedules.source).
const (
	// SourceSQL is a definition an operator wrote: the CLI, a migration,
	// any SQL. It wins over a declaration of the same name.
	SourceSQL = "sql"
	// SourceConfig is a definition declared in Go (Config.Schedules) and
	// written by a worker at start.
	SourceConfig = "config"
)

// DeclaredSync is what SyncDeclared changed, by schedule name.
type DeclaredSync struct {
	// Added are the declared schedules that had no row.
	Added []string
	// Updated are the rows that followed their declaration and were
	// rewritten to its new definition.
	Updated []string
	// Kept are the declared schedules whose row an operator changed (source
	// sql): their definition stays until `sluice schedule reset`.
	Kept []string
	// Removed are the schedules no longer declared whose row still followed
	// its declaration; it is deleted.
	Removed []string
}

// NotDeclaredError reports a `schedule reset` of a schedule no program has
// declared.
type NotDeclaredError struct{ Name string }

// Error describes the error.
func (e *NotDeclaredError) Error() string {
	return fmt.Sprintf("schedule %q is not declared in Go (Config.Schedules of a program whose worker has started): nothing to reset it to", e.Name)
}

// DeclaredRemoveError reports a `schedule remove` of a declared schedule:
// the next worker to start would write it back.
type DeclaredRemoveError struct{ Name string }

// Error describes the error.
func (e *DeclaredRemoveError) Error() string {
	return fmt.Sprintf("schedule %q is declared in the program's Config.Schedules, and the next worker to start would add it back: "+
		"switch it off with `sluice schedule disable %s` (it stays off across restarts), or stop declaring it", e.Name, e.Name)
}

// SyncDeclared writes the program's declared schedules (compiled by
// CompileDeclared) in one transaction: each is recorded in
// schedule_declarations and written into its schedules row unless an
// operator changed that row (source sql); declarations the program no
// longer makes are forgotten, and their rows removed if they still
// followed them. declaredBy names the worker. Two workers starting at once
// write one after the other.
func (s *Store) SyncDeclared(ctx context.Context, rows []DeclaredRow, declaredBy string) (DeclaredSync, error) {
	var out DeclaredSync
	err := s.inDeclarationsTx(ctx, func(q *db.Queries) error {
		names := make([]string, 0, len(rows))
		for _, r := range rows {
			names = append(names, r.Name)
			if err := q.UpsertScheduleDeclaration(ctx, declarationParams(r, declaredBy)); err != nil {
				return fmt.Errorf("record declared schedule %q: %w", r.Name, err)
			}
			written, err := q.WriteDeclaredSchedule(ctx, db.WriteDeclaredScheduleParams{Name: r.Name})
			if err != nil {
				return fmt.Errorf("write declared schedule %q: %w", r.Name, err)
			}
			switch {
			case len(written) == 1 && written[0].Inserted:
				out.Added = append(out.Added, r.Name)
			case len(written) == 1:
				out.Updated = append(out.Updated, r.Name)
			default:
				row, err := q.GetSchedule(ctx, r.Name)
				if err != nil {
					return fmt.Errorf("read schedule %q: %w", r.Name, err)
				}
				if row.Source == SourceSQL {
					out.Kept = append(out.Kept, r.Name)
				}
			}
		}
		stale, err := q.DeleteStaleScheduleDeclarations(ctx, names)
		if err != nil {
			return fmt.Errorf("forget schedules no longer declared: %w", err)
		}
		if len(stale) > 0 {
			if out.Removed, err = q.DeleteDeclaredSchedules(ctx, stale); err != nil {
				return fmt.Errorf("remove schedules no longer declared: %w", err)
			}
		}
		return nil
	})
	return out, err
}

// Reset writes the declared definition of the schedule named name back into
// its row (inserting it if an operator removed it), undoing any change by
// the CLI or SQL: its source is config again, and it follows its
// declaration at the next starts.
func (s *Store) Reset(ctx context.Context, name string) (*db.Schedule, error) {
	var row *db.Schedule
	err := s.inDeclarationsTx(ctx, func(q *db.Queries) error {
		declared, err := q.ScheduleDeclared(ctx, name)
		if err != nil {
			return fmt.Errorf("look up declared schedule %q: %w", name, err)
		}
		if !declared {
			return &NotDeclaredError{Name: name}
		}
		if _, err := q.WriteDeclaredSchedule(ctx, db.WriteDeclaredScheduleParams{Name: name, Force: true}); err != nil {
			return fmt.Errorf("reset schedule %q: %w", name, err)
		}
		row, err = q.GetSchedule(ctx, name)
		if err != nil {
			return fmt.Errorf("read schedule %q: %w", name, err)
		}
		return nil
	})
	return row, err
}

// IsDeclared reports whether name is a declared schedule.
func (s *Store) IsDeclared(ctx context.Context, name string) (bool, error) {
	declared, err := db.New(s.pool).ScheduleDeclared(ctx, name)
	if err != nil {
		return false, fmt.Errorf("look up declared schedule %q: %w", name, err)
	}
	return declared, nil
}

// inDeclarationsTx runs fn in a transaction holding schedule_declarations
// locked against other writers, whose schedule changes have source config.
func (s *Store) inDeclarationsTx(ctx context.Context, fn func(q *db.Queries) error) error {
	return pgkit.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		q := db.New(tx)
		if err := q.LockScheduleDeclarations(ctx); err != nil {
			return fmt.Errorf("lock schedule declarations: %w", err)
		}
		if err := q.SetScheduleSource(ctx, SourceConfig); err != nil {
			return fmt.Errorf("set schedule source: %w", err)
		}
		return fn(q)
	})
}

func declarationParams(r DeclaredRow, declaredBy string) db.UpsertScheduleDeclarationParams {
	p := db.UpsertScheduleDeclarationParams{
		Name: r.Name, Cron: r.Cron, Timezone: r.Timezone, Kind: r.Kind, Args: r.Args,
		Queue: optional(r.Queue), Tags: r.Tags, Misfire: r.Misfire, Enabled: r.Enabled,
		DeclaredBy: optional(declaredBy),
	}
	if r.Priority > 0 {
		v := int16(r.Priority)
		p.Priority = &v
	}
	if r.MaxAttempts > 0 {
		v := int32(r.MaxAttempts)
		p.MaxAttempts = &v
	}
	if len(r.Tags) == 0 {
		p.Tags = nil
	}
	return p
}
