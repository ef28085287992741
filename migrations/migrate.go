// Package migrations holds sluice's goose migrations (embedded) and applies
// them together with River's own schema, which comes from rivermigrate.
package migrations

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/sluice-dev/sluice/db"
)

// LockName names the advisory lock that serializes migrations, so that
// several processes may run `sluice migrate up` at once.
const LockName = "sluice.migrate"

// Step is one migration applied or rolled back.
type Step struct {
	// Component is "river" or "sluice".
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
	// To is the sluice version to roll back to; nil means one step.
	To *int64
	// River also removes River's schema, once every sluice migration is
	// rolled back (sluice's schema depends on River's).
	River bool
}

// Up applies River's migrations and then sluice's, under LockName. It is
// idempotent: with nothing pending it applies nothing.
func Up(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) ([]Step, error) {
	var steps []Step
	err := withLock(ctx, pool, func() error {
		riverSteps, err := riverMigrate(ctx, pool, logger, rivermigrate.DirectionUp, nil)
		if err != nil {
			return err
		}
		steps = append(steps, riverSteps...)

		provider, closeFn, err := newProvider(pool, logger)
		if err != nil {
			return err
		}
		defer closeFn()
		results, err := provider.Up(ctx)
		steps = append(steps, gooseSteps(results)...)
		if err != nil {
			return fmt.Errorf("apply sluice migrations: %w", err)
		}
		return nil
	})
	return steps, err
}

// Down rolls back sluice migrations (one, or down to opts.To) and, with
// opts.River, River's schema too.
func Down(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger, opts DownOpts) ([]Step, error) {
	var steps []Step
	err := withLock(ctx, pool, func() error {
		provider, closeFn, err := newProvider(pool, logger)
		if err != nil {
			return err
		}
		defer closeFn()

		if opts.To != nil {
			results, err := provider.DownTo(ctx, *opts.To)
			steps = append(steps, gooseSteps(results)...)
			if err != nil {
				return fmt.Errorf("roll back sluice migrations to %d: %w", *opts.To, err)
			}
		} else {
			result, err := provider.Down(ctx)
			if result != nil {
				steps = append(steps, gooseSteps([]*goose.MigrationResult{result})...)
			}
			if err != nil && !isNoMigrations(err) {
				return fmt.Errorf("roll back sluice migration: %w", err)
			}
		}
		if !opts.River {
			return nil
		}
		version, err := provider.GetDBVersion(ctx)
		if err != nil {
			return fmt.Errorf("read sluice schema version: %w", err)
		}
		if version != 0 {
			return fmt.Errorf("cannot remove River's schema while sluice migrations up to %d are applied (use --to 0)", version)
		}
		riverSteps, err := riverMigrate(ctx, pool, logger, rivermigrate.DirectionDown, &rivermigrate.MigrateOpts{TargetVersion: -1})
		steps = append(steps, riverSteps...)
		return err
	})
	return steps, err
}

// Status lists every migration River and sluice know, and whether it is
// applied.
func Status(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) ([]VersionStatus, error) {
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("create River migrator: %w", err)
	}
	applied := map[int]time.Time{}
	existing, err := migrator.ExistingVersions(ctx)
	if err != nil && !isUndefinedTable(err) {
		return nil, fmt.Errorf("read River schema versions: %w", err)
	}
	for _, m := range existing {
		applied[m.Version] = time.Time{}
	}
	var out []VersionStatus
	for _, m := range migrator.AllVersions() {
		_, ok := applied[m.Version]
		out = append(out, VersionStatus{Component: "river", Name: m.Name, Version: int64(m.Version), Applied: ok})
	}

	provider, closeFn, err := newProvider(pool, logger)
	if err != nil {
		return nil, err
	}
	defer closeFn()
	statuses, err := provider.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("read sluice schema versions: %w", err)
	}
	for _, s := range statuses {
		vs := VersionStatus{Component: "sluice", Name: s.Source.Path, Version: s.Source.Version, Applied: s.State == goose.StateApplied}
		if vs.Applied {
			at := s.AppliedAt
			vs.AppliedAt = &at
		}
		out = append(out, vs)
	}
	return out, nil
}

func withLock(ctx context.Context, pool *pgxpool.Pool, fn func() error) error {
	lock, err := db.Lock(ctx, pool, LockName)
	if err != nil {
		return fmt.Errorf("take migration lock: %w", err)
	}
	defer lock.Release(ctx) //nolint:errcheck // closing the connection releases it too
	return fn()
}

func riverMigrate(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger, direction rivermigrate.Direction, opts *rivermigrate.MigrateOpts) ([]Step, error) {
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("create River migrator: %w", err)
	}
	res, err := migrator.Migrate(ctx, direction, opts)
	if err != nil {
		return nil, fmt.Errorf("migrate River schema %s: %w", direction, err)
	}
	steps := make([]Step, 0, len(res.Versions))
	for _, v := range res.Versions {
		steps = append(steps, Step{Component: "river", Name: v.Name, Direction: string(direction), Version: int64(v.Version), Duration: v.Duration})
	}
	return steps, nil
}

func newProvider(pool *pgxpool.Pool, logger *slog.Logger) (*goose.Provider, func(), error) {
	sqlDB := stdlib.OpenDBFromPool(pool)
	provider, err := goose.NewProvider(goose.DialectPostgres, sqlDB, FS,
		goose.WithSlog(logger),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		_ = sqlDB.Close()
		return nil, nil, fmt.Errorf("load sluice migrations: %w", err)
	}
	return provider, func() { _ = sqlDB.Close() }, nil
}

func gooseSteps(results []*goose.MigrationResult) []Step {
	steps := make([]Step, 0, len(results))
	for _, r := range results {
		if r == nil || r.Source == nil {
			continue
		}
		steps = append(steps, Step{Component: "sluice", Name: r.Source.Path, Direction: r.Direction, Version: r.Source.Version, Duration: r.Duration})
	}
	return steps
}

// ErrNotMigrated reports a database whose schema lags behind this binary.
var ErrNotMigrated = errors.New("database schema is not up to date: run `sluice migrate up`")

// Check returns ErrNotMigrated (wrapped, naming what is missing) unless every
// River and sluice migration this binary knows is applied.
func Check(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) error {
	statuses, err := Status(ctx, pool, logger)
	if err != nil {
		return err
	}
	for _, s := range statuses {
		if !s.Applied {
			return fmt.Errorf("%w (%s migration %s is pending)", ErrNotMigrated, s.Component, s.Name)
		}
	}
	return nil
}
