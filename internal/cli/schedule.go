package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/kinds"
	"github.com/sluice-dev/sluice/scheduler"
)

func newScheduleCmd(g *globals) *cobra.Command {
	registry := g.registry
	cmd := groupCmd("schedule", "Manage durable schedules (list, add, update, remove, enable, disable, trigger, reset, next)")
	cmd.Long = `schedule manages the rows of the schedules table, from which the dispatcher
of every running worker inserts one River job per due time.

Every change is validated before anything is written: the cron expression
(5 fields, 6 with a leading seconds field, or @hourly-style descriptors and
@every DURATION), the IANA time zone, the kind (one this binary knows) and
its args. An unknown NAME is an input error (exit 2). 'schedule next'
previews the due times of any expression without a database.

Schedules a program declares in Go (Config.Schedules) are rows like any
other, written by every worker at start with source "config". A change made
here (or with SQL) makes the row's source "sql": it wins over the
declaration, across restarts, until 'schedule reset NAME' writes the
declared definition back. A declared schedule cannot be removed (the next
worker would add it back): disable it instead.

Kinds: ` + strings.Join(registry.Names(), ", ")
	cmd.AddCommand(
		newScheduleAddCmd(g, registry),
		newScheduleUpdateCmd(g, registry),
		newScheduleNameCmd(g, registry, "remove", "Delete a schedule (the jobs it inserted stay)", "",
			func(ctx context.Context, s *scheduler.Store, _ *pgxpool.Pool, out io.Writer, name string) error {
				if err := s.Remove(ctx, name); err != nil {
					return err
				}
				fmt.Fprintf(out, "schedule %s removed\n", name)
				return nil
			}),
		newScheduleNameCmd(g, registry, "enable", "Enable a schedule; a failed one becomes active again", enableLong,
			func(ctx context.Context, s *scheduler.Store, _ *pgxpool.Pool, out io.Writer, name string) error {
				row, changed, err := s.Enable(ctx, name)
				if err != nil {
					return err
				}
				if !changed {
					fmt.Fprintf(out, "schedule %s is enabled already (next run at %s)\n", name, fmtTime(row.NextRunAt))
					return nil
				}
				fmt.Fprintf(out, "schedule %s enabled: next run at %s\n", name, fmtTime(row.NextRunAt))
				return nil
			}),
		newScheduleNameCmd(g, registry, "disable", "Disable a schedule (no more runs until enabled)", "",
			func(ctx context.Context, s *scheduler.Store, _ *pgxpool.Pool, out io.Writer, name string) error {
				_, changed, err := s.Disable(ctx, name)
				if err != nil {
					return err
				}
				if !changed {
					fmt.Fprintf(out, "schedule %s is disabled already\n", name)
					return nil
				}
				fmt.Fprintf(out, "schedule %s disabled\n", name)
				return nil
			}),
		newScheduleNameCmd(g, registry, "trigger", "Insert one run of a schedule now; its cadence is unchanged", triggerLong,
			func(ctx context.Context, s *scheduler.Store, pool *pgxpool.Pool, out io.Writer, name string) error {
				client, err := g.insertClient(ctx, pool)
				if err != nil {
					return err
				}
				id, err := s.Trigger(ctx, client, name)
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "schedule %s triggered: job %d\n", name, id)
				return nil
			}),
		newScheduleNameCmd(g, registry, "reset", "Undo changes to a schedule declared in Go: write its declared definition back", resetLong,
			func(ctx context.Context, s *scheduler.Store, _ *pgxpool.Pool, out io.Writer, name string) error {
				row, err := s.Reset(ctx, name)
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "schedule %s reset to its declaration: cron %q in %s, enabled %t\n", name, row.Cron, row.Timezone, row.Enabled)
				return nil
			}),
		newScheduleListCmd(g, registry),
		newScheduleNextCmd(),
	)
	for _, sub := range cmd.Commands() {
		sub.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return asUsage(err) })
	}
	return cmd
}

// scheduleFlags are the definition flags of add and update.
type scheduleFlags struct {
	name, cron, kind, args, tz, queue, misfire string
	maxRetries                                 int
	disabled                                   bool
}

// register adds the flags to fs. add (withName) shows and applies the
// defaults of a new schedule; update shows none: a flag not given leaves its
// field as it is.
func (f *scheduleFlags) register(fs *pflag.FlagSet, withName bool) {
	def := func(v string) string { return map[bool]string{true: v}[withName] }
	if withName {
		fs.StringVar(&f.name, "name", "", "schedule name: letters, digits, _ . : -, at most 128 (required)")
	}
	fs.StringVar(&f.cron, "cron", "", "cron expression: 5 fields, 6 with seconds, @hourly-style descriptor or @every DURATION")
	fs.StringVar(&f.kind, "kind", "", "River job kind to insert")
	fs.StringVar(&f.args, "args", def("{}"), "job args as a JSON object, checked against the kind")
	fs.StringVar(&f.tz, "tz", def(scheduler.DefaultTimezone), "IANA time zone the cron expression is read in")
	fs.StringVar(&f.queue, "queue", "", "queue to insert into (default: the kind's queue)")
	fs.StringVar(&f.misfire, "misfire", def(scheduler.DefaultMisfire), "after missed due times: run_once (one run), skip (none), run_all (each, capped)")
	maxRetries := 0
	if withName {
		maxRetries = scheduler.DefaultMaxRetries
	}
	fs.IntVar(&f.maxRetries, "max-retries", maxRetries, "failed dispatches retried (with backoff) before the schedule is marked failed")
	fs.BoolVar(&f.disabled, "disabled", false, "create (or set) the schedule disabled; --disabled=false enables")
}

const scheduleFlagsHelp = `
Misfire policies, when due times were missed (workers down, or retries):
  run_once  one run for the latest missed due time (the default)
  skip      no run unless the latest due time is within scheduler.misfire_grace
  run_all   one run per missed due time, at most scheduler.run_all_cap (100)

A dispatch that fails (invalid row, failed insert) is retried with
exponential backoff (scheduler.retry_backoff_base, doubling, at most
scheduler.retry_backoff_cap); after max-retries failed retries the schedule
is marked failed until 'sluice schedule enable NAME'.`

func newScheduleAddCmd(g *globals, registry *kinds.Registry) *cobra.Command {
	var f scheduleFlags
	cmd := &cobra.Command{
		Use:   "add --name N --cron C --kind K [--args JSON] [--tz ZONE] [--queue Q] [--misfire run_once|skip|run_all] [--max-retries N] [--disabled]",
		Short: "Add a schedule",
		Long: `add validates the schedule and inserts it with next_run_at, its first due
time after now. Running workers pick it up at once (LISTEN/NOTIFY).
` + scheduleFlagsHelp,
		Args: exactArgs(0, "no arguments (the name goes in --name)"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, req := range []struct{ flag, val string }{{"name", f.name}, {"cron", f.cron}, {"kind", f.kind}} {
				if !cmd.Flags().Changed(req.flag) {
					return usagef("--%s is required", req.flag)
				}
			}
			def := scheduler.Definition{
				Name: f.name, Cron: f.cron, Timezone: f.tz, Kind: f.kind, Args: json.RawMessage(f.args),
				Queue: f.queue, Misfire: f.misfire, MaxRetries: f.maxRetries, Enabled: !f.disabled,
			}
			// Validate before connecting: bad input never needs the database.
			if _, err := scheduler.Validate(registry, def); err != nil {
				return scheduleErr(err)
			}
			return withStore(cmd, g, registry, "sluice schedule add", func(ctx context.Context, s *scheduler.Store, _ *pgxpool.Pool) error {
				row, err := s.Add(ctx, def)
				if err != nil {
					return err
				}
				state := "next run at " + fmtTime(row.NextRunAt)
				if !row.Enabled {
					state = "disabled"
				}
				fmt.Fprintf(cmd.OutOrStdout(), "schedule %s added: %s\n", row.Name, state)
				return nil
			})
		},
	}
	f.register(cmd.Flags(), true)
	return cmd
}

func newScheduleUpdateCmd(g *globals, registry *kinds.Registry) *cobra.Command {
	var f scheduleFlags
	cmd := &cobra.Command{
		Use:   "update NAME [--cron C] [--kind K] [--args JSON] [--tz ZONE] [--queue Q] [--misfire M] [--max-retries N] [--disabled[=false]]",
		Short: "Change fields of a schedule",
		Long: `update changes the given fields of the schedule NAME; the others stay. The
resulting schedule is validated as a whole before anything is written. A new
cron expression or zone recomputes next_run_at from now; --queue "" goes back
to the kind's queue. The status is left as it is: 'sluice schedule enable'
makes a failed schedule active again.
` + scheduleFlagsHelp,
		Args: exactArgs(1, "a schedule NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var p scheduler.Patch
			fs := cmd.Flags()
			if fs.Changed("cron") {
				p.Cron = &f.cron
			}
			if fs.Changed("tz") {
				p.Timezone = &f.tz
			}
			if fs.Changed("kind") {
				p.Kind = &f.kind
			}
			if fs.Changed("args") {
				raw := json.RawMessage(f.args)
				p.Args = &raw
			}
			if fs.Changed("queue") {
				p.Queue = &f.queue
			}
			if fs.Changed("misfire") {
				p.Misfire = &f.misfire
			}
			if fs.Changed("max-retries") {
				p.MaxRetries = &f.maxRetries
			}
			if fs.Changed("disabled") {
				enabled := !f.disabled
				p.Enabled = &enabled
			}
			if p.Empty() {
				return usagef("nothing to update: give at least one of --cron, --kind, --args, --tz, --queue, --misfire, --max-retries, --disabled")
			}
			return withStore(cmd, g, registry, "sluice schedule update", func(ctx context.Context, s *scheduler.Store, _ *pgxpool.Pool) error {
				row, err := s.Update(ctx, args[0], p)
				if err != nil {
					return err
				}
				state := "next run at " + fmtTime(row.NextRunAt)
				if !row.Enabled {
					state = "disabled"
				} else if row.Status == scheduler.StatusFailed {
					state = "still failed: 'sluice schedule enable " + row.Name + "' makes it active again"
				}
				fmt.Fprintf(cmd.OutOrStdout(), "schedule %s updated: %s\n", row.Name, state)
				return nil
			})
		},
	}
	f.register(cmd.Flags(), false)
	return cmd
}

const enableLong = `enable enables a disabled schedule, and makes a failed one (status 'failed'
after max_retries failed retries) active again with failure_count 0 and
last_error cleared. Its cadence starts afresh: next_run_at is the first due
time after now (runs missed while it was disabled or failed are not made up).
The row must be valid (a row written with plain SQL may not be): else exit 2.`

const triggerLong = `trigger inserts one job of the schedule now, in one transaction with the
row's last_run_at, last_job_id and run_count (a trigger counts as a run).
The cadence (next_run_at), the retry state and the status are unchanged,
and a disabled or failed schedule can be triggered too. The job's metadata
names the schedule, with "trigger": true and "due_at" the time of the
trigger.`

const resetLong = `reset writes the definition a program declares in Go (Config.Schedules) for
NAME back into its row, undoing any change made with the CLI or SQL (and
adding the row again if it was deleted with SQL). The row's source is
"config" again: from then on it follows the program's declaration at every
worker start. The declaration is the one the last worker to start wrote
(table schedule_declarations). A NAME no program declares is an input error
(exit 2).`

// newScheduleNameCmd is a subcommand taking one schedule NAME.
func newScheduleNameCmd(g *globals, registry *kinds.Registry, use, short, long string,
	fn func(ctx context.Context, s *scheduler.Store, pool *pgxpool.Pool, out io.Writer, name string) error) *cobra.Command {
	return &cobra.Command{
		Use:   use + " NAME",
		Short: short,
		Long:  long,
		Args:  exactArgs(1, "a schedule NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withStore(cmd, g, registry, "sluice schedule "+use, func(ctx context.Context, s *scheduler.Store, pool *pgxpool.Pool) error {
				return fn(ctx, s, pool, cmd.OutOrStdout(), args[0])
			})
		},
	}
}

func newScheduleListCmd(g *globals, registry *kinds.Registry) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list [--json]",
		Short: "List the schedules",
		Long: `list prints every schedule: name, cron, zone, kind, enabled, status, next run
(next_run_at, UTC: when the dispatcher acts next, a retry's time included),
source (config: declared in Go and following its declaration; sql: written
or changed with the CLI or SQL), next due time, last run (UTC), run count
and last error. NEXT DUE is the
schedule's next due time after the database's now, in the schedule's zone
with its offset, computed by the dispatcher's code (as 'schedule next'
does); it is - for a disabled or failed schedule, and "invalid" for a cron
expression or zone this binary refuses. --json prints every column of the
schedules table and next_due_at as a JSON array. The view
sluice.schedule_status shows the same in SQL, with each schedule's health
and its last job's state.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withStore(cmd, g, registry, "sluice schedule list", func(ctx context.Context, s *scheduler.Store, _ *pgxpool.Pool) error {
				rows, err := s.List(ctx)
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				if asJSON {
					for _, r := range rows {
						toUTC(r.Schedule)
						if r.NextDueAt != nil {
							u := r.NextDueAt.UTC()
							r.NextDueAt = &u
						}
					}
					enc := json.NewEncoder(out)
					enc.SetIndent("", "  ")
					if rows == nil {
						rows = []*scheduler.Listed{}
					}
					return enc.Encode(rows)
				}
				return printSchedules(out, rows)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printSchedules(out io.Writer, rows []*scheduler.Listed) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tCRON\tTIMEZONE\tKIND\tENABLED\tSTATUS\tSOURCE\tNEXT RUN\tNEXT DUE\tLAST RUN\tRUNS\tLAST ERROR")
	for _, r := range rows {
		lastErr := "-"
		if r.LastError != nil {
			lastErr = *r.LastError
			if len(lastErr) > 80 {
				lastErr = lastErr[:77] + "..."
			}
		}
		nextDue := "-"
		switch {
		case r.NextDueErr != nil:
			nextDue = "invalid"
		case r.NextDueAt != nil:
			nextDue = r.NextDueAt.Format(localLayout)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%t\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", r.Name, r.Cron, r.Timezone, r.Kind,
			r.Enabled, r.Status, r.Source, fmtTime(r.NextRunAt), nextDue, fmtTime(r.LastRunAt), r.RunCount, lastErr)
	}
	return tw.Flush()
}

// localLayout is RFC 3339 with the offset always written as digits
// (+00:00, not Z: the time is local, not UTC).
const localLayout = "2006-01-02T15:04:05-07:00"

// maxNextCount bounds schedule next --count.
const maxNextCount = 10_000

func newScheduleNextCmd() *cobra.Command {
	var tz, from string
	var count int
	cmd := &cobra.Command{
		Use:   "next EXPR [--tz ZONE] [--from RFC3339] [--count N]",
		Short: "Print the next due times of a cron expression",
		Long: `next prints the next N due times of the cron expression EXPR (quoted, as one
argument) in the zone --tz, strictly after --from (default: now, by this
machine's clock), one per line: the time in RFC 3339 UTC, then the local
time with its offset. It runs the code the dispatcher runs, so it shows
what a schedule would do on the days the clocks change; @every counts from
--from. It needs no database and writes nothing. A bad expression, zone,
time or count is an input error (exit 2) naming the field.

  sluice schedule next '*/15 2 * * *' --tz America/New_York --from 2026-03-08T00:00:00-05:00 --count 4
  2026-03-08T07:00:00Z  2026-03-08T03:00:00-04:00
  2026-03-08T07:15:00Z  2026-03-08T03:15:00-04:00
  2026-03-08T07:30:00Z  2026-03-08T03:30:00-04:00
  2026-03-08T07:45:00Z  2026-03-08T03:45:00-04:00`,
		Args: exactArgs(1, "one cron EXPR (quote it: '*/15 2 * * *')"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if count < 1 || count > maxNextCount {
				return usagef("invalid --count %d: want 1 to %d", count, maxNextCount)
			}
			t := time.Now()
			if cmd.Flags().Changed("from") {
				var err error
				if t, err = time.Parse(time.RFC3339Nano, from); err != nil {
					return usagef("invalid --from %q: want an RFC 3339 time such as 2026-03-08T00:00:00Z or 2026-03-08T00:00:00-05:00", from)
				}
			}
			c, err := scheduler.ParseCron(args[0], tz)
			if err != nil {
				return asUsage(err)
			}
			w := bufio.NewWriter(cmd.OutOrStdout())
			for range count {
				// RFC 3339 ends with year 9999.
				if t = c.Next(t); t.IsZero() || t.UTC().Year() > 9999 {
					fmt.Fprintln(cmd.ErrOrStderr(), "no further due time before the year 10000")
					break
				}
				fmt.Fprintf(w, "%s  %s\n", t.UTC().Format(time.RFC3339), t.In(c.Location()).Format(localLayout))
			}
			return w.Flush()
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&tz, "tz", scheduler.DefaultTimezone, "IANA time zone the expression is read in")
	fs.StringVar(&from, "from", "", "print the due times after this RFC 3339 time (default: now)")
	fs.IntVar(&count, "count", 10, fmt.Sprintf("how many due times to print (1 to %d)", maxNextCount))
	return cmd
}

// withStore checks the global flags, opens a pool and runs fn with a Store;
// the scheduler's input errors become usage errors (exit 2).
func withStore(cmd *cobra.Command, g *globals, registry *kinds.Registry, appName string,
	fn func(ctx context.Context, s *scheduler.Store, pool *pgxpool.Pool) error) error {
	pool, err := g.openPool(cmd, appName)
	if err != nil {
		return err
	}
	defer pool.Close()
	ctx := cmd.Context()
	return scheduleErr(fn(ctx, scheduler.NewStore(pool, registry), pool))
}

// scheduleErr marks the scheduler's input errors as usage errors.
func scheduleErr(err error) error {
	var fieldErr *scheduler.FieldError
	var notFound *scheduler.NotFoundError
	var exists *scheduler.ExistsError
	var invalidRow *scheduler.InvalidRowError
	var notDeclared *scheduler.NotDeclaredError
	var declared *scheduler.DeclaredRemoveError
	if errors.As(err, &fieldErr) || errors.As(err, &notFound) || errors.As(err, &exists) || errors.As(err, &invalidRow) ||
		errors.As(err, &notDeclared) || errors.As(err, &declared) {
		return asUsage(err)
	}
	return err
}

func fmtTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func toUTC(r *db.Schedule) {
	for _, p := range []**time.Time{&r.NextRunAt, &r.LastRunAt, &r.RetryDueAt, &r.LastDispatchedAt} {
		if *p != nil {
			u := (*p).UTC()
			*p = &u
		}
	}
	r.CreatedAt, r.UpdatedAt = r.CreatedAt.UTC(), r.UpdatedAt.UTC()
}
