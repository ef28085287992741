package migrations

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pressly/goose/v3"
)

func isNoMigrations(err error) bool {
	return errors.Is(err, goose.ErrNoNextVersion) || errors.Is(err, goose.ErrNoMigrations) || errors.Is(err, goose.ErrVersionNotFound)
}

// isUndefinedTable reports a missing table, as when River's schema has not
// been created yet.
func isUndefinedTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P01"
}
