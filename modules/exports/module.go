// Package exports is the project-exports module (seed 004, GitLab's
// StuckExportJobsWorker): project_export_jobs and project_relation_exports,
// export.project (writes a project's archive) and the maintenance kind
// export.stuck_jobs (marks failed the exports whose River job finished or
// is gone), with its default schedule, and the `sluice export` command.
package exports

import (
	"github.com/riverqueue/river"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/kinds"
	"github.com/sluice-dev/sluice/module"
)

// Config configures the module.
type Config struct {
	// Dir is where export.project writes archives (default DefaultDir). The
	// stock binary sets it from --export-dir or $SLUICE_EXPORT_DIR.
	Dir string
}

// Module returns the project-exports module on cfg. Its --export-dir flag,
// on the commands that work jobs, overrides cfg.Dir.
func Module(cfg Config) module.Module {
	if cfg.Dir == "" {
		cfg.Dir = DefaultDir
	}
	c := &cfg
	return module.Module{
		Migrations: migrations(),
		Name:       "exports",
		Kinds:      []kinds.Kind{kinds.Of[ProjectArgs](), kinds.Of[StuckJobsArgs]()},
		AddWorkers: func(workers *river.Workers, env *module.Env) error {
			metrics, err := NewMetrics(env.Registerer)
			if err != nil {
				return err
			}
			d := &deps{Pool: env.Pool, Logger: env.Logger, Queries: db.New(env.Pool), Settings: env.Settings,
				Metrics: metrics, Dir: c.Dir, runner: env.Maintenance}
			if err := river.AddWorkerSafely(workers, &ProjectWorker{deps: d}); err != nil {
				return err
			}
			return river.AddWorkerSafely(workers, &StuckJobsWorker{deps: d})
		},
		Flags: func(fs *pflag.FlagSet) {
			if fs.Lookup("export-dir") != nil {
				return
			}
			fs.StringVar(&c.Dir, "export-dir", c.Dir, "directory export.project writes project export archives to")
			module.BindEnv(fs, "export-dir", "SLUICE_EXPORT_DIR")
		},
		Commands: func(cli module.CLI) []*cobra.Command {
			return []*cobra.Command{newExportCmd(cli)}
		},
	}
}
