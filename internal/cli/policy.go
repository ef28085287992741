package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice/policy"
)

// defaultPolicyKeys is how many keys `policy keys` shows without --full.
const defaultPolicyKeys = 20

func newPolicyCmd(g *globals) *cobra.Command {
	cmd := groupCmd("policy", "Set, list, clear and reset enqueue policies (a cap on waiting jobs per key: discard, replace, debounce, reject)")
	cmd.Long = `An enqueue policy caps the waiting jobs of a kind's key (waiting: available,
scheduled, retryable, pending; running never counts) and says what an insert
does when the key is full:

  discard   the new job is not inserted; River's client answers with the
            waiting job (UniqueSkippedAsDuplicate)
  replace   the newest waiting job takes the new args and scheduled_at (same
            id, attempts and place in line; --keep-scheduled-at: only the args)
  debounce  replace, and the job is due --debounce after the last enqueue,
            never later than --max-delay after it started waiting
  reject    the insert fails with SQLSTATE SLR01 naming kind, key and count

The key is the JSON text of the --by-args fields' values, as limits' (no
--by-args: one key for the kind). The database enforces it (a trigger on
river_job), for every insert path: River clients, sluice enqueue, plain SQL.
A policy set here wins over one the program declares in Go (Config.Policies)
until 'policy reset KIND'.`

	var asJSON bool
	list := &cobra.Command{
		Use:   "list [--json]",
		Short: "List the enqueue policies in force, with their source",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, err := g.openPool(cmd, "sluice policy")
			if err != nil {
				return err
			}
			defer pool.Close()
			rows, err := policy.NewStore(pool).List(cmd.Context())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				docs := make([]policyDoc, 0, len(rows))
				for _, r := range rows {
					docs = append(docs, policyDocOf(r))
				}
				return json.NewEncoder(out).Encode(docs)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "KIND\tBY ARGS\tMAX WAITING\tON CONFLICT\tDEBOUNCE\tMAX DELAY\tSOURCE")
			for _, r := range rows {
				by, d, m := "-", "-", "-"
				if len(r.ByArgs) > 0 {
					by = strings.Join(r.ByArgs, ",")
				}
				if r.OnConflict == policy.Debounce {
					d, m = r.Debounce.String(), r.MaxDelay.String()
				}
				answer := string(r.OnConflict)
				if r.KeepScheduledAt {
					answer += " (keeps scheduled_at)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", r.Kind, by, r.MaxWaiting, answer, d, m, r.Source)
			}
			return tw.Flush()
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	var (
		byArgs     []string
		maxWaiting int32
		onConflict string
		debounce   time.Duration
		maxDelay   time.Duration
		keepAt     bool
	)
	set := &cobra.Command{
		Use:   "set KIND --max-waiting N [--by-args FIELD[,FIELD...]] --on-conflict discard|replace|debounce|reject [--debounce D --max-delay M] [--keep-scheduled-at]",
		Short: "Set the enqueue policy of KIND",
		Args:  exactArgs(1, "a job KIND"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("max-waiting") {
				return usagef("policy set %s: --max-waiting N is required", args[0])
			}
			if !cmd.Flags().Changed("on-conflict") {
				return usagef("policy set %s: --on-conflict discard|replace|debounce|reject is required", args[0])
			}
			p := policy.Policy{Kind: args[0], ByArgs: byArgs, MaxWaiting: maxWaiting, OnConflict: policy.OnConflict(onConflict),
				Debounce: debounce, MaxDelay: maxDelay, KeepScheduledAt: keepAt}
			if p.OnConflict == policy.Debounce && (!cmd.Flags().Changed("debounce") || !cmd.Flags().Changed("max-delay")) {
				return usagef("policy set %s: --on-conflict debounce needs --debounce D and --max-delay M", args[0])
			}
			if err := p.Validate(g.registry); err != nil {
				return asUsage(err)
			}
			pool, err := g.openPool(cmd, "sluice policy")
			if err != nil {
				return err
			}
			defer pool.Close()
			if err := policy.NewStore(pool).Set(cmd.Context(), p); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "policy of %s: %s\n", p.Kind, p)
			return nil
		},
	}
	f := set.Flags()
	f.Int32Var(&maxWaiting, "max-waiting", 0, "the most jobs of a key that may wait (at least 1)")
	f.StringSliceVar(&byArgs, "by-args", nil, "key the waiting jobs by these top-level args fields")
	f.StringVar(&onConflict, "on-conflict", "", "what an insert does when its key is full: discard, replace, debounce or reject")
	f.DurationVar(&debounce, "debounce", 0, "with debounce: the job is due this long after the last enqueue")
	f.DurationVar(&maxDelay, "max-delay", 0, "with debounce: never later than this after the job started waiting")
	f.BoolVar(&keepAt, "keep-scheduled-at", false, "with replace: the waiting job keeps its own scheduled_at and takes only the new args")

	clearCmd := &cobra.Command{
		Use:   "clear KIND",
		Short: "Remove the enqueue policy of KIND (one declared in Go stays off until policy reset)",
		Args:  exactArgs(1, "a job KIND"),
		RunE: func(cmd *cobra.Command, args []string) error {
			pool, err := g.openPool(cmd, "sluice policy")
			if err != nil {
				return err
			}
			defer pool.Close()
			cleared, err := policy.NewStore(pool).Clear(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if !cleared {
				return usagef("no enqueue policy is set for %q", args[0])
			}
			fmt.Fprintf(cmd.OutOrStdout(), "policy of %s cleared\n", args[0])
			return nil
		},
	}

	reset := &cobra.Command{
		Use:   "reset KIND",
		Short: "Undo an operator's change to a policy declared in Go: write the declared one back",
		Args:  exactArgs(1, "a job KIND"),
		RunE: func(cmd *cobra.Command, args []string) error {
			pool, err := g.openPool(cmd, "sluice policy")
			if err != nil {
				return err
			}
			defer pool.Close()
			if err := policy.NewStore(pool).Reset(cmd.Context(), args[0]); err != nil {
				var notDeclared *policy.NotDeclaredError
				if errors.As(err, &notDeclared) {
					return asUsage(err)
				}
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "policy of %s reset to its declaration\n", args[0])
			return nil
		},
	}

	var full, keysJSON bool
	keys := &cobra.Command{
		Use:   "keys KIND [--full] [--json]",
		Short: fmt.Sprintf("Show KIND's keys: waiting jobs, cap and outcome counts (the %d fullest; --full: all)", defaultPolicyKeys),
		Args:  exactArgs(1, "a job KIND"),
		RunE: func(cmd *cobra.Command, args []string) error {
			pool, err := g.openPool(cmd, "sluice policy")
			if err != nil {
				return err
			}
			defer pool.Close()
			limit := int32(defaultPolicyKeys + 1)
			if full {
				limit = 0
			}
			rows, err := policy.NewStore(pool).Keys(cmd.Context(), args[0], limit)
			if err != nil {
				return err
			}
			more := !full && len(rows) > defaultPolicyKeys
			if more {
				rows = rows[:defaultPolicyKeys]
			}
			out := cmd.OutOrStdout()
			if keysJSON {
				return json.NewEncoder(out).Encode(rows)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "KEY\tWAITING\tMAX\tINSERTED\tDISCARDED\tREPLACED\tDEBOUNCED\tLAST ENQUEUE")
			for _, r := range rows {
				key, limitText := r.Key, "-"
				if key == "" {
					key = "(the kind)"
				}
				if r.MaxWaiting != nil {
					limitText = fmt.Sprint(*r.MaxWaiting)
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%d\t%d\t%s\n", key, r.Waiting, limitText, r.Inserted, r.Discarded, r.Replaced,
					r.Debounced, fmtTime(r.LastAt))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if more {
				fmt.Fprintf(out, "(the %d fullest keys; --full lists all)\n", defaultPolicyKeys)
			}
			return nil
		},
	}
	keys.Flags().BoolVar(&full, "full", false, "list every key")
	keys.Flags().BoolVar(&keysJSON, "json", false, "print JSON")

	cmd.AddCommand(set, list, clearCmd, reset, keys)
	return cmd
}

// policyDoc is a policy as `policy list --json` prints it.
type policyDoc struct {
	Kind       string   `json:"kind"`
	ByArgs     []string `json:"by_args"`
	MaxWaiting int32    `json:"max_waiting"`
	OnConflict string   `json:"on_conflict"`
	DebounceMs *int64   `json:"debounce_ms"`
	MaxDelayMs *int64   `json:"max_delay_ms"`
	KeepAt     bool     `json:"keep_scheduled_at"`
	Source     string   `json:"source"`
}

func policyDocOf(r policy.Row) policyDoc {
	d := policyDoc{Kind: r.Kind, ByArgs: r.ByArgs, MaxWaiting: r.MaxWaiting, OnConflict: string(r.OnConflict),
		KeepAt: r.KeepScheduledAt, Source: r.Source}
	if r.OnConflict == policy.Debounce {
		a, b := r.Debounce.Milliseconds(), r.MaxDelay.Milliseconds()
		d.DebounceMs, d.MaxDelayMs = &a, &b
	}
	return d
}
