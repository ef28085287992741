package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/riverqueue/river/rivertype"
	"github.com/spf13/cobra"
)

func newJobsShowCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show ID [--json]",
		Short: "Show a River job: args, metadata, attempts, errors, parking",
		Long: `show prints one River job (River's JobGet): its kind, queue, state, priority,
attempts, tags, times, args and metadata, the error of every failed attempt
(with the stack trace of a panic), and, when it waits for a concurrency
slot, its parking: why and since when it waits, which worker parked it, its
place in its kind's line and the kind's limit. An unknown ID exits 1.`,
		Args: exactArgs(1, "a job ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			pool, client, err := g.openClient(cmd, "sluice jobs show")
			if err != nil {
				return err
			}
			defer pool.Close()
			ctx := cmd.Context()
			job, err := client.JobGet(ctx, id)
			if errors.Is(err, rivertype.ErrNotFound) {
				return noJobs([]int64{id})
			}
			if err != nil {
				return fmt.Errorf("get job %d: %w", id, err)
			}
			v := newJobView(job)
			if err := addParking(ctx, pool, []*jobView{v}); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(v)
			}
			return writeJob(out, v)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// writeJob prints a job for people: one field a line, then its errors.
func writeJob(out io.Writer, v *jobView) error {
	orDash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	at := func(t *time.Time) string {
		if t == nil {
			return "-"
		}
		return t.UTC().Format(time.RFC3339Nano)
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "id:\t%d\n", v.ID)
	fmt.Fprintf(tw, "kind:\t%s\n", v.Kind)
	fmt.Fprintf(tw, "queue:\t%s\n", v.Queue)
	fmt.Fprintf(tw, "state:\t%s\n", v.stateText())
	fmt.Fprintf(tw, "priority:\t%d\n", v.Priority)
	fmt.Fprintf(tw, "attempt:\t%d of %d\n", v.Attempt, v.MaxAttempts)
	fmt.Fprintf(tw, "tags:\t%s\n", orDash(strings.Join(v.Tags, ", ")))
	fmt.Fprintf(tw, "created at:\t%s\n", at(&v.CreatedAt))
	fmt.Fprintf(tw, "scheduled at:\t%s\n", at(&v.ScheduledAt))
	fmt.Fprintf(tw, "attempted at:\t%s\n", at(v.AttemptedAt))
	fmt.Fprintf(tw, "attempted by:\t%s\n", orDash(strings.Join(v.AttemptedBy, ", ")))
	fmt.Fprintf(tw, "finalized at:\t%s\n", at(v.FinalizedAt))
	fmt.Fprintf(tw, "args:\t%s\n", v.Args)
	fmt.Fprintf(tw, "metadata:\t%s\n", v.Metadata)
	if p := describePolicy(v.Metadata); p != "" {
		fmt.Fprintf(tw, "enqueue policy:\t%s\n", p)
	}
	if v.Parking != nil {
		fmt.Fprintf(tw, "parking:\t%s\n", v.Parking.describe(v.Kind))
	}
	if v.Waiting != nil {
		fmt.Fprintf(tw, "waiting:\t%s\n", v.Waiting.describe())
	}
	if len(v.Errors) == 0 {
		fmt.Fprintf(tw, "errors:\tnone\n")
	} else {
		fmt.Fprintf(tw, "errors:\t%d\n", len(v.Errors))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, e := range v.Errors {
		fmt.Fprintf(out, "  attempt %d at %s: %s\n", e.Attempt, e.At.UTC().Format(time.RFC3339Nano), e.Error)
		if e.Trace != "" {
			for _, line := range strings.Split(strings.TrimRight(e.Trace, "\n"), "\n") {
				fmt.Fprintf(out, "      %s\n", line)
			}
		}
	}
	return nil
}
