package cli

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/limiter"
)

func newLimitsCmd(g *globals) *cobra.Command {
	cmd := groupCmd("limits", "List, set and clear global concurrency limits per job kind")
	cmd.Long = `A concurrency limit caps how many jobs of a kind run at once across every
worker. N > 0: at most N at once (the others are parked, FIFO, and resumed as
slots free up); 0: unlimited; N < 0: circuit breaker (every job of the kind is
parked and none is resumed until the limit is raised). No row: unlimited.
Workers pick up a change within a second.`
	var asJSON bool
	list := &cobra.Command{
		Use:   "list [--json]",
		Short: "List limits with admitted and parked jobs per kind",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, err := g.openPool(cmd, "sluice limits")
			if err != nil {
				return err
			}
			defer pool.Close()
			rows, err := db.New(pool).ConcurrencyOverview(cmd.Context())
			if err != nil {
				return fmt.Errorf("read concurrency overview: %w", err)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				if rows == nil {
					rows = []*db.ConcurrencyOverviewRow{}
				}
				return json.NewEncoder(out).Encode(rows)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "KIND\tLIMIT\tADMITTED\tPARKED\tOLDEST PARKED")
			for _, r := range rows {
				oldest := "-"
				if r.Parked > 0 {
					oldest = (time.Duration(r.OldestParkedSeconds * float64(time.Second))).Round(time.Second).String()
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\n", r.Kind, describeLimit(r.MaxConcurrency), r.Admitted, r.Parked, oldest)
			}
			return tw.Flush()
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	set := &cobra.Command{
		Use:   "set KIND N",
		Short: "Set the limit of KIND: N > 0 limit, 0 unlimited, N < 0 circuit breaker",
		Args:  exactArgs(2, "a job KIND and a limit N"),
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, err := limitableKind(g, args[0])
			if err != nil {
				return err
			}
			n, err := strconv.ParseInt(args[1], 10, 32)
			if err != nil || n < math.MinInt32 || n > math.MaxInt32 {
				return usagef("invalid limit %q: want an integer (N > 0 limit, 0 unlimited, N < 0 circuit breaker)", args[1])
			}
			pool, err := g.openPool(cmd, "sluice limits")
			if err != nil {
				return err
			}
			defer pool.Close()
			row, err := db.New(pool).SetConcurrencyLimit(cmd.Context(), db.SetConcurrencyLimitParams{Kind: kind, MaxConcurrency: int32(n)})
			if err != nil {
				return fmt.Errorf("set limit of %s: %w", kind, err)
			}
			limit := row.MaxConcurrency
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", row.Kind, describeLimit(&limit))
			return nil
		},
	}

	clear := &cobra.Command{
		Use:   "clear KIND",
		Short: "Remove the limit of KIND (unlimited; parked jobs are resumed)",
		Args:  exactArgs(1, "a job KIND"),
		RunE: func(cmd *cobra.Command, args []string) error {
			kind := args[0]
			pool, err := g.openPool(cmd, "sluice limits")
			if err != nil {
				return err
			}
			defer pool.Close()
			cleared, err := limiter.ClearLimit(cmd.Context(), pool, kind)
			if err != nil {
				return err
			}
			if !cleared {
				return usagef("no limit is set for %q", kind)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: unlimited (limit removed)\n", kind)
			return nil
		},
	}
	// "set KIND -1": a negative limit is an argument, not a flag.
	set.Flags().SetInterspersed(false)
	cmd.AddCommand(list, set, clear)
	return cmd
}

func newParkedCmd(g *globals) *cobra.Command {
	cmd := groupCmd("parked", "Inspect jobs parked by concurrency limits")
	var asJSON bool
	var max int
	list := &cobra.Command{
		Use:   "list [KIND] [--json] [--max N]",
		Short: "List parked jobs, oldest first (FIFO), of one kind or all",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usagef("%s expects at most one KIND, got %d arguments", cmd.CommandPath(), len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			kind := ""
			if len(args) == 1 {
				if _, err := g.registry.Lookup(args[0]); err != nil {
					return err
				}
				kind = args[0]
			}
			if max < 1 || max > 100000 {
				return usagef("invalid --max %d: want 1 to 100000", max)
			}
			pool, err := g.openPool(cmd, "sluice parked")
			if err != nil {
				return err
			}
			defer pool.Close()
			rows, err := db.New(pool).ListParkedJobs(cmd.Context(), db.ListParkedJobsParams{Kind: kind, MaxRows: int32(max)})
			if err != nil {
				return fmt.Errorf("list parked jobs: %w", err)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				if rows == nil {
					rows = []*db.ListParkedJobsRow{}
				}
				return json.NewEncoder(out).Encode(rows)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "JOB ID\tKIND\tQUEUE\tSTATE\tREASON\tPARKED AT\tWAITING\tARGS")
			for _, r := range rows {
				waited := time.Duration(r.WaitingSeconds * float64(time.Second)).Round(time.Second)
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.JobID, r.Kind, r.Queue, r.State, r.Reason,
					r.ParkedAt.UTC().Format(time.RFC3339), waited, r.Args)
			}
			return tw.Flush()
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	list.Flags().IntVar(&max, "max", 100, "list at most N jobs")
	cmd.AddCommand(list)
	return cmd
}

// limitableKind checks that kind is known and may be limited.
func limitableKind(g *globals, kind string) (string, error) {
	if _, err := g.registry.Lookup(kind); err != nil {
		return "", err
	}
	if kind == limiter.ResumeKind {
		return "", usagef("%s is never limited: it is what resumes parked jobs", kind)
	}
	return kind, nil
}

func describeLimit(limit *int32) string {
	switch {
	case limit == nil || *limit == 0:
		return "unlimited"
	case *limit < 0:
		return fmt.Sprintf("%d (circuit breaker)", *limit)
	default:
		return strconv.Itoa(int(*limit))
	}
}
