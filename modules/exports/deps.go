package exports

import (
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/maintenance"
	"github.com/sluice-dev/sluice/settings"
)

// deps is what the module's workers share.
type deps struct {
	Pool     *pgxpool.Pool
	Logger   *slog.Logger
	Queries  *db.Queries
	Settings *settings.Settings
	Metrics  *Metrics
	// Dir is where export.project writes archives; empty means DefaultDir.
	Dir    string
	runner *maintenance.Runner
}

func (d *deps) maintenanceTimeout() time.Duration { return d.runner.Timeout() }

func (d *deps) exportDir() string {
	if d.Dir != "" {
		return d.Dir
	}
	return DefaultDir
}
