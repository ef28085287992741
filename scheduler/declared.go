package scheduler

import (
	"encoding/json"
	"fmt"
	"regexp"

	"github.com/riverqueue/river"

	"github.com/sluice-dev/sluice/kinds"
)

// Declared is a schedule a program declares in Go (sluice.Schedule,
// Config.Schedules): a durable row of the schedules table that every worker
// writes at start with source "config", run by the dispatcher exactly once
// per due time like any other schedule.
//
// Coming from River, a periodic job is one line:
//
//	river.NewPeriodicJob(river.PeriodicInterval(15*time.Minute),
//	    func() (river.JobArgs, *river.InsertOpts) { return SyncArgs{}, nil }, nil)
//	// becomes
//	sluice.Schedule{Name: "sync", Cron: "@every 15m", Args: SyncArgs{}}
type Declared struct {
	// Name identifies the schedule (letters, digits, _ . : -, at most 128),
	// as in `sluice schedule list`.
	Name string
	// Cron is the expression: 5 fields, 6 with seconds, a descriptor such
	// as @daily, or @every 15m.
	Cron string
	// Timezone is the IANA zone Cron is read in (default UTC).
	Timezone string
	// Args are the args of every job inserted: their kind must be one the
	// program works, and they must pass their Validate() where they have
	// one.
	Args river.JobArgs
	// InsertOpts are the options of every job inserted: Queue, Priority,
	// MaxAttempts and Tags (nil or zero: the kind's own). The other options
	// (ScheduledAt, Pending, UniqueOpts, Metadata) make no sense for a
	// schedule and are refused.
	InsertOpts *river.InsertOpts
	// Misfire is what a dispatch does when more than one due time has
	// passed: MisfireRunOnce (default), MisfireSkip or MisfireRunAll.
	Misfire string
	// Disabled declares the schedule switched off: its row is written but
	// not dispatched.
	Disabled bool
}

// DeclaredRow is a Declared schedule as it is stored: validated, with its
// args encoded and its insert options spelled out.
type DeclaredRow struct {
	Definition
	// Priority, MaxAttempts and Tags of every job inserted (0 and nil: the
	// kind's own).
	Priority, MaxAttempts int
	Tags                  []string
}

// tagRE is River's rule for tags (river.InsertOpts.Tags).
var tagRE = regexp.MustCompile(`\A[\w][\w\-]+[\w]\z`)

// CompileDeclared validates the declared schedules against the program's
// kinds: a valid name each, used once; a valid cron and zone; args of a
// known kind that pass their validation; insert options a schedule can
// use. The error names the schedule.
func CompileDeclared(registry *kinds.Registry, decls []Declared) ([]DeclaredRow, error) {
	rows := make([]DeclaredRow, 0, len(decls))
	seen := map[string]bool{}
	for i, d := range decls {
		row, err := compileDeclared(registry, d)
		if err != nil {
			name := d.Name
			if name == "" {
				name = fmt.Sprintf("#%d (no name)", i+1)
			}
			return nil, fmt.Errorf("sluice: Config.Schedules: schedule %s: %w", name, err)
		}
		if seen[d.Name] {
			return nil, fmt.Errorf("sluice: Config.Schedules: schedule %s is declared twice", d.Name)
		}
		seen[d.Name] = true
		rows = append(rows, row)
	}
	return rows, nil
}

func compileDeclared(registry *kinds.Registry, d Declared) (DeclaredRow, error) {
	if d.Args == nil {
		return DeclaredRow{}, &FieldError{Field: "args", Reason: "Args is nil: give the typed args of the job to insert (its kind comes from them)"}
	}
	raw, err := json.Marshal(d.Args)
	if err != nil {
		return DeclaredRow{}, &FieldError{Field: "args", Reason: fmt.Sprintf("encode %T: %v", d.Args, err), Err: err}
	}
	def := Definition{Name: d.Name, Cron: d.Cron, Timezone: d.Timezone, Kind: d.Args.Kind(), Args: raw,
		Misfire: d.Misfire, MaxRetries: DefaultMaxRetries, Enabled: !d.Disabled}
	row := DeclaredRow{}
	if o := d.InsertOpts; o != nil {
		switch {
		case !o.ScheduledAt.IsZero():
			return row, &FieldError{Field: "InsertOpts.ScheduledAt", Value: o.ScheduledAt.String(), Reason: "a schedule's jobs are inserted at their due times"}
		case o.Pending:
			return row, &FieldError{Field: "InsertOpts.Pending", Value: "true", Reason: "a schedule's jobs are inserted to run"}
		case o.UniqueOpts.ByArgs || o.UniqueOpts.ByPeriod != 0 || o.UniqueOpts.ByQueue || len(o.UniqueOpts.ByState) > 0:
			return row, &FieldError{Field: "InsertOpts.UniqueOpts", Value: "set", Reason: "the dispatcher inserts one job per due time already"}
		case len(o.Metadata) > 0:
			return row, &FieldError{Field: "InsertOpts.Metadata", Value: string(o.Metadata), Reason: "the dispatcher writes a job's metadata (the schedule and its due time)"}
		case o.Priority < 0 || o.Priority > 4:
			return row, &FieldError{Field: "InsertOpts.Priority", Value: fmt.Sprint(o.Priority), Reason: "want 1 to 4 (0: the kind's own)"}
		case o.MaxAttempts < 0 || o.MaxAttempts > 10000:
			return row, &FieldError{Field: "InsertOpts.MaxAttempts", Value: fmt.Sprint(o.MaxAttempts), Reason: "want 1 to 10000 (0: the kind's own)"}
		}
		for _, tag := range o.Tags {
			if len(tag) > 255 || !tagRE.MatchString(tag) {
				return row, &FieldError{Field: "InsertOpts.Tags", Value: tag, Reason: "want letters, digits, _ and - (not first or last), at most 255 characters, as River's tags"}
			}
		}
		def.Queue = o.Queue
		row.Priority, row.MaxAttempts, row.Tags = o.Priority, o.MaxAttempts, o.Tags
	}
	c, err := Validate(registry, def)
	if err != nil {
		return row, err
	}
	row.Definition = c.Definition
	return row, nil
}
