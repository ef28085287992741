package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice/app"
)

// defaultRunTimeout is run's default --timeout: longer than a maintenance
// run may take by default (maintenance.DefaultTimeout, 30m) plus a slot's
// wait, and a bound on any wait nothing ends.
const defaultRunTimeout = time.Hour

func newRunCmd(g *globals) *cobra.Command {
	var argsJSON string
	var opts app.RunOptions
	registry := g.registry
	cmd := &cobra.Command{
		Use:   "run KIND [--args JSON] [--wait D] [--ignore-limit] [--timeout D]",
		Short: "Work one job of KIND now, in this process, and print a summary",
		Long: `run inserts one job of KIND and works it in this process, through the same
worker code, middleware and locks as a worker (a maintenance kind takes its
advisory lock and records its run). It makes one attempt and prints a
one-line summary. Exit 0 when the job completed, 1 when it did not.

A kind under a concurrency limit takes a slot as a worker's job would: run
waits up to --wait for one to be free (parked jobs of the kind, being older,
go first), then gives up with exit 1, deleting the job unrun. --ignore-limit
runs it without a slot. run never parks a job.

When River skips the insert as the duplicate of a job already there (a kind
with unique insert options, such as concurrency_limit.resume while one
waits), run says which job it duplicates and exits 1: that job is a
worker's to run, not run's. --timeout bounds the whole run (default 1h):
past it, run cancels the job (or deletes it unrun), says what it was
waiting for, and exits 1.

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
			if opts.Timeout <= 0 {
				return usagef("invalid --timeout %s: want a positive duration such as 10m", opts.Timeout)
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
	cmd.Flags().DurationVar(&opts.Timeout, "timeout", defaultRunTimeout, "the longest the whole run may take (the slot's wait, the job's work, its snoozes), then the job is cancelled")
	g.addModuleFlags(cmd.Flags())
	return cmd
}
