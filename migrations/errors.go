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

// isUndefinedSchema reports a missing schema, as when sluice's schema has
// not been created yet.
func isUndefinedSchema(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "3F000" || pgErr.Code == "42P01")
}
