package pgkit

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
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
		return nil, errors.New(Redact(fmt.Sprintf("connect to database %s: %s", Describe(config), oneLine(err.Error())), connString))
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
	// urlPasswordRE matches the password of a URL's user info, up to the
	// last '@' before the path (an unencoded '@' may be part of it).
	urlPasswordRE = regexp.MustCompile(`(://[^:/@\s]*:)[^/\s]*@`)
	kvPasswordRE  = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)
)

// Redact removes passwords from s: the password of connString as pgx
// itself reads it (URL or key=value, decoded, and as written), wherever it
// occurs, then any URL user-info password and any password=… pair.
func Redact(s, connString string) string {
	for _, pw := range passwordsOf(connString) {
		s = strings.ReplaceAll(s, pw, "xxxxx")
	}
	s = urlPasswordRE.ReplaceAllString(s, "${1}xxxxx@")
	s = kvPasswordRE.ReplaceAllString(s, "${1}xxxxx")
	return s
}

// passwordsOf returns the password of connString in every form it may
// appear in a message: as pgx parses it (decoded) and as written in the
// string (percent-encoded, quoted), longest first.
func passwordsOf(connString string) []string {
	var out []string
	add := func(pw string) {
		// A password of one or two characters would blank every occurrence
		// of them; the patterns above still catch it in place.
		if len(pw) >= 3 && !slices.Contains(out, pw) {
			out = append(out, pw)
		}
	}
	if cfg, err := pgconn.ParseConfig(connString); err == nil {
		add(cfg.Password)
	}
	if m := urlPasswordRE.FindStringSubmatchIndex(connString); m != nil {
		raw := connString[m[3] : m[1]-1] // between "user:" and the last '@'
		add(raw)
		if dec, err := url.PathUnescape(raw); err == nil {
			add(dec)
		}
		// A parser that ends the user info at the first '@' (pgx does) takes
		// the rest of the password for the host, and names it in errors.
		for i := strings.Index(raw, "@"); i >= 0; i = strings.Index(raw, "@") {
			raw = raw[i+1:]
			add(raw)
		}
	}
	for _, m := range kvPasswordRE.FindAllStringSubmatch(connString, -1) {
		add(m[2])
		if unq := strings.Trim(m[2], "'"); unq != m[2] {
			add(strings.ReplaceAll(unq, `\'`, "'"))
		}
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
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
