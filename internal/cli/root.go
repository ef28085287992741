package cli

import (
	"cmp"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/kinds"
	"github.com/sluice-dev/sluice/module"
	"github.com/sluice-dev/sluice/tracing"
)

// envAnnotation is the flag annotation naming the environment variable that
// supplies the flag's value when the flag is not given.
const envAnnotation = module.EnvAnnotation

// globals are the flags every command shares.
type globals struct {
	// base is the program's Config (its Name set): its settings are the
	// defaults of the flags. prog is the program it describes, with the schemas of the
	// flags; registry is every kind it works.
	base     app.Config
	prog     app.Program
	registry *kinds.Registry
	// stderr receives log lines.
	stderr io.Writer
	// envTracer is the tracer provider of the OTEL_* variables, once built.
	envTracer struct {
		done     bool
		tp       trace.TracerProvider
		shutdown func(context.Context) error
	}
	databaseURL string
	logLevel    string
	logFormat   string
}

func newRootCmd(stderr io.Writer, base app.Config, registry *kinds.Registry) (*cobra.Command, *globals) {
	prog := base.Program()
	g := &globals{stderr: stderr, base: base, prog: prog, registry: registry}
	root := &cobra.Command{
		Use:   base.Name,
		Short: "A SQL-centric job runner on a Postgres queue (River)",
		Long: `sluice runs background jobs on River, a Postgres queue, and keeps all of
their state in Postgres: schedules, maintenance locks, concurrency limits and
parked jobs are tables an operator can query and change with SQL.

Every command reads the database from --database-url or DATABASE_URL.
sluice's tables, views and functions live in the Postgres schema --schema
(default sluice); River's tables in River's schema (--river-schema; default:
where the connection's search_path puts them, usually public).
Exit codes: 0 success, 1 runtime failure, 2 bad usage or input
(sluice health follows the monitoring-plugin convention instead: 0 OK,
1 WARNING, 2 CRITICAL).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyEnv(cmd); err != nil {
				return err
			}
			return g.checkSchemas()
		},
	}
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return asUsage(err) })
	pf := root.PersistentFlags()
	pf.StringVar(&g.databaseURL, "database-url", "", "Postgres connection string (pgx URL or key=value)")
	pf.StringVar(&g.prog.Schemas.Sluice, "schema", cmp.Or(prog.Schemas.Sluice, pgkit.DefaultSchema), "Postgres schema of sluice's tables, views, functions and migration versions")
	pf.StringVar(&g.prog.Schemas.River, "river-schema", prog.Schemas.River, "Postgres schema of River's tables (River's Schema option; default: where the connection's search_path puts them, usually public)")
	pf.StringVar(&g.logLevel, "log-level", "", "log level: debug, info, warn, error (default info for worker, warn otherwise)")
	pf.StringVar(&g.logFormat, "log-format", "json", "log format: json or text")
	bindEnv(pf, "database-url", "DATABASE_URL")
	bindEnv(pf, "log-level", "SLUICE_LOG_LEVEL")
	bindEnv(pf, "log-format", "SLUICE_LOG_FORMAT")
	bindEnv(pf, "schema", "SLUICE_SCHEMA")
	bindEnv(pf, "river-schema", "SLUICE_RIVER_SCHEMA")

	root.AddCommand(
		newEnqueueCmd(g),
		newJobsCmd(g),
		newLimitsCmd(g),
		newMigrateCmd(g),
		newParkedCmd(g),
		newPolicyCmd(g),
		newQueuesCmd(g),
		newRunCmd(g),
		newStatsCmd(g),
		newWorkerCmd(g),
		newScheduleCmd(g),
		newHealthCmd(g),
	)
	for _, m := range prog.Modules {
		if m.Commands != nil {
			root.AddCommand(m.Commands(g)...)
		}
	}
	for _, cmd := range root.Commands() {
		cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return asUsage(err) })
	}
	return root, g
}

// runConfig is the Config of a command that works jobs in this process
// without the worker's flags (run): the program's settings, with the
// schemas, database and logger of the command line.
func (g *globals) runConfig(ctx context.Context, logger *slog.Logger) (app.Config, error) {
	cfg := g.base.WithProgram(g.prog)
	cfg.DatabaseURL, cfg.Logger = g.databaseURL, logger
	tp, err := g.tracerProvider(ctx, logger)
	cfg.TracerProvider = tp
	return cfg, err
}

// bindEnv makes the environment variable env the fallback for flag name.
func bindEnv(fs *pflag.FlagSet, name, env string) { module.BindEnv(fs, name, env) }

// addModuleFlags adds the flags of the modules to fs (the commands that
// work jobs).
func (g *globals) addModuleFlags(fs *pflag.FlagSet) {
	for _, m := range g.prog.Modules {
		if m.Flags != nil {
			m.Flags(fs)
		}
	}
}

// applyEnv sets every flag of cmd that was not given on the command line
// from its environment variable, if that is set.
func applyEnv(cmd *cobra.Command) error {
	var firstErr error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		envs := f.Annotations[envAnnotation]
		if firstErr != nil || f.Changed || len(envs) == 0 {
			return
		}
		val, ok := os.LookupEnv(envs[0])
		if !ok || val == "" {
			return
		}
		if err := f.Value.Set(val); err != nil {
			firstErr = usagef("invalid $%s: %v", envs[0], pgkit.Redact(err.Error(), val))
		}
	})
	return firstErr
}

// logger builds the logger of a command; defaultLevel applies when neither
// --log-level nor SLUICE_LOG_LEVEL is set.
func (g *globals) logger(defaultLevel slog.Level) (*slog.Logger, error) {
	w := g.stderr
	level := defaultLevel
	if g.logLevel != "" {
		if err := level.UnmarshalText([]byte(g.logLevel)); err != nil {
			return nil, usagef("invalid --log-level (or $SLUICE_LOG_LEVEL) %q: want debug, info, warn or error", g.logLevel)
		}
	}
	opts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(g.logFormat) {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	default:
		return nil, usagef("invalid --log-format (or $SLUICE_LOG_FORMAT) %q: want json or text", g.logFormat)
	}
}

// cliLogger is the logger of a command other than worker.
func (g *globals) cliLogger() (*slog.Logger, error) {
	return g.logger(slog.LevelWarn)
}

// checkSchemas checks the schema names of --schema and --river-schema.
func (g *globals) checkSchemas() error {
	if err := pgkit.ValidateSchema(g.prog.Schemas.Sluice); err != nil {
		return usagef("--schema (or $SLUICE_SCHEMA): %v", err)
	}
	if g.prog.Schemas.River != "" {
		if err := pgkit.ValidateRiverSchema(g.prog.Schemas.River); err != nil {
			return usagef("--river-schema (or $SLUICE_RIVER_SCHEMA): %v", err)
		}
	}
	return nil
}

// requireDatabaseURL checks that a database URL was given and parses.
func (g *globals) requireDatabaseURL() error {
	_, err := pgkit.ParseConfig(g.databaseURL)
	return err
}

// openPool opens a pool for a CLI command after checking the flags that
// every database command shares.
func (g *globals) openPool(cmd *cobra.Command, appName string) (*pgxpool.Pool, error) {
	if _, err := g.cliLogger(); err != nil {
		return nil, err
	}
	if err := g.requireDatabaseURL(); err != nil {
		return nil, err
	}
	return app.OpenPool(cmd.Context(), g.databaseURL, appName, g.prog.Schemas)
}

// OpenClient is openPool plus the program's River client on the pool
// (insertClient); the modules' commands use it (module.CLI).
func (g *globals) OpenClient(cmd *cobra.Command, appName string) (*pgxpool.Pool, *app.Client, error) {
	return g.openClient(cmd, appName)
}

// openClient is openPool plus the program's River client on the pool
// (insertClient).
func (g *globals) openClient(cmd *cobra.Command, appName string) (*pgxpool.Pool, *app.Client, error) {
	pool, err := g.openPool(cmd, appName)
	if err != nil {
		return nil, nil, err
	}
	client, err := g.insertClient(cmd.Context(), pool)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, client, nil
}

// insertClient is the River client of every command that inserts or
// manages jobs without working them: the program's (app.Program.InsertClient),
// built with its Config.River as a worker's client is, its inserts traced
// on the command's tracer provider.
func (g *globals) insertClient(ctx context.Context, pool *pgxpool.Pool) (*app.Client, error) {
	logger, err := g.cliLogger()
	if err != nil {
		return nil, err
	}
	tp, err := g.tracerProvider(ctx, logger)
	if err != nil {
		return nil, err
	}
	prog := g.prog
	prog.TracerProvider = tp
	return prog.InsertClient(pool, logger)
}

// tracerProvider is the tracer provider of the commands that insert or
// work jobs: the program's Config.TracerProvider, else the one the
// standard OTEL_* variables ask for (tracing.FromEnv; nil when they ask
// for none), built once and flushed when the command ends. A variable that
// makes no sense is a usage error naming it.
func (g *globals) tracerProvider(ctx context.Context, logger *slog.Logger) (trace.TracerProvider, error) {
	if g.base.TracerProvider != nil {
		return g.base.TracerProvider, nil
	}
	if g.envTracer.done {
		return g.envTracer.tp, nil
	}
	tp, shutdown, err := tracing.FromEnv(ctx, g.base.Name, logger)
	var envErr *tracing.EnvError
	if errors.As(err, &envErr) {
		return nil, asUsage(err)
	}
	if err != nil {
		return nil, err
	}
	g.envTracer.done, g.envTracer.tp, g.envTracer.shutdown = true, tp, shutdown
	return tp, nil
}

// shutdownTracing flushes the spans of the OTEL_* tracer provider, if one
// was built, for up to 5 seconds.
func (g *globals) shutdownTracing() {
	if g.envTracer.shutdown == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = g.envTracer.shutdown(ctx) // an endpoint that does not answer drops its spans
}

// exactArgs is cobra.ExactArgs whose error is a usage error naming the
// arguments expected.
func exactArgs(n int, names string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("%s expects %s, got %d argument(s)", cmd.CommandPath(), names, len(args))
		}
		return nil
	}
}
