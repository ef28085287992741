// Package module is the contract between sluice and its modules: sets of
// job kinds, with their workers, migrations, default schedules, CLI
// commands and stats, that a program turns on as a whole. The seed systems
// (CI-build sweeps, project exports, the task-cancellation monitor and
// demo.sleep) are modules under modules/; the stock sluice binary turns
// them all on, and a library user picks the ones it wants
// (sluice.Config.Modules).
package module

import (
	"context"
	"io"
	"io/fs"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/kinds"
	"github.com/sluice-dev/sluice/maintenance"
	"github.com/sluice-dev/sluice/metrics"
	"github.com/sluice-dev/sluice/settings"
)

// Module is one module.
type Module struct {
	// Name names the module, such as "cibuilds": lowercase letters, digits
	// and underscores. Its migrations are tracked in the version table
	// goose_db_version_<Name> of sluice's schema.
	Name string
	// Kinds are the job kinds the module works; AddWorkers adds a worker
	// for each.
	Kinds []kinds.Kind
	// Migrations are the module's goose migrations (nil: none), applied by
	// `migrate up` after sluice's own, with sluice's schema first on the
	// search_path: a module's tables live in sluice's schema.
	Migrations fs.FS
	// AddWorkers adds the module's workers to workers.
	AddWorkers func(workers *river.Workers, env *Env) error
	// Flags, if set, adds the module's flags to the commands that work jobs
	// (worker and run). Flags bind to the module's own configuration.
	Flags func(fs *pflag.FlagSet)
	// Commands, if set, returns the module's own CLI commands.
	Commands func(cli CLI) []*cobra.Command
	// Stats are the module's sections of the stats document (/stats and
	// `sluice stats`).
	Stats []StatsReader
	// Pages are the module's pages among the worker's web pages (package
	// web), listed on their index after sluice's own.
	Pages []Page
	// ClusterSources, if set, returns the module's cluster-wide gauges:
	// figures read from the database, exported by one worker at a time
	// (metrics.Cluster). Per-process metrics are registered by AddWorkers
	// with Env.Registerer.
	ClusterSources func(env *Env) []metrics.ClusterSource
}

// Env is what a module's workers share with the rest of the program.
type Env struct {
	// Pool is the program's database pool (sluice's schema first on its
	// search_path).
	Pool *pgxpool.Pool
	// Logger receives log lines.
	Logger *slog.Logger
	// Registerer takes the module's metrics.
	Registerer prometheus.Registerer
	// Settings reads dynamic settings.
	Settings *settings.Settings
	// Maintenance runs maintenance runs (advisory lock and journal).
	Maintenance *maintenance.Runner
	// Registry is every kind the program knows.
	Registry *kinds.Registry
	// WorkerID is this process's id (River's client ID).
	WorkerID string
	// JobTimeout is the client-level job timeout.
	JobTimeout time.Duration
}

// CLI is what a module's commands get from the sluice CLI.
type CLI interface {
	// OpenClient opens a pool on the database the command line names and
	// the program's River client on it, which inserts and manages jobs but
	// works none (built with the program's Config.River, as its workers'
	// client is); the caller closes the pool.
	OpenClient(cmd *cobra.Command, appName string) (*pgxpool.Pool, *river.Client[pgx.Tx], error)
}

// StatsSection is one top-level section of the stats document: a value
// that encodes as the section's JSON and prints itself as a table for
// people.
type StatsSection interface {
	// WriteTable prints the section under a title line.
	WriteTable(w io.Writer) error
}

// StatsReader reads one section of the stats document.
type StatsReader struct {
	// Name is the section's key in the JSON document.
	Name string
	// Read reads the section through dbtx.
	Read func(ctx context.Context, dbtx db.DBTX) (StatsSection, error)
}
