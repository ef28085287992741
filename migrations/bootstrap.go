package migrations

import (
	"context"
	"embed"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/pgkit"
)

// BootstrapFS holds the SQL `migrate up` runs before any goose migration:
// it cannot be a goose migration, since it creates (or moves into) the
// schema that holds goose's version tables. Its schema names are
// configurable, so its files are templates: each /* TEMPLATE: name */ is
// replaced by a quoted identifier (validated by pgkit.ValidateSchema and
// sanitized by pgx), as River does with its own migrations.
//
//go:embed bootstrap/*.sql
var BootstrapFS embed.FS

// render returns the bootstrap file name with its templates replaced.
func render(name string, schemas pgkit.Schemas) (string, error) {
	raw, err := BootstrapFS.ReadFile("bootstrap/" + name)
	if err != nil {
		return "", err
	}
	schema := pgx.Identifier{schemas.Sluice}.Sanitize()
	river := pgx.Identifier{schemas.River}.Sanitize()
	return strings.NewReplacer(
		"/* TEMPLATE: schema */", schema,
		"/* TEMPLATE: legacy */", river,
		"/* TEMPLATE: river */", river,
		"/* TEMPLATE: search_path */", schema+", "+river,
	).Replace(string(raw)), nil
}

// bootstrap creates sluice's schema and, when the database holds the
// layout from before it had one (everything in River's schema), moves that
// install into it, in one transaction.
func bootstrap(ctx context.Context, pool *pgxpool.Pool, schemas pgkit.Schemas, logger *slog.Logger) error {
	legacy, err := db.New(pool).LegacyLayout(ctx, db.LegacyLayoutParams{Schema: schemas.Sluice, LegacySchema: schemas.River})
	if err != nil {
		return fmt.Errorf("look for sluice's old layout: %w", err)
	}
	name := "schema.sql"
	if legacy != nil && *legacy && schemas.River != schemas.Sluice {
		name = "legacy.sql"
		if logger != nil {
			logger.Warn("moving sluice's tables, views and functions into their own schema",
				"from", schemas.River, "to", schemas.Sluice)
		}
	}
	sql, err := render(name, schemas)
	if err != nil {
		return err
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, sql)
		return err
	}); err != nil {
		return fmt.Errorf("bootstrap sluice's schema %s (%s): %w", schemas.Sluice, name, err)
	}
	return nil
}

// createRiverSchema creates River's schema if it is missing.
func createRiverSchema(ctx context.Context, pool *pgxpool.Pool, schemas pgkit.Schemas) error {
	sql, err := render("river_schema.sql", schemas)
	if err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, sql); err != nil {
		return fmt.Errorf("create River's schema %s: %w", schemas.River, err)
	}
	return nil
}

// dropSchema removes sluice's version tables and its schema once every
// migration is rolled back; a schema that still holds other objects stays.
func dropSchema(ctx context.Context, pool *pgxpool.Pool, schemas pgkit.Schemas) error {
	sql, err := render("drop.sql", schemas)
	if err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, sql); err != nil {
		return fmt.Errorf("drop sluice's schema %s: %w", schemas.Sluice, err)
	}
	return nil
}
