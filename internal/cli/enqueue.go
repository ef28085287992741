package cli

import (
	"bytes"
	"fmt"
	"math"
	"regexp"
	"strings"
	"time"

	"github.com/riverqueue/river"
	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice/app"
)

// tagRE is River's rule for tags (river.tagRE): word characters and inner
// hyphens, at least three characters, at most maxTagLen.
var tagRE = regexp.MustCompile(`\A[\w][\w\-]+[\w]\z`)

// maxTagLen is River's longest tag.
const maxTagLen = 255

// enqueueFlags are the insert options `sluice enqueue` takes.
type enqueueFlags struct {
	args, queue, at  string
	in, uniquePeriod time.Duration
	priority         int
	maxAttempts      int
	tags             []string
	uniqueByArgs     bool
}

func newEnqueueCmd(g *globals) *cobra.Command {
	var f enqueueFlags
	registry := g.registry
	cmd := &cobra.Command{
		Use:   "enqueue KIND [--args JSON] [--queue Q] [--priority N] [--max-attempts N] [--tags T,...] [--at RFC3339 | --in DURATION] [--unique-by-args] [--unique-period DURATION]",
		Short: "Insert a River job of KIND and print its id",
		Long: `enqueue inserts one River job for the workers to pick up and prints its id.
The args are checked against KIND, and every option against River's rules,
before anything is written; options not given keep the kind's own
InsertOpts, else the program's River config (sluice.Config.River, such as
its MaxAttempts), else River's defaults (queue default, priority 1, 25
attempts). The River client is built with the program's River config as a
worker's is: its insert middleware and hooks see the insert.

--unique-by-args and --unique-period make the insert unique as River's
UniqueOpts do (ByArgs, ByPeriod), among jobs in River's default unique
states (every state but cancelled and discarded; a parked job counts, as
pending): when such a job exists, nothing is inserted and enqueue prints
that job's id instead, saying so on stderr. Either may be given alone:
--unique-period alone allows one job of the kind per period.

Kinds: ` + strings.Join(registry.Names(), ", "),
		Args: exactArgs(1, "a job KIND"),
		RunE: func(cmd *cobra.Command, args []string) error {
			jobArgs, err := registry.Decode(args[0], []byte(f.args))
			if err != nil {
				return err
			}
			opts, err := f.insertOpts(cmd, time.Now())
			if err != nil {
				return err
			}
			pool, client, err := g.openClient(cmd, "sluice enqueue")
			if err != nil {
				return err
			}
			defer pool.Close()
			res, err := client.Insert(cmd.Context(), jobArgs, opts)
			if err != nil {
				return fmt.Errorf("insert %s job: %w", args[0], err)
			}
			fmt.Fprintln(cmd.OutOrStdout(), res.Job.ID)
			switch {
			case res.UniqueSkippedAsDuplicate && bytes.Contains(res.Job.Metadata, []byte(`"sluice_policy"`)):
				fmt.Fprintf(cmd.ErrOrStderr(), "sluice: no new job: the enqueue policy of %s answered with job %d (%s), waiting for the same key "+
					"(discard: it keeps its args; replace, debounce: it took these)\n", res.Job.Kind, res.Job.ID, res.Job.State)
			case res.UniqueSkippedAsDuplicate:
				fmt.Fprintf(cmd.ErrOrStderr(), "sluice: not inserted: job %d (%s, %s) is its duplicate\n",
					res.Job.ID, res.Job.Kind, res.Job.State)
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&f.args, "args", "{}", "job args as a JSON object")
	fs.StringVar(&f.queue, "queue", "", "queue to insert into (default: the kind's queue)")
	fs.IntVar(&f.priority, "priority", 0, "priority from 1 (first) to 4 (last) (default: the kind's, else 1)")
	fs.IntVar(&f.maxAttempts, "max-attempts", 0, "attempts before the job is discarded, 1 to 32767 (default: the kind's, else the program's River config's MaxAttempts, else 25)")
	fs.StringSliceVar(&f.tags, "tags", nil, "tags (River's rule: letters, digits, _ and inner -, 3 to 255 characters)")
	fs.StringVar(&f.at, "at", "", "run no earlier than this RFC 3339 time")
	fs.DurationVar(&f.in, "in", 0, "run no earlier than this long from now, such as 90s or 2h")
	fs.BoolVar(&f.uniqueByArgs, "unique-by-args", false, "insert nothing when a job of the kind with the same args exists (River's UniqueOpts.ByArgs)")
	fs.DurationVar(&f.uniquePeriod, "unique-period", 0, "insert nothing when a job of the kind exists in the same period of this length, at least 1s (River's UniqueOpts.ByPeriod)")
	return cmd
}

// insertOpts checks the options given on cmd and returns River's
// InsertOpts; now is the time --in counts from.
func (f *enqueueFlags) insertOpts(cmd *cobra.Command, now time.Time) (*river.InsertOpts, error) {
	changed := cmd.Flags().Changed
	opts := &river.InsertOpts{Queue: f.queue, Priority: f.priority, MaxAttempts: f.maxAttempts}
	if changed("queue") {
		if err := app.ValidateQueueName(f.queue); err != nil {
			return nil, usagef("invalid --queue %q: want lowercase letters and digits separated by _ or -, at most 64 characters", f.queue)
		}
	}
	if changed("priority") && (f.priority < 1 || f.priority > 4) {
		return nil, usagef("invalid --priority %d: want 1 (first) to 4 (last)", f.priority)
	}
	if changed("max-attempts") && (f.maxAttempts < 1 || f.maxAttempts > math.MaxInt16) {
		return nil, usagef("invalid --max-attempts %d: want 1 to %d", f.maxAttempts, math.MaxInt16)
	}
	if changed("tags") {
		for _, tag := range f.tags {
			if len(tag) > maxTagLen || !tagRE.MatchString(tag) {
				return nil, usagef("invalid --tags %q: want letters, digits, _ and inner -, 3 to %d characters (River's rule)", tag, maxTagLen)
			}
		}
		opts.Tags = f.tags
	}
	switch {
	case changed("at") && changed("in"):
		return nil, usagef("--at and --in both say when to run: give one")
	case changed("at"):
		t, err := time.Parse(time.RFC3339, f.at)
		if err != nil {
			return nil, usagef("invalid --at %q: want an RFC 3339 time such as 2026-01-02T15:04:05Z", f.at)
		}
		opts.ScheduledAt = t
	case changed("in"):
		if f.in <= 0 {
			return nil, usagef("invalid --in %s: want a positive duration such as 90s or 2h", f.in)
		}
		opts.ScheduledAt = now.Add(f.in)
	}
	if changed("unique-period") && f.uniquePeriod < time.Second {
		return nil, usagef("invalid --unique-period %s: want at least 1s", f.uniquePeriod)
	}
	opts.UniqueOpts = river.UniqueOpts{ByArgs: f.uniqueByArgs, ByPeriod: f.uniquePeriod}
	return opts, nil
}
