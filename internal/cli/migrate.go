package cli

import (
	"fmt"
	"math"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice/migrations"
)

func newMigrateCmd(g *globals) *cobra.Command {
	var to string
	var withRiver bool
	cmd := &cobra.Command{
		Use:   "migrate [up|down|status]",
		Short: "Apply, roll back or list sluice's and River's migrations",
		Long: `migrate up (the default) applies River's migrations and then sluice's. It is
idempotent and safe to run from several processes at once: they serialize on
an advisory lock (sluice.migrate).

migrate down rolls back the last sluice migration, or all down to --to N.
With --river (and --to 0) it also removes River's schema.

migrate status lists every migration and whether it is applied.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usagef("migrate expects at most one of up, down, status; got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			direction := "up"
			if len(args) == 1 {
				direction = args[0]
			}
			var downOpts migrations.DownOpts
			switch direction {
			case "up", "status":
				if cmd.Flags().Changed("to") || withRiver {
					return usagef("--to and --river apply to migrate down only")
				}
			case "down":
				if cmd.Flags().Changed("to") {
					v, err := strconv.ParseInt(to, 10, 64)
					if err != nil || v < 0 || v > math.MaxInt32 {
						return usagef("invalid --to %q: want a migration version, 0 or more", to)
					}
					downOpts.To = &v
				}
				downOpts.River = withRiver
				if withRiver && (downOpts.To == nil || *downOpts.To != 0) {
					return usagef("--river needs --to 0: River's schema can only go once every sluice migration is rolled back")
				}
			default:
				return usagef("unknown migrate direction %q: want up, down or status", direction)
			}

			pool, err := g.openPool(cmd, "sluice migrate")
			if err != nil {
				return err
			}
			logger, _ := g.cliLogger() // checked by openPool
			ctx := cmd.Context()
			defer pool.Close()
			out := cmd.OutOrStdout()

			switch direction {
			case "status":
				statuses, err := migrations.Status(ctx, pool, logger)
				if err != nil {
					return err
				}
				for _, s := range statuses {
					state := "pending"
					if s.Applied {
						state = "applied"
					}
					fmt.Fprintf(out, "%-7s %-7s %4d %s\n", s.Component, state, s.Version, s.Name)
				}
				return nil
			case "up":
				steps, err := migrations.Up(ctx, pool, logger)
				printSteps(cmd, steps)
				if err != nil {
					return err
				}
				if len(steps) == 0 {
					fmt.Fprintln(out, "database schema is up to date")
				}
				return nil
			default:
				steps, err := migrations.Down(ctx, pool, logger, downOpts)
				printSteps(cmd, steps)
				if err != nil {
					return err
				}
				if len(steps) == 0 {
					fmt.Fprintln(out, "nothing to roll back")
				}
				return nil
			}
		},
	}
	cmd.Flags().StringVar(&to, "to", "", "down: roll back sluice migrations down to this version (0 = all)")
	cmd.Flags().BoolVar(&withRiver, "river", false, "down --to 0: also remove River's schema")
	return cmd
}

func printSteps(cmd *cobra.Command, steps []migrations.Step) {
	for _, s := range steps {
		fmt.Fprintf(cmd.OutOrStdout(), "%-7s %-5s %4d %s (%s)\n", s.Component, s.Direction, s.Version, s.Name, s.Duration.Round(1000))
	}
}
