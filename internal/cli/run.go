package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice/app"
)

func newRunCmd(g *globals) *cobra.Command {
	var argsJSON string
	var opts app.RunOptions
	registry := g.registry
	cmd := &cobra.Command{
		Use:   "run KIND [--args JSON]",
		Short: "Work one job of KIND now, in this process, and print a summary",
		Long: `run inserts one job of KIND and works it in this process, through the same
worker code, middleware and locks as a worker (a maintenance kind takes its
advisory lock and records its run). It makes one attempt and prints a
one-line summary. Exit 0 when the job completed, 1 when it did not.

A kind under a concurrency limit takes a slot as a worker's job would: run
waits up to --wait for one to be free (parked jobs of the kind, being older,
go first), then gives up with exit 1, deleting the job unrun. --ignore-limit
runs it without a slot. run never parks a job.

Kinds: ` + strings.Join(registry.Names(), ", "),
		Args: exactArgs(1, "a job KIND"),
		RunE: func(cmd *cobra.Command, args []string) error {
			jobArgs, err := registry.Decode(args[0], []byte(argsJSON))
			if err != nil {
				return err
			}
			logger, err := g.cliLogger()
			if err != nil {
				return err
			}
			if err := g.requireDatabaseURL(); err != nil {
				return err
			}
			ctx := cmd.Context()
			if opts.Wait < 0 {
				return usagef("invalid --wait %s: must not be negative", opts.Wait)
			}
			cfg, err := g.runConfig(ctx, logger)
			if err != nil {
				return err
			}
			res, err := app.RunOne(ctx, cfg, jobArgs, opts)
			if err != nil {
				return err
			}
			summary := fmt.Sprintf("%s job %d %s in %s", res.Kind, res.JobID, res.State, res.Duration.Round(1000))
			if run := res.Maintenance; run != nil {
				summary += fmt.Sprintf("; maintenance run %d %s, affected %d", run.ID, run.Status, run.Affected)
			}
			if !res.Succeeded() {
				return fmt.Errorf("%s: %s", summary, res.Error)
			}
			fmt.Fprintln(cmd.OutOrStdout(), summary)
			return nil
		},
	}
	cmd.Flags().StringVar(&argsJSON, "args", "{}", "job args as a JSON object")
	cmd.Flags().DurationVar(&opts.Wait, "wait", 30*time.Second, "how long to wait for a free slot when KIND has a concurrency limit")
	cmd.Flags().BoolVar(&opts.IgnoreLimit, "ignore-limit", false, "run without a slot, whatever KIND's concurrency limit")
	g.addModuleFlags(cmd.Flags())
	return cmd
}
