package cli

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/maintenance"
)

// maxJobList is the most jobs `jobs list` prints (River's JobList bound).
const maxJobList = 10000

// listArgsWidth bounds the args a table row shows.
const listArgsWidth = 60

// maxKindLen bounds a --kind filter (River's kinds are short identifiers).
const maxKindLen = 256

func newJobsListCmd(g *globals) *cobra.Command {
	var (
		states, kinds []string
		queue         string
		limit         int
		asJSON, all   bool
	)
	cmd := &cobra.Command{
		Use:   "list [--state S] [--kind K] [--queue Q] [--limit N] [--all] [--json]",
		Short: "List River jobs, newest first",
		Long: `list prints River jobs, newest first (River's JobList, by id descending),
at most --limit of them: id, kind, queue, state (a job waiting for a
concurrency slot is "pending (parked)", or "running (waiting for a slot)"
while it waits in its worker and does no work yet), attempt, priority,
when it is scheduled and its args. --json prints every field, errors,
parking and waiting included, as 'jobs show --json' does.

--state and --kind may be given several times or as a comma-separated list;
a job matches any of them. States are River's: ` + strings.Join(jobStateNames(), ", ") + `.
A kind must be one this program knows; a queue name must follow River's rule.

sluice's own housekeeping jobs (the kinds of the maintenance queue: ` + strings.Join(ownKinds(g), ", ") + `)
are left out unless --all is given, or --kind or --queue names them.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			params := river.NewJobListParams().OrderBy(river.JobListOrderByID, river.SortOrderDesc)
			if len(states) > 0 {
				valid := jobStateNames()
				var ss []rivertype.JobState
				for _, s := range states {
					if !slices.Contains(valid, s) {
						return usagef("invalid --state %q: want one of %s", s, strings.Join(valid, ", "))
					}
					ss = append(ss, rivertype.JobState(s))
				}
				params = params.States(ss...)
			}
			if len(kinds) > 0 {
				for _, k := range kinds {
					if k == "" || strings.ContainsFunc(k, unicode.IsSpace) || len(k) > maxKindLen {
						return usagef("invalid --kind %q: want a job kind (no spaces, at most %d characters)", k, maxKindLen)
					}
					if !g.registry.Has(k) {
						// Jobs of any kind are listed: an application's, a
						// retired kind's; the note only says this program
						// would not work them.
						fmt.Fprintf(cmd.ErrOrStderr(), "note: %q is not a kind this program knows\n", k)
					}
				}
				params = params.Kinds(kinds...)
			}
			if queue != "" {
				if err := app.ValidateQueueName(queue); err != nil {
					return usagef("invalid --queue: %v", err)
				}
				params = params.Queues(queue)
			}
			if !all && len(kinds) == 0 && queue == "" {
				// A predicate on River's own JobList query: jobs of any
				// kind but sluice's housekeeping ones, unknown kinds
				// included.
				params = params.Where("NOT (kind = any(@sluice_own_kinds::text[]))",
					river.NamedArgs{"sluice_own_kinds": ownKinds(g)})
			}
			if limit < 1 || limit > maxJobList {
				return usagef("invalid --limit %d: want 1 to %d", limit, maxJobList)
			}
			params = params.First(limit)

			pool, client, err := g.openClient(cmd, "sluice jobs list")
			if err != nil {
				return err
			}
			defer pool.Close()
			ctx := cmd.Context()
			res, err := client.JobList(ctx, params)
			if err != nil {
				return fmt.Errorf("list jobs: %w", err)
			}
			views := make([]*jobView, len(res.Jobs))
			for i, j := range res.Jobs {
				views[i] = newJobView(j)
			}
			if err := addParking(ctx, pool, views); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(views)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tKIND\tQUEUE\tSTATE\tATTEMPT\tPRIORITY\tSCHEDULED AT\tARGS")
			for _, v := range views {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d/%d\t%d\t%s\t%s\n", v.ID, v.Kind, v.Queue, v.stateText(),
					v.Attempt, v.MaxAttempts, v.Priority, v.ScheduledAt.UTC().Format(time.RFC3339), truncate(string(v.Args), listArgsWidth))
			}
			return tw.Flush()
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&states, "state", nil, "only jobs in these River states")
	f.StringSliceVar(&kinds, "kind", nil, "only jobs of these kinds")
	f.StringVar(&queue, "queue", "", "only jobs of this queue")
	f.IntVar(&limit, "limit", 100, fmt.Sprintf("list at most N jobs (1 to %d)", maxJobList))
	f.BoolVar(&asJSON, "json", false, "print JSON")
	f.BoolVar(&all, "all", false, "also list sluice's own housekeeping jobs (maintenance queue)")
	return cmd
}

// ownKinds are sluice's own housekeeping kinds among the program's: those
// of the maintenance queue (the limiter's safety net, maintenance runs,
// monitors).
func ownKinds(g *globals) []string {
	var own []string
	for _, k := range g.registry.Kinds() {
		if k.DefaultQueue() == maintenance.Queue {
			own = append(own, k.Name)
		}
	}
	return own
}

// jobStateNames are River's job states.
func jobStateNames() []string {
	var names []string
	for _, s := range rivertype.JobStates() {
		names = append(names, string(s))
	}
	slices.Sort(names)
	return names
}

// truncate shortens s to at most n runes, marking the cut with "…".
func truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}
