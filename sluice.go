// Package sluice is a SQL-centric job runner on a Postgres queue: River jobs
// whose whole state lives in Postgres. Durable cron schedules, concurrency
// limits with jobs parked in place, maintenance runs under advisory locks,
// worker liveness with a reaper of dead workers, metrics and health all come
// with it, and an operator sees and steers everything with SQL.
//
// A team runs its own job kinds by writing plain River workers and handing
// them over:
//
//	workers := river.NewWorkers()
//	river.AddWorker(workers, &GreetWorker{})
//	os.Exit(sluice.Main(sluice.Config{Workers: workers, Migrations: migrationsFS}))
//
// Main is the whole sluice command line (worker, migrate, enqueue, run,
// schedule, limits, parked, jobs, stats, health), with the program's kinds
// known to every command. New runs the worker inside an application's own
// process instead, beside its own HTTP server; Migrate applies the
// program's migrations from Go.
//
// sluice's own seed systems are modules (package modules and below): the
// stock sluice binary turns them all on; a library user picks the ones it
// wants with Config.Modules.
package sluice

import (
	"context"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/sluice-dev/sluice/internal/cli"
)

// Main runs the sluice command line with os.Args and returns the process's
// exit code: 0 success, 1 runtime failure, 2 bad usage or input (sluice
// health: 0 OK, 1 WARNING, 2 CRITICAL; a reaped worker: 3). SIGINT and
// SIGTERM stop the command gracefully.
//
// Main reads its settings from the command line and the environment
// (`--help` lists them), with cfg's settings as their defaults: flag >
// environment > cfg > built-in default. It uses what the program is made
// of (Workers, Migrations, Modules, Limits, Schedules, River,
// TracerProvider; without a TracerProvider, the standard OTEL_* variables
// turn tracing on); DatabaseURL and Logger are its own (--database-url or
// $DATABASE_URL; stderr). A cfg with no workers and no modules, a kind
// registered twice, or a bad declared limit or schedule is reported and
// exits 1 before any command runs.
func Main(cfg Config) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if cfg.Name == "" {
		cfg.Name = filepath.Base(os.Args[0])
	}
	return cli.Run(ctx, cfg, os.Args[1:], os.Stdout, os.Stderr)
}
