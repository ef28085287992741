package cibuilds

import (
	"embed"
	"io/fs"
)

// migrationsFS holds the module's goose migrations, tracked in the version
// table goose_db_version_cibuilds of sluice's schema.
//
//go:embed migrations/*.sql
var migrationsFS embed.FS

// migrations is the module's migrations, rooted at the folder of its files.
func migrations() fs.FS {
	sub, err := fs.Sub(migrationsFS, "migrations")
	if err != nil {
		panic(err) // the embedded folder is always there
	}
	return sub
}
