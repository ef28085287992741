package db

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultMaxConns is the pool size used when the connection string does not
// set pool_max_conns. pgxpool's own default (4 on a 2-core machine) is too
// small for a worker that runs jobs, a dispatcher and maintenance locks.
const DefaultMaxConns = 20

// URLError reports a connection string that cannot be parsed. It is an input
// error: the command line or DATABASE_URL is wrong, not the database.
type URLError struct {
	msg string
}

func (e *URLError) Error() string { return e.msg }

// ParseConfig parses a pgx connection string (URL or key=value) into a pool
// configuration. Errors never contain the password.
func ParseConfig(connString string) (*pgxpool.Config, error) {
	if strings.TrimSpace(connString) == "" {
		return nil, &URLError{msg: "no database URL: set DATABASE_URL or pass --database-url"}
	}
	config, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, &URLError{msg: "invalid database URL: " + Redact(err.Error(), connString)}
	}
	if !PoolSizeSet(connString) {
		config.MaxConns = DefaultMaxConns
	}
	return config, nil
}

// PoolSizeSet reports whether connString sets the pool's size
// (pool_max_conns).
func PoolSizeSet(connString string) bool { return strings.Contains(connString, "pool_max_conns") }

// Open connects a pool to connString, with sluice's schema and River's
// default one on its search_path (UseSchemas), and checks that the server
// answers within timeout. Errors never contain the password.
func Open(ctx context.Context, connString string, timeout time.Duration) (*pgxpool.Pool, error) {
	return OpenSchemas(ctx, connString, Schemas{}, timeout)
}

// OpenSchemas is Open with the schemas s.
func OpenSchemas(ctx context.Context, connString string, s Schemas, timeout time.Duration) (*pgxpool.Pool, error) {
	config, err := ParseConfig(connString)
	if err != nil {
		return nil, err
	}
	ctx2, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := UseSchemas(ctx2, config, connString, s); err != nil {
		return nil, err
	}
	return OpenConfig(ctx, config, connString, timeout)
}

// OpenConfig is Open for an already parsed configuration; connString is only
// used to scrub the password from errors.
func OpenConfig(ctx context.Context, config *pgxpool.Config, connString string, timeout time.Duration) (*pgxpool.Pool, error) {
	pool, err := pgxpool.NewWithConfig(ctx, config)
	if err != nil {
		return nil, fmt.Errorf("open database pool: %s", Redact(err.Error(), connString))
	}
	pingCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to database %s: %s", Describe(config), oneLine(Redact(err.Error(), connString)))
	}
	return pool, nil
}

// Describe names the server and database of a configuration without its
// password, for log lines and errors.
func Describe(config *pgxpool.Config) string {
	c := config.ConnConfig
	return fmt.Sprintf("host=%s port=%d user=%s database=%s", c.Host, c.Port, c.User, c.Database)
}

var (
	urlPasswordRE = regexp.MustCompile(`(://[^:/@\s]*:)[^@\s]*@`)
	kvPasswordRE  = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)
	rawPasswordRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*://[^:/@]*:([^@]*)@`)
	kvRawRE       = regexp.MustCompile(`(?i)password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)`)
)

// Redact removes passwords from s: any URL user-info password, any
// password=… pair, and the literal password of connString wherever it occurs.
func Redact(s, connString string) string {
	for _, re := range []*regexp.Regexp{rawPasswordRE, kvRawRE} {
		if m := re.FindStringSubmatch(connString); m != nil {
			pw := strings.Trim(m[1], "'")
			if len(pw) >= 3 {
				s = strings.ReplaceAll(s, pw, "xxxxx")
			}
		}
	}
	s = urlPasswordRE.ReplaceAllString(s, "${1}xxxxx@")
	s = kvPasswordRE.ReplaceAllString(s, "${1}xxxxx")
	return s
}

// IsURLError reports whether err is (or wraps) a connection string error.
func IsURLError(err error) bool {
	var urlErr *URLError
	return errors.As(err, &urlErr)
}

// oneLine folds a multi-line driver error into one line, dropping repeated
// lines (pgx reports each connection attempt, often the same twice).
func oneLine(msg string) string {
	var parts []string
	seen := map[string]bool{}
	for _, line := range strings.Split(msg, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || seen[line] {
			continue
		}
		seen[line] = true
		parts = append(parts, line)
	}
	return strings.Join(parts, " ")
}
