// Package testdb gives each test its own fresh, fully migrated Postgres
// database, cloned from a template that is migrated once per migration set,
// and drops it when the test ends. Tests therefore run in parallel, across
// packages and processes, without seeing each other's rows.
//
// The server is TEST_DATABASE_URL (any database on it; the harness needs the
// right to create databases), default postgres://postgres@127.0.0.1:5432/postgres.
// `make test` sets it, starting a private cluster under .dev/ when no server
// answers on 127.0.0.1:5432.
package testdb

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/migrations"
	"github.com/sluice-dev/sluice/modules"
)

// DefaultServerURL is used when TEST_DATABASE_URL is not set.
const DefaultServerURL = "postgres://postgres@127.0.0.1:5432/postgres"

// Prefixes of the databases the harness creates.
const (
	TemplatePrefix = "sluice_tmpl_"
	TestPrefix     = "sluice_test_"
)

// templateLock serializes template builds across test processes.
const templateLock = "sluice.testdb.template"

var (
	setupOnce sync.Once
	setupErr  error
	admin     *pgxpool.Pool
	adminURL  string
	template  string
)

// ServerURL is the connection string of the test server.
func ServerURL() string {
	if url := os.Getenv("TEST_DATABASE_URL"); url != "" {
		return url
	}
	return DefaultServerURL
}

// New creates a fresh migrated database for tb and returns its connection
// string. The database is dropped when tb ends.
func New(tb testing.TB) string {
	tb.Helper()
	return create(tb, true)
}

// NewPool creates a fresh migrated database for tb and returns a pool on it,
// closed before the database is dropped.
func NewPool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	url := New(tb)
	pool, err := pgkit.Open(context.Background(), url, 10*time.Second)
	if err != nil {
		tb.Fatalf("test database: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// NewEmpty creates an empty (unmigrated) database for tb, dropped when tb
// ends, and returns its connection string.
func NewEmpty(tb testing.TB) string {
	tb.Helper()
	return create(tb, false)
}

// NewForExample creates a fresh migrated database for a runnable Example,
// which has no testing.TB to clean up after it, and returns its connection
// string and a func that drops it (defer it). Like the rest of an Example,
// it panics when it fails: creating the database, or dropping it.
func NewForExample() (url string, drop func()) {
	url, dropDB, err := createDB(true)
	if err != nil {
		panic(err)
	}
	return url, func() {
		if err := dropDB(); err != nil {
			panic(err)
		}
	}
}

// create makes a database of a fresh name (a clone of the migrated template,
// or empty), drops it when tb ends, and returns its connection string.
func create(tb testing.TB, fromTemplate bool) string {
	tb.Helper()
	url, drop, err := createDB(fromTemplate)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := drop(); err != nil {
			tb.Error(err)
		}
	})
	return url
}

// createDB makes a database of a fresh name (a clone of the migrated
// template, or empty) and returns its connection string and the func that
// drops it.
func createDB(fromTemplate bool) (string, func() error, error) {
	setupOnce.Do(func() { setupErr = setup() })
	if setupErr != nil {
		return "", nil, fmt.Errorf("test database: %w", setupErr)
	}
	name := TestPrefix + randomHex(8)
	sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if fromTemplate {
		sql += " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := admin.Exec(ctx, sql); err != nil {
		return "", nil, fmt.Errorf("test database: create %s: %w", name, err)
	}
	drop := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("test database: drop %s: %w", name, err)
		}
		return nil
	}
	return urlFor(name), drop, nil
}

func setup() error {
	adminURL = ServerURL()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var err error
	admin, err = pgkit.Open(ctx, adminURL, 10*time.Second)
	if err != nil {
		return fmt.Errorf("%w (set TEST_DATABASE_URL, or run `make test`, which starts a private server when none answers)", err)
	}
	hash, err := migrationsHash()
	if err != nil {
		return err
	}
	template = TemplatePrefix + hash
	return ensureTemplate(ctx)
}

// ensureTemplate builds the template database for the current migrations
// unless it exists. A build happens under an advisory lock, into a scratch
// database that is renamed only once fully migrated, so a crashed build
// leaves nothing that looks finished.
func ensureTemplate(ctx context.Context) error {
	lock, err := pgkit.Lock(ctx, admin, templateLock)
	if err != nil {
		return err
	}
	defer lock.Release(ctx) //nolint:errcheck

	var exists bool
	if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", template).Scan(&exists); err != nil {
		return fmt.Errorf("look up template: %w", err)
	}
	if exists {
		return nil
	}
	scratch := template + "_build"
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{scratch}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop stale template build: %w", err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{scratch}.Sanitize()); err != nil {
		return fmt.Errorf("create template: %w", err)
	}
	pool, err := pgkit.Open(ctx, urlFor(scratch), 10*time.Second)
	if err != nil {
		return err
	}
	_, err = migrations.Up(ctx, pool, migrations.Options{Modules: modules.All(), Logger: slog.New(slog.DiscardHandler)})
	pool.Close()
	if err != nil {
		return fmt.Errorf("migrate template: %w", err)
	}
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{scratch}.Sanitize()+" RENAME TO "+pgx.Identifier{template}.Sanitize()); err != nil {
		return fmt.Errorf("rename template: %w", err)
	}
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{template}.Sanitize()+" IS_TEMPLATE true"); err != nil {
		return fmt.Errorf("mark template: %w", err)
	}
	return nil
}

// migrationsHash identifies the schema a template holds: the migration
// files of sluice and of every built-in module, and River's migrations.
func migrationsHash() (string, error) {
	h := sha256.New()
	if err := hashDir(h, "sluice", migrations.FS); err != nil {
		return "", err
	}
	if err := hashDir(h, "bootstrap", migrations.BootstrapFS); err != nil {
		return "", err
	}
	for _, m := range modules.All() {
		if m.Migrations != nil {
			if err := hashDir(h, m.Name, m.Migrations); err != nil {
				return "", err
			}
		}
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(nil), nil)
	if err != nil {
		return "", fmt.Errorf("river migrator: %w", err)
	}
	for _, m := range migrator.AllVersions() {
		fmt.Fprintf(h, "river%d\x00%s\x00", m.Version, m.SQLUp)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// hashDir adds every file of fsys (walked in order) to h, under set.
func hashDir(h io.Writer, set string, fsys fs.FS) error {
	return fs.WalkDir(fsys, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(fsys, path)
		if err != nil {
			return fmt.Errorf("read migration %s/%s: %w", set, path, err)
		}
		fmt.Fprintf(h, "%s/%s\x00%s\x00", set, path, data)
		return nil
	})
}

// urlFor returns the server URL pointed at database name.
func urlFor(name string) string {
	return WithDatabase(adminURL, name)
}

// WithDatabase returns connString with its database replaced by name. It
// handles both URL and key=value connection strings.
func WithDatabase(connString, name string) string {
	if u, err := url.Parse(connString); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + name
		q := u.Query()
		q.Del("dbname")
		u.RawQuery = q.Encode()
		return u.String()
	}
	// key=value: a later key wins.
	return connString + " dbname=" + name
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Checksum fingerprints the rows of tables (schema.table or a name the
// search_path finds), so a test can assert that a
// failed command changed nothing.
func Checksum(tb testing.TB, pool *pgxpool.Pool, tables ...string) string {
	tb.Helper()
	h := sha256.New()
	for _, table := range tables {
		var sum string
		err := pool.QueryRow(context.Background(),
			"SELECT COALESCE(md5(string_agg(t::text, '|' ORDER BY t::text)), '') FROM "+pgx.Identifier(strings.Split(table, ".")).Sanitize()+" t").Scan(&sum)
		if err != nil {
			tb.Fatalf("checksum %s: %v", table, err)
		}
		fmt.Fprintf(h, "%s=%s\n", table, sum)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// PoolConfig parses url as sluice's processes do: a pool configuration with
// sluice's schema and River's on its search_path (pgkit.UseSchemas), for tests
// that tune the configuration before they open the pool.
func PoolConfig(url string) (*pgxpool.Config, error) {
	config, err := pgkit.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := pgkit.UseSchemas(ctx, config, url, pgkit.Schemas{}); err != nil {
		return nil, err
	}
	return config, nil
}

// WithParam returns connString with the parameter key set to value, in
// either form of connection string.
func WithParam(connString, key, value string) string {
	if u, err := url.Parse(connString); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		q.Set(key, value)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return connString + " " + key + "=" + value
}
