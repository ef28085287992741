package pgkit

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/db"
)

// DefaultSchema is the Postgres schema of sluice's tables, views, functions
// and goose version tables, unless configured otherwise.
const DefaultSchema = "sluice"

// The custom settings that carry the schemas on every connection of a pool
// set up by UseSchemas (and tell SchemasOf what they are).
const (
	settingSchema      = "sluice.schema"
	settingRiverSchema = "sluice.river_schema"
	// settingAppSearchPath is the search_path the connection string asked
	// for ("" when none): the application's own migrations run with it.
	settingAppSearchPath = "sluice.app_search_path"
)

// Schemas names where sluice's objects and River's tables live.
type Schemas struct {
	// Sluice is sluice's schema (DefaultSchema when empty).
	Sluice string
	// River is River's schema (River's own Schema option). Empty: where the
	// connection's search_path puts River's tables, usually public.
	River string
}

var (
	schemaNameRE      = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)
	riverSchemaNameRE = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]{0,62}$`)
)

// ValidateSchema checks a sluice schema name: lowercase letters, digits and
// underscores, not starting with a digit, at most 63 bytes; not pg_*.
func ValidateSchema(name string) error {
	if !schemaNameRE.MatchString(name) || len(name) >= 3 && name[:3] == "pg_" {
		return fmt.Errorf("invalid schema name %q: want lowercase letters, digits and underscores (at most 63, not starting with a digit or pg_)", name)
	}
	return nil
}

// ValidateRiverSchema checks a River schema name as River does.
func ValidateRiverSchema(name string) error {
	if !riverSchemaNameRE.MatchString(name) {
		return fmt.Errorf("invalid River schema name %q: want letters, digits and underscores, not starting with a digit", name)
	}
	return nil
}

// UseSchemas sets up config so that every connection of its pool finds
// sluice's objects first and River's tables second: search_path is
// "<sluice>", "<river>". A River schema left empty is resolved here, once,
// as River would find its tables with the configuration's own search_path
// (this connects to the server; LocateRiverSchema), never as sluice's own
// schema. The two schemas must differ. It returns the schemas with River's
// resolved. connString is only used to scrub the password from errors.
func UseSchemas(ctx context.Context, config *pgxpool.Config, connString string, s Schemas) (Schemas, error) {
	if s.Sluice == "" {
		s.Sluice = DefaultSchema
	}
	if err := ValidateSchema(s.Sluice); err != nil {
		return Schemas{}, err
	}
	params := config.ConnConfig.RuntimeParams
	if _, done := params[settingSchema]; !done {
		params[settingAppSearchPath] = params["search_path"]
	}
	if s.River == "" {
		river, err := locateRiver(ctx, config, s.Sluice)
		if err != nil {
			return Schemas{}, errors.New(Redact(fmt.Sprintf("connect to database %s: %s", Describe(config), oneLine(err.Error())), connString))
		}
		s.River = river
	}
	if err := ValidateRiverSchema(s.River); err != nil {
		return Schemas{}, err
	}
	if s.River == s.Sluice {
		return Schemas{}, fmt.Errorf("sluice's schema and River's are both %q: sluice's objects need a schema of their own (--schema)", s.Sluice)
	}
	params["search_path"] = pgx.Identifier{s.Sluice}.Sanitize() + ", " + pgx.Identifier{s.River}.Sanitize()
	params[settingSchema] = s.Sluice
	params[settingRiverSchema] = s.River
	return s, nil
}

// locateRiver finds River's schema for a connection with config's own
// search_path (LocateRiverSchema), skipping sluice's.
func locateRiver(ctx context.Context, config *pgxpool.Config, sluice string) (string, error) {
	cc := config.ConnConfig.Copy()
	cc.RuntimeParams = map[string]string{}
	for k, v := range config.ConnConfig.RuntimeParams {
		cc.RuntimeParams[k] = v
	}
	if app, ok := cc.RuntimeParams[settingAppSearchPath]; ok {
		if app == "" {
			delete(cc.RuntimeParams, "search_path")
		} else {
			cc.RuntimeParams["search_path"] = app
		}
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	schema, err := db.New(conn).LocateRiverSchema(ctx, sluice)
	if err != nil {
		return "", fmt.Errorf("locate River's schema: %w", err)
	}
	return schema, nil
}

// SchemasOf returns the schemas UseSchemas set up on pool's configuration
// (DefaultSchema and "" when it did not).
func SchemasOf(pool *pgxpool.Pool) Schemas {
	params := pool.Config().ConnConfig.RuntimeParams
	s := Schemas{Sluice: params[settingSchema], River: params[settingRiverSchema]}
	if s.Sluice == "" {
		s.Sluice = DefaultSchema
	}
	return s
}

// AppConnConfig returns a copy of pool's connection configuration with the
// search_path the connection string asked for, not sluice's: the
// application's own migrations run on it.
func AppConnConfig(pool *pgxpool.Pool) *pgx.ConnConfig {
	cc := pool.Config().ConnConfig.Copy()
	params := map[string]string{}
	for k, v := range cc.RuntimeParams {
		params[k] = v
	}
	if app, ok := params[settingAppSearchPath]; ok {
		if app == "" {
			delete(params, "search_path")
		} else {
			params["search_path"] = app
		}
	}
	cc.RuntimeParams = params
	return cc
}
