package migrations

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/pgkit"
)

// MinRiverVersion is the oldest version of River's schema sluice works
// with: 6 (bulk unique jobs: river_job.unique_key and unique_states, which
// parking in place keeps). sluice's own River (its go.mod) brings the
// newest it knows; `migrate up` applies them.
const MinRiverVersion = 6

// ErrRiverUnsupported reports River's schema at a version this sluice does
// not work with.
var ErrRiverUnsupported = errors.New("River's schema is at a version this sluice does not support")

// checkRiverVersion refuses River's schema when it is newer than the
// newest version this sluice's River knows (a newer River migrated it,
// ErrRiverUnsupported), or older than MinRiverVersion (ErrNotMigrated:
// `migrate up` brings it up), naming the version found and those
// supported. One older than the newest but supported is pending, which
// Check reports as ErrNotMigrated.
func checkRiverVersion(ctx context.Context, pool *pgxpool.Pool, opts Options) error {
	migrator, err := newRiverMigrator(pool, opts.Logger)
	if err != nil {
		return err
	}
	known := 0
	for _, m := range migrator.AllVersions() {
		known = max(known, m.Version)
	}
	// Read directly: River's migrator refuses a version it does not know.
	table := "river_migration"
	if river := pgkit.SchemasOf(pool).River; river != "" {
		table = pgx.Identifier{river, table}.Sanitize()
	}
	exists, err := db.New(pool).TableExists(ctx, table)
	if err != nil || !exists {
		return err // not migrated at all: Check says so
	}
	version, err := db.New(pool).RiverSchemaVersion(ctx)
	if err != nil {
		return fmt.Errorf("read River schema version: %w", err)
	}
	if version < MinRiverVersion {
		return fmt.Errorf("%w (River's schema is at version %d, and this sluice supports River's schema versions %d to %d)",
			ErrNotMigrated, version, MinRiverVersion, known)
	}
	if version > int64(known) {
		return fmt.Errorf("%w: it is at version %d, and this sluice supports River's schema versions %d to %d: upgrade sluice (its River) before starting it",
			ErrRiverUnsupported, version, MinRiverVersion, known)
	}
	return nil
}
