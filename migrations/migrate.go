// Package migrations applies a sluice program's schema: River's migrations
// (through rivermigrate, in River's schema), then the goose migrations of
// sluice's core (embedded here), of each module turned on, and of the
// application (Config.Migrations), each set in a version table of its own
// in sluice's schema, so that they never interleave.
//
// Every set but the application's runs with sluice's schema first on the
// search_path, so that their tables, views and functions land there; the
// application's runs with the connection's own search_path.
package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/module"
)

// LockName names the advisory lock that serializes migrations, so that
// several processes may run `sluice migrate up` at once.
const LockName = "sluice.migrate"

// Components of Step and VersionStatus besides the modules' names.
const (
	ComponentRiver  = "river"
	ComponentSluice = "sluice"
	ComponentApp    = "app"
)

// Options are the migrations of a program besides River's and sluice's
// core.
type Options struct {
	// Modules are the modules turned on: their migrations are applied.
	Modules []module.Module
	// App are the application's own goose migrations (nil: none).
	App fs.FS
	// Logger receives goose's and River's log lines.
	Logger *slog.Logger

	// core replaces FS, sluice's core migrations (nil: FS). Only tests set
	// it (export_test.go), to play a sluice release that adds a migration.
	core fs.FS
}

// Step is one migration applied or rolled back.
type Step struct {
	// Component is "river", "sluice", a module's name, or "app".
	Component string
	// Name is the migration's name, such as 00001_foundation.sql.
	Name      string
	Direction string
	Version   int64
	Duration  time.Duration
}

// VersionStatus is one known migration and whether it is applied.
type VersionStatus struct {
	Component string
	Name      string
	Version   int64
	Applied   bool
	AppliedAt *time.Time
}

// DownOpts selects what Down rolls back.
type DownOpts struct {
	// Component is the set to roll back: "sluice" (default), a module's
	// name, or "app".
	Component string
	// To is the version to roll back to; nil means one step. To 0 of
	// sluice's core first rolls the application's and the modules'
	// migrations back to 0 (they build on it).
	To *int64
	// River also removes River's schema, sluice's version tables and its
	// schema, once every migration is rolled back (sluice's schema depends
	// on River's).
	River bool
}

// set is one set of goose migrations with its version table.
type set struct {
	component string
	fsys      fs.FS
	// table is the version table, qualified with sluice's schema.
	table string
	// app: the set runs with the connection's own search_path.
	app bool
}

// sets lists the goose migration sets in the order they apply.
func sets(schemas pgkit.Schemas, opts Options) []set {
	core := opts.core
	if core == nil {
		core = FS
	}
	out := []set{{component: ComponentSluice, fsys: core, table: schemas.Sluice + ".goose_db_version"}}
	for _, m := range opts.Modules {
		if m.Migrations != nil {
			out = append(out, set{component: m.Name, fsys: m.Migrations, table: schemas.Sluice + ".goose_db_version_" + m.Name})
		}
	}
	if opts.App != nil {
		out = append(out, set{component: ComponentApp, fsys: opts.App, table: schemas.Sluice + ".goose_db_version_app", app: true})
	}
	return out
}

// Up applies River's migrations, then (after creating sluice's schema, and
// moving an install of the old layout into it) sluice's, the modules' and
// the application's, under LockName. It is idempotent: with nothing pending
// it applies nothing. A failing migration is rolled back whole; the error
// names its file.
func Up(ctx context.Context, pool *pgxpool.Pool, opts Options) ([]Step, error) {
	schemas := pgkit.SchemasOf(pool)
	var steps []Step
	err := withLock(ctx, pool, func() error {
		if err := createRiverSchema(ctx, pool, schemas); err != nil {
			return err
		}
		riverSteps, err := riverMigrate(ctx, pool, opts.Logger, rivermigrate.DirectionUp, nil)
		if err != nil {
			return err
		}
		steps = append(steps, riverSteps...)
		if err := bootstrap(ctx, pool, schemas, opts.Logger); err != nil {
			return err
		}
		for _, s := range sets(schemas, opts) {
			provider, closeFn, err := newProvider(pool, s, opts.Logger)
			if err != nil {
				return err
			}
			results, err := provider.Up(ctx)
			closeFn()
			steps = append(steps, gooseSteps(s.component, results)...)
			if err != nil {
				return migrationError(s.component, "apply", err)
			}
		}
		return nil
	})
	return steps, err
}

// Down rolls back migrations as opts says.
func Down(ctx context.Context, pool *pgxpool.Pool, opts Options, d DownOpts) ([]Step, error) {
	schemas := pgkit.SchemasOf(pool)
	all := sets(schemas, opts)
	component := d.Component
	if component == "" {
		component = ComponentSluice
	}
	target := -1
	for i, s := range all {
		if s.component == component {
			target = i
		}
	}
	if target < 0 {
		return nil, fmt.Errorf("unknown migration component %q (known: %s)", component, componentNames(all))
	}
	if d.River && (component != ComponentSluice || d.To == nil || *d.To != 0) {
		return nil, errors.New("removing River's schema needs every migration rolled back: down --to 0 of sluice")
	}
	var steps []Step
	err := withLock(ctx, pool, func() error {
		exists, err := db.New(pool).SchemaExists(ctx, schemas.Sluice)
		if err != nil {
			return fmt.Errorf("look up sluice's schema: %w", err)
		}
		if !exists {
			return nil // nothing of sluice's to roll back
		}
		down := func(s set, to *int64) error {
			if exists, err := db.New(pool).TableExists(ctx, s.table); err != nil {
				return fmt.Errorf("look up %s: %w", s.table, err)
			} else if !exists {
				return nil // never migrated: nothing to roll back
			}
			provider, closeFn, err := newProvider(pool, s, opts.Logger)
			if err != nil {
				return err
			}
			defer closeFn()
			if to != nil {
				results, err := provider.DownTo(ctx, *to)
				steps = append(steps, gooseSteps(s.component, results)...)
				if err != nil {
					return migrationError(s.component, fmt.Sprintf("roll back to %d", *to), err)
				}
				return nil
			}
			result, err := provider.Down(ctx)
			if result != nil {
				steps = append(steps, gooseSteps(s.component, []*goose.MigrationResult{result})...)
			}
			if err != nil && !isNoMigrations(err) {
				return migrationError(s.component, "roll back", err)
			}
			return nil
		}
		if component == ComponentSluice && d.To != nil && *d.To == 0 {
			// What builds on sluice's core goes first, last applied first.
			zero := int64(0)
			for i := len(all) - 1; i > 0; i-- {
				if err := down(all[i], &zero); err != nil {
					return err
				}
			}
		}
		if err := down(all[target], d.To); err != nil {
			return err
		}
		if !d.River {
			return nil
		}
		riverSteps, err := riverMigrate(ctx, pool, opts.Logger, rivermigrate.DirectionDown, &rivermigrate.MigrateOpts{TargetVersion: -1})
		steps = append(steps, riverSteps...)
		if err != nil {
			return err
		}
		return dropSchema(ctx, pool, schemas)
	})
	return steps, err
}

// Status lists every migration River, sluice, the modules and the
// application know, and whether it is applied.
func Status(ctx context.Context, pool *pgxpool.Pool, opts Options) ([]VersionStatus, error) {
	schemas := pgkit.SchemasOf(pool)
	migrator, err := newRiverMigrator(pool, opts.Logger)
	if err != nil {
		return nil, err
	}
	applied := map[int]bool{}
	existing, err := migrator.ExistingVersions(ctx)
	if err != nil && !isUndefinedTable(err) {
		return nil, fmt.Errorf("read River schema versions: %w", err)
	}
	for _, m := range existing {
		applied[m.Version] = true
	}
	var out []VersionStatus
	for _, m := range migrator.AllVersions() {
		out = append(out, VersionStatus{Component: ComponentRiver, Name: m.Name, Version: int64(m.Version), Applied: applied[m.Version]})
	}
	for _, s := range sets(schemas, opts) {
		// Only where the version table exists: goose would create it, and
		// a status or a check must write nothing (a read-only role, or an
		// install of the old layout not moved yet).
		exists, err := db.New(pool).TableExists(ctx, s.table)
		if err != nil {
			return nil, fmt.Errorf("look up %s: %w", s.table, err)
		}
		var statuses []*goose.MigrationStatus
		if exists {
			provider, closeFn, err := newProvider(pool, s, opts.Logger)
			if err != nil {
				return nil, err
			}
			statuses, err = provider.Status(ctx)
			closeFn()
			if err != nil {
				return nil, fmt.Errorf("read %s schema versions: %w", s.component, err)
			}
		} else if statuses, err = pendingStatuses(s); err != nil {
			return nil, fmt.Errorf("read %s migrations: %w", s.component, err)
		}
		for _, st := range statuses {
			vs := VersionStatus{Component: s.component, Name: st.Source.Path, Version: st.Source.Version, Applied: st.State == goose.StateApplied}
			if vs.Applied {
				at := st.AppliedAt
				vs.AppliedAt = &at
			}
			out = append(out, vs)
		}
	}
	return out, nil
}

// ErrNotMigrated reports a database whose schema lags behind this binary.
var ErrNotMigrated = errors.New("database schema is not up to date: run `sluice migrate up`")

// Check returns ErrNotMigrated (wrapped, naming what is missing) unless every
// migration of River, sluice, the modules and the application is applied,
// and ErrRiverUnsupported (wrapped, naming the versions sluice supports)
// when River's schema is newer than this sluice's River knows.
func Check(ctx context.Context, pool *pgxpool.Pool, opts Options) error {
	if err := checkRiverVersion(ctx, pool, opts); err != nil {
		return err
	}
	statuses, err := Status(ctx, pool, opts)
	if err != nil {
		return err
	}
	for _, s := range statuses {
		if !s.Applied {
			if s.Component == ComponentRiver && s.Version <= MinRiverVersion {
				return fmt.Errorf("%w (River's schema is older than version %d, the oldest sluice supports: river migration %s is pending)",
					ErrNotMigrated, MinRiverVersion, s.Name)
			}
			return fmt.Errorf("%w (%s migration %s is pending)", ErrNotMigrated, s.Component, s.Name)
		}
	}
	return nil
}

func withLock(ctx context.Context, pool *pgxpool.Pool, fn func() error) error {
	lock, err := pgkit.Lock(ctx, pool, LockName)
	if err != nil {
		return fmt.Errorf("take migration lock: %w", err)
	}
	defer lock.Release(ctx) //nolint:errcheck // closing the connection releases it too
	return fn()
}

func newRiverMigrator(pool *pgxpool.Pool, logger *slog.Logger) (*rivermigrate.Migrator[pgx.Tx], error) {
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: logger, Schema: pgkit.SchemasOf(pool).River})
	if err != nil {
		return nil, fmt.Errorf("create River migrator: %w", err)
	}
	return migrator, nil
}

func riverMigrate(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger, direction rivermigrate.Direction, opts *rivermigrate.MigrateOpts) ([]Step, error) {
	migrator, err := newRiverMigrator(pool, logger)
	if err != nil {
		return nil, err
	}
	res, err := migrator.Migrate(ctx, direction, opts)
	if err != nil {
		return nil, fmt.Errorf("migrate River schema %s: %w", direction, err)
	}
	steps := make([]Step, 0, len(res.Versions))
	for _, v := range res.Versions {
		steps = append(steps, Step{Component: ComponentRiver, Name: v.Name, Direction: string(direction), Version: int64(v.Version), Duration: v.Duration})
	}
	return steps, nil
}

// newProvider returns the goose provider of s: on pool (sluice's
// search_path), or for the application's set on a connection with the
// connection string's own search_path.
func newProvider(pool *pgxpool.Pool, s set, logger *slog.Logger) (*goose.Provider, func(), error) {
	var sqlDB *sql.DB
	if s.app {
		sqlDB = stdlib.OpenDB(*pgkit.AppConnConfig(pool))
	} else {
		sqlDB = stdlib.OpenDBFromPool(pool)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, sqlDB, s.fsys,
		goose.WithSlog(logger),
		goose.WithDisableGlobalRegistry(true),
		goose.WithTableName(s.table),
	)
	if err != nil {
		_ = sqlDB.Close()
		return nil, nil, fmt.Errorf("load %s migrations: %w", s.component, err)
	}
	return provider, func() { _ = sqlDB.Close() }, nil
}

// pendingStatuses lists the migrations of s as pending, for a database
// whose schema does not exist yet.
func pendingStatuses(s set) ([]*goose.MigrationStatus, error) {
	entries, err := fs.ReadDir(s.fsys, ".")
	if err != nil {
		return nil, err
	}
	var out []*goose.MigrationStatus
	for _, e := range entries {
		if e.IsDir() || path.Ext(e.Name()) != ".sql" {
			continue
		}
		version, err := goose.NumericComponent(e.Name())
		if err != nil {
			continue
		}
		out = append(out, &goose.MigrationStatus{
			Source: &goose.Source{Type: goose.TypeSQL, Path: e.Name(), Version: version},
			State:  goose.StatePending,
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Source.Version < out[j].Source.Version })
	return out, nil
}

func gooseSteps(component string, results []*goose.MigrationResult) []Step {
	steps := make([]Step, 0, len(results))
	for _, r := range results {
		if r == nil || r.Source == nil {
			continue
		}
		steps = append(steps, Step{Component: component, Name: r.Source.Path, Direction: r.Direction, Version: r.Source.Version, Duration: r.Duration})
	}
	return steps
}

// migrationError names the component and, when goose says which, the file
// of a failed migration.
func migrationError(component, what string, err error) error {
	var partial *goose.PartialError
	if errors.As(err, &partial) && partial.Failed != nil && partial.Failed.Source != nil {
		return fmt.Errorf("%s %s migration %s: %w", what, component, partial.Failed.Source.Path, partial.Err)
	}
	return fmt.Errorf("%s %s migrations: %w", what, component, err)
}

func componentNames(all []set) string {
	s := ""
	for i, x := range all {
		if i > 0 {
			s += ", "
		}
		s += x.component
	}
	return s
}
