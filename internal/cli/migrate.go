package cli

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/migrations"
)

func newMigrateCmd(g *globals) *cobra.Command {
	var to, component string
	var withRiver, force bool
	// A program with migrations of its own rolls back its own by default.
	defaultComponent := migrations.ComponentSluice
	if g.prog.Migrations != nil {
		defaultComponent = migrations.ComponentApp
	}
	cmd := &cobra.Command{
		Use:   "migrate [up|down|status]",
		Short: "Apply, roll back or list the migrations of River, sluice, its modules and the application",
		Long: `migrate up (the default) applies River's migrations (in River's schema), then
sluice's own, each module's and the application's (sluice.Config.Migrations),
each set tracked in a goose version table of its own in sluice's schema
(--schema, default sluice): goose_db_version, goose_db_version_<module>,
goose_db_version_app. sluice's and the modules' objects are created in
sluice's schema; the application's migrations run with the connection's own
search_path. A database of the layout before sluice had a schema of its own
(its tables in public) is moved into the schema first, every row kept.
migrate up is idempotent and safe to run from several processes at once: they
serialize on an advisory lock (sluice.migrate). A failing migration is rolled
back whole; the error names its file (exit 1).

migrate down rolls back the last migration of --component (app, the
program's own, in a program with migrations of its own; else sluice; or a
module's name), or all down to --to N. down --to 0 of sluice first
rolls back the application's and the modules' migrations. With --river (and
--to 0) it also removes River's schema, the version tables and sluice's schema
(unless it holds other objects). It refuses (exit 1) while a worker of the
database is alive, naming it: stop the workers first, or give --force. The
check holds at every schema version a step leaves: a worker is alive while
its heartbeat is younger than its dead_after (three heartbeat intervals at
the versions before sluice_workers had that column).

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
				if cmd.Flags().Changed("to") || withRiver || cmd.Flags().Changed("component") || force {
					return usagef("--to, --component, --river and --force apply to migrate down only")
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
				downOpts.Component = component
				if withRiver && (downOpts.To == nil || *downOpts.To != 0 || component != migrations.ComponentSluice) {
					return usagef("--river needs --to 0 (of sluice): River's schema can only go once every migration is rolled back")
				}
				if !g.knowsComponent(component) {
					return usagef("unknown --component %q: want sluice, app, or a module with migrations", component)
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
				statuses, err := migrations.Status(ctx, pool, g.prog.MigrationOptions(logger))
				if err != nil {
					return err
				}
				for _, s := range statuses {
					state := "pending"
					if s.Applied {
						state = "applied"
					}
					fmt.Fprintf(out, "%-10s %-7s %4d %s\n", s.Component, state, s.Version, s.Name)
				}
				return nil
			case "up":
				steps, err := migrations.Up(ctx, pool, g.prog.MigrationOptions(logger))
				printSteps(cmd, steps)
				if err != nil {
					return err
				}
				if len(steps) == 0 {
					fmt.Fprintln(out, "database schema is up to date")
				}
				return nil
			default:
				if !force {
					if err := refuseUnderLiveWorkers(ctx, pool); err != nil {
						return err
					}
				}
				steps, err := migrations.Down(ctx, pool, g.prog.MigrationOptions(logger), downOpts)
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
	cmd.Flags().StringVar(&to, "to", "", "down: roll back the component's migrations down to this version (0 = all)")
	cmd.Flags().StringVar(&component, "component", defaultComponent, "down: the migrations to roll back: sluice, a module's name, or app (the program's own)")
	cmd.Flags().BoolVar(&withRiver, "river", false, "down --to 0: also remove River's schema")
	cmd.Flags().BoolVar(&force, "force", false, "down: roll back even while workers of the database are alive")
	return cmd
}

// refuseUnderLiveWorkers is the error of a rollback while workers of the
// database are alive (none when sluice_workers does not exist, yet or any
// more). AliveWorkers reads every version of the table, so that each step of
// a rollback is checked.
func refuseUnderLiveWorkers(ctx context.Context, pool *pgxpool.Pool) error {
	q := db.New(pool)
	exists, err := q.TableExists(ctx, pgkit.SchemasOf(pool).Sluice+".sluice_workers")
	if err != nil {
		return fmt.Errorf("look for live workers: %w", err)
	}
	if !exists {
		return nil
	}
	alive, err := q.AliveWorkers(ctx)
	if err != nil {
		return fmt.Errorf("look for live workers: %w", err)
	}
	if len(alive) == 0 {
		return nil
	}
	names := make([]string, len(alive))
	for i, w := range alive {
		names[i] = fmt.Sprintf("%s (%s, pid %d)", w.ID, w.Host, w.Pid)
	}
	return fmt.Errorf("%d worker(s) of this database are alive: %s; stop them before rolling back, or give --force",
		len(alive), strings.Join(names, ", "))
}

func printSteps(cmd *cobra.Command, steps []migrations.Step) {
	for _, s := range steps {
		fmt.Fprintf(cmd.OutOrStdout(), "%-10s %-5s %4d %s (%s)\n", s.Component, s.Direction, s.Version, s.Name, s.Duration.Round(1000))
	}
}

// knowsComponent reports whether component names a set of migrations of the
// program.
func (g *globals) knowsComponent(component string) bool {
	switch component {
	case migrations.ComponentSluice:
		return true
	case migrations.ComponentApp:
		return g.prog.Migrations != nil
	}
	for _, m := range g.prog.Modules {
		if m.Name == component && m.Migrations != nil {
			return true
		}
	}
	return false
}
