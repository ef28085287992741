package cli

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/migrations"
)

func newStatsCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "stats [--json]",
		Short: "Print job and monitor statistics",
		Long: `stats prints what the database says about the jobs, one section per
subsystem: the queues (jobs per kind and state, from sluice.queue_overview)
and task cancellation (per kind, jobs still running at least
task_cancellation.duration_millis after their cancellation right now, and the
cumulative count task_cancellation.monitor made; from the view
sluice.task_cancellation_stats).

With --json it prints the same document as the worker's /stats, after
OpenSearch's node-stats shape:
  {"queues": {...}, "task_cancellation": {"KIND":
    {"current_count_post_cancel": 0, "total_count_post_cancel": 0}}}`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, err := g.openPool(cmd, "sluice stats")
			if err != nil {
				return err
			}
			logger, _ := g.cliLogger() // checked by openPool
			ctx := cmd.Context()
			defer pool.Close()
			if err := migrations.Check(ctx, pool, g.prog.MigrationOptions(logger)); err != nil {
				return err
			}
			stats, err := app.ReadStats(ctx, pool, g.prog.Modules)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(stats); err != nil {
					return fmt.Errorf("encode stats: %w", err)
				}
				return nil
			}
			return stats.WriteTable(out)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the stats document as JSON (the shape of the worker's /stats)")
	return cmd
}
