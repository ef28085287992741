package migrations

import "embed"

// FS holds sluice's goose migrations, embedded into the binary.
//
//go:embed *.sql
var FS embed.FS
