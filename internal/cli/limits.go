package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/kinds"
	"github.com/sluice-dev/sluice/limiter"
)

func newLimitsCmd(g *globals) *cobra.Command {
	cmd := groupCmd("limits", "List, set and clear concurrency and rate limits per job kind")
	cmd.Long = `A kind's limits hold across every worker, all at once:

  concurrency  limits set KIND N: N > 0 at most N jobs of KIND at once; 0 none
               (and no declared limit either); N < 0 circuit breaker (every
               job parks, none resumes until it is raised).
  per key      limits set KIND N --by-args FIELD[,FIELD...]: at most N at
               once per key, the JSON text of those args fields' values (a
               missing field is null). N = 1: one at a time per key, in order.
  rate         limits rate KIND N/DURATION [--by-args FIELD...]: at most N
               starts in any window of DURATION (sliding), per key with
               --by-args. A start is a real execution: retries count, parking
               does not.

A job held by a limit waits: running in its worker (River's state running,
doing no work yet: limits list counts it WAITING, jobs list marks it
"waiting for a slot"), or parked in place (the same River job, pending).
Jobs start in job-id order within a key, round-robin across keys when the
per-kind limit or a rate is what holds them. A limit set here wins over one
the program declares in Go until it is cleared. Workers pick up a change
within a second. Raising a limit, lifting a breaker or clearing one facet
resumes only what the new limits let start, oldest first, each with a slot
reserved; the rest resume as slots free. Clearing every limit of a kind
resumes all its parked jobs.`
	var asJSON bool
	list := &cobra.Command{
		Use:   "list [--json]",
		Short: "List every limit of every kind, with its source and what it holds",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, err := g.openPool(cmd, "sluice limits")
			if err != nil {
				return err
			}
			defer pool.Close()
			rows, err := db.New(pool).ListLimits(cmd.Context())
			if err != nil {
				return fmt.Errorf("read the limits: %w", err)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				docs := make([]limitDoc, 0, len(rows))
				for _, r := range rows {
					docs = append(docs, limitDocOf(r))
				}
				return json.NewEncoder(out).Encode(docs)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "KIND\tLIMIT\tVALUE\tSOURCE\tIN USE\tWORKING\tWAITING\tPARKED\tPARKED KEYS\tOLDEST PARKED")
			for _, r := range rows {
				oldest := "-"
				if r.Parked > 0 {
					oldest = (time.Duration(r.OldestParkedSeconds * float64(time.Second))).Round(time.Second).String()
				}
				tail := fmt.Sprintf("%d\t%d\t%d\t%d\t%d\t%s", r.Admitted, r.Working, r.Waiting, r.Parked, r.ParkedKeys, oldest)
				lines := 0
				if r.MaxConcurrency != 0 || r.MaxSource != nil {
					fmt.Fprintf(tw, "%s\tconcurrency\t%s\t%s\t%s\n", r.Kind, describeLimit(&r.MaxConcurrency), sourceOf(r.MaxSource), tail)
					lines++
				}
				if r.KeyMax != nil {
					fmt.Fprintf(tw, "%s\tper key\t%d by %s\t%s\t%s\n", r.Kind, *r.KeyMax, strings.Join(r.PartitionFields, ","),
						sourceOf(r.KeySource), tail)
					lines++
				}
				if r.RateMax != nil {
					v := limiter.Rate{Max: *r.RateMax, Per: time.Duration(r.RatePeriodMs) * time.Millisecond}.String()
					if r.RatePerKey {
						v += " per " + strings.Join(r.PartitionFields, ",")
					}
					fmt.Fprintf(tw, "%s\trate\t%s (%d in window)\t%s\t%s\n", r.Kind, v, r.StartsInWindow, sourceOf(r.RateSource), tail)
					lines++
				}
				if lines == 0 {
					// Slots or parked jobs left by a limit that is gone.
					fmt.Fprintf(tw, "%s\tnone\t-\t-\t%s\n", r.Kind, tail)
				}
			}
			return tw.Flush()
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	var byArgs []string
	set := &cobra.Command{
		Use:   "set KIND N [--by-args FIELD[,FIELD...]]",
		Short: "Set the concurrency limit of KIND (N > 0 limit, 0 none, N < 0 circuit breaker), or per key with --by-args",
		// Parsed by RunE: a negative N ("set KIND -1") is an argument, not
		// a flag, wherever the flags go.
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			args, err := parseKeepingNegatives(cmd, args)
			if err != nil || args == nil {
				return err
			}
			if err := exactArgs(2, "a job KIND and a limit N")(cmd, args); err != nil {
				return err
			}
			k, err := limitableKind(g, args[0])
			if err != nil {
				return err
			}
			n, err := strconv.ParseInt(args[1], 10, 32)
			if err != nil || n < math.MinInt32 || n > math.MaxInt32 {
				return usagef("invalid limit %q: want an integer (N > 0 limit, 0 none, N < 0 circuit breaker)", args[1])
			}
			if len(byArgs) > 0 {
				if err := limiter.ValidateByArgs(k, byArgs); err != nil {
					return asUsage(err)
				}
				if n <= 0 {
					return usagef("invalid per-key limit %d: want at least 1 (remove it with limits clear %s --per-key)", n, k.Name)
				}
			}
			lim, pool, err := openLimiter(g, cmd)
			if err != nil {
				return err
			}
			defer pool.Close()
			out := cmd.OutOrStdout()
			if len(byArgs) > 0 {
				if err := lim.SetPerKey(cmd.Context(), k.Name, byArgs, int32(n)); err != nil {
					return limitErr(err)
				}
				fmt.Fprintf(out, "%s: at most %d at once per %s\n", k.Name, n, strings.Join(byArgs, ","))
				return nil
			}
			if err := lim.SetConcurrency(cmd.Context(), k.Name, int32(n)); err != nil {
				return limitErr(err)
			}
			limit := int32(n)
			fmt.Fprintf(out, "%s: %s\n", k.Name, describeLimit(&limit))
			return nil
		},
	}
	set.Flags().StringSliceVar(&byArgs, "by-args", nil, "a per-key limit: at most N at once per distinct value of these top-level args fields")

	var rateByArgs []string
	rate := &cobra.Command{
		Use:   "rate KIND N/DURATION [--by-args FIELD[,FIELD...]]",
		Short: "Set the rate limit of KIND: at most N starts in any window of DURATION (per key with --by-args)",
		Args:  exactArgs(2, "a job KIND and a rate N/DURATION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			k, err := limitableKind(g, args[0])
			if err != nil {
				return err
			}
			r, err := limiter.ParseRate(args[1])
			if err != nil {
				return asUsage(err)
			}
			if len(rateByArgs) > 0 {
				if err := limiter.ValidateByArgs(k, rateByArgs); err != nil {
					return asUsage(err)
				}
				r.PerKey = true
			}
			lim, pool, err := openLimiter(g, cmd)
			if err != nil {
				return err
			}
			defer pool.Close()
			if err := lim.SetRate(cmd.Context(), k.Name, r, rateByArgs); err != nil {
				return limitErr(err)
			}
			per := ""
			if r.PerKey {
				per = " per " + strings.Join(rateByArgs, ",")
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: at most %d starts in any %s%s\n", k.Name, r.Max, r.Per, per)
			return nil
		},
	}
	rate.Flags().StringSliceVar(&rateByArgs, "by-args", nil, "a per-key rate: the rate holds per distinct value of these top-level args fields")

	var facets limiter.Facets
	clear := &cobra.Command{
		Use:   "clear KIND [--concurrency] [--per-key] [--rate]",
		Short: "Remove limits of KIND (all of them, or those named); the jobs they held resume at once",
		Long: `clear removes the limits named (none named: every limit of KIND). A limit
the program declares in Go falls back to its declared value; any other is
gone, and the jobs it held resume at once, oldest first, as far as the
kind's other limits let them. No such limit set: exit 2.`,
		Args: exactArgs(1, "a job KIND"),
		RunE: func(cmd *cobra.Command, args []string) error {
			kind := args[0]
			lim, pool, err := openLimiter(g, cmd)
			if err != nil {
				return err
			}
			defer pool.Close()
			found, err := lim.ClearLimits(cmd.Context(), kind, facets)
			if err != nil {
				return limitErr(err)
			}
			if !found.Any() {
				return usagef("no such limit is set for %q", kind)
			}
			var names []string
			for _, f := range []struct {
				on   bool
				name string
			}{{found.Concurrency, "concurrency"}, {found.PerKey, "per-key"}, {found.Rate, "rate"}} {
				if f.on {
					names = append(names, f.name)
				}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %s limit cleared\n", kind, strings.Join(names, ", "))
			return nil
		},
	}
	clear.Flags().BoolVar(&facets.Concurrency, "concurrency", false, "clear the per-kind concurrency limit")
	clear.Flags().BoolVar(&facets.PerKey, "per-key", false, "clear the per-key concurrency limit")
	clear.Flags().BoolVar(&facets.Rate, "rate", false, "clear the rate limit")
	cmd.AddCommand(list, set, rate, clear)
	return cmd
}

// limitDoc is one kind's limits in limits list --json.
type limitDoc struct {
	Kind        string      `json:"kind"`
	Concurrency *limitFacet `json:"concurrency,omitempty"`
	PerKey      *limitFacet `json:"per_key,omitempty"`
	Rate        *limitFacet `json:"rate,omitempty"`
	// Admitted counts the slots taken (admitted jobs, reservations, leases).
	Admitted int64 `json:"admitted"`
	// Running counts the kind's River jobs in state running: Working of
	// them do work, Waiting wait in their worker for a slot.
	Running             int64   `json:"running"`
	Working             int64   `json:"working"`
	Waiting             int64   `json:"waiting"`
	Parked              int64   `json:"parked"`
	ParkedKeys          int64   `json:"parked_keys"`
	OldestParkedSeconds float64 `json:"oldest_parked_seconds"`
	StartsInWindow      int64   `json:"starts_in_window"`
}

// limitFacet is one limit of a kind.
type limitFacet struct {
	Max           int32    `json:"max"`
	ByArgs        []string `json:"by_args,omitempty"`
	PeriodSeconds float64  `json:"period_seconds,omitempty"`
	Source        string   `json:"source"`
}

func limitDocOf(r *db.ListLimitsRow) limitDoc {
	d := limitDoc{Kind: r.Kind, Admitted: r.Admitted, Running: r.Running, Working: r.Working, Waiting: r.Waiting,
		Parked: r.Parked, ParkedKeys: r.ParkedKeys,
		OldestParkedSeconds: r.OldestParkedSeconds, StartsInWindow: r.StartsInWindow}
	if r.MaxConcurrency != 0 || r.MaxSource != nil {
		d.Concurrency = &limitFacet{Max: r.MaxConcurrency, Source: sourceOf(r.MaxSource)}
	}
	if r.KeyMax != nil {
		d.PerKey = &limitFacet{Max: *r.KeyMax, ByArgs: r.PartitionFields, Source: sourceOf(r.KeySource)}
	}
	if r.RateMax != nil {
		d.Rate = &limitFacet{Max: *r.RateMax, PeriodSeconds: float64(r.RatePeriodMs) / 1000, Source: sourceOf(r.RateSource)}
		if r.RatePerKey {
			d.Rate.ByArgs = r.PartitionFields
		}
	}
	return d
}

func sourceOf(s *string) string {
	if s == nil {
		return "-"
	}
	return *s
}

// openLimiter opens a pool and a Limiter on it (for changing limits: it
// resumes the jobs a change lets start).
func openLimiter(g *globals, cmd *cobra.Command) (*limiter.Limiter, *pgxpool.Pool, error) {
	logger, err := g.cliLogger()
	if err != nil {
		return nil, nil, err
	}
	pool, err := g.openPool(cmd, "sluice limits")
	if err != nil {
		return nil, nil, err
	}
	lim, err := limiter.New(limiter.Config{Pool: pool, Logger: logger})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	// A change schedules the safety net for the jobs it leaves waiting.
	client, err := g.insertClient(cmd.Context(), pool)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	lim.SetClient(client)
	return lim, pool, nil
}

// limitErr makes an invalid limit a usage error.
func limitErr(err error) error {
	if errors.Is(err, limiter.ErrInvalidLimit) {
		return asUsage(err)
	}
	return err
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
			fmt.Fprintln(tw, "JOB ID\tKIND\tQUEUE\tSTATE\tKEY\tHELD BY\tPARKED AT\tWAITING\tARGS")
			for _, r := range rows {
				waited := time.Duration(r.WaitingSeconds * float64(time.Second)).Round(time.Second)
				key := "-"
				if r.Key != nil {
					key = *r.Key
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.JobID, r.Kind, r.Queue, r.State, key, heldBy(r.Reason),
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
func limitableKind(g *globals, kind string) (kinds.Kind, error) {
	k, err := g.registry.Lookup(kind)
	if err != nil {
		return kinds.Kind{}, err
	}
	if kind == limiter.ResumeKind {
		return kinds.Kind{}, usagef("%s is never limited: it is what resumes parked jobs", kind)
	}
	return k, nil
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

// heldBy says which limit holds a job parked or waiting for reason: one
// text per limit, whether the job met it full (limit) or met older jobs
// waiting for it (fifo), which is the same cause.
func heldBy(reason string) string {
	switch reason {
	case "limit", "fifo":
		return "concurrency limit"
	case "breaker":
		return "circuit breaker"
	case "rate":
		return "rate limit"
	case "key_limit", "key_fifo":
		return "per-key limit"
	case "key_rate":
		return "per-key rate limit"
	default:
		return reason
	}
}

// negativeInt is an argument such as -1: a number, not a flag.
var negativeInt = regexp.MustCompile(`^-[0-9]+$`)

// parseKeepingNegatives parses cmd's flags from args (cmd has
// DisableFlagParsing) with negative numbers kept as arguments, and returns
// the arguments; nil, nil when it printed the help.
func parseKeepingNegatives(cmd *cobra.Command, args []string) ([]string, error) {
	in := make([]string, len(args))
	kept := map[string]string{}
	for i, a := range args {
		in[i] = a
		if negativeInt.MatchString(a) {
			in[i] = fmt.Sprintf("\x00%d", i)
			kept[in[i]] = a
		}
	}
	if err := cmd.Flags().Parse(in); err != nil {
		return nil, usagef("%s: %v", cmd.CommandPath(), err)
	}
	if help, err := cmd.Flags().GetBool("help"); err == nil && help {
		return nil, cmd.Help()
	}
	out := cmd.Flags().Args()
	for i, a := range out {
		if orig, ok := kept[a]; ok {
			out[i] = orig
		}
	}
	if out == nil {
		out = []string{}
	}
	return out, nil
}
