package sluice

import (
	"context"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/migrations"
)

// Migrate applies the migrations of the program cfg describes to
// cfg.DatabaseURL, as `migrate up` does: River's (in River's schema), then
// sluice's, the modules' and cfg.Migrations, each set tracked in a version
// table of its own in sluice's schema (cfg.Schema). It is idempotent and
// safe to run from several processes at once. It returns the migrations it
// applied.
func Migrate(ctx context.Context, cfg Config) ([]migrations.Step, error) {
	prog := cfg.Program()
	pool, err := app.OpenPool(ctx, cfg.DatabaseURL, "sluice migrate", prog.Schemas)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	return migrations.Up(ctx, pool, prog.MigrationOptions(cfg.Logger))
}
