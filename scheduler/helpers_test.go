package scheduler_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/scheduler"
	"github.com/sluice-dev/sluice/settings"
)

// fakeClock is a controllable clock shared by dispatchers.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock(t time.Time) *fakeClock { return &fakeClock{t: t} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

func (c *fakeClock) Add(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	return c.t
}

// newDB is testdb.New without the default schedules other migrations insert
// (the built-in maintenance kinds'), so a test sees only its own rows.
func newDB(t testing.TB) string {
	t.Helper()
	url := testdb.New(t)
	pool := openPool(t, url)
	_, err := pool.Exec(context.Background(), "DELETE FROM schedules")
	require.NoError(t, err)
	_, err = pool.Exec(context.Background(), "VACUUM schedules")
	require.NoError(t, err)
	return url
}

// newPoolDB is newDB, returning a pool on the database.
func newPoolDB(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return openPool(t, newDB(t))
}

func openPool(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgkit.Open(context.Background(), url, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func insertClient(t testing.TB, pool *pgxpool.Pool) *river.Client[pgx.Tx] {
	t.Helper()
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: pgkit.SchemasOf(pool).River})
	require.NoError(t, err)
	return client
}

// newDispatcher builds a dispatcher with its own pool on url.
func newDispatcher(t testing.TB, url string, cfg scheduler.Config) *scheduler.Dispatcher {
	t.Helper()
	if cfg.Pool == nil {
		cfg.Pool = openPool(t, url)
	}
	if cfg.Client == nil {
		cfg.Client = insertClient(t, cfg.Pool)
	}
	if cfg.Logger == nil {
		cfg.Logger = jobtest.Logger(t)
	}
	if cfg.Registry == nil {
		cfg.Registry = jobtest.Registry(t)
	}
	d, err := scheduler.New(cfg)
	require.NoError(t, err)
	return d
}

// row is a schedules row inserted with plain SQL, as an operator or a
// migration would.
type row struct {
	name, cron, tz, kind, args, misfire string
	next                                *time.Time
	maxRetries                          int
}

func insertRow(t testing.TB, pool *pgxpool.Pool, r row) int64 {
	t.Helper()
	if r.tz == "" {
		r.tz = "UTC"
	}
	if r.kind == "" {
		r.kind = "demo.sleep"
	}
	if r.args == "" {
		r.args = "{}"
	}
	if r.misfire == "" {
		r.misfire = "run_once"
	}
	if r.maxRetries == 0 {
		r.maxRetries = 5
	}
	var id int64
	require.NoError(t, pool.QueryRow(context.Background(), `
		INSERT INTO schedules (name, cron, timezone, kind, args, misfire, next_run_at, max_retries)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id`,
		r.name, r.cron, r.tz, r.kind, r.args, r.misfire, r.next, r.maxRetries).Scan(&id))
	return id
}

func getRow(t testing.TB, pool *pgxpool.Pool, name string) *db.Schedule {
	t.Helper()
	s, err := db.New(pool).GetSchedule(context.Background(), name)
	require.NoError(t, err)
	return s
}

// job is a River job a schedule inserted.
type job struct {
	ID    int64
	Kind  string
	Queue string
	Args  json.RawMessage
	Meta  scheduler.JobMetadata
}

// jobsOf lists the jobs of schedule name, by due time then id.
func jobsOf(t testing.TB, pool *pgxpool.Pool, name string) []job {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT id, kind, queue, args, metadata FROM river_job
		WHERE metadata->>'schedule' = $1
		ORDER BY (metadata->>'due_at')::timestamptz, id`, name)
	require.NoError(t, err)
	defer rows.Close()
	var out []job
	for rows.Next() {
		var j job
		var meta []byte
		require.NoError(t, rows.Scan(&j.ID, &j.Kind, &j.Queue, &j.Args, &meta))
		require.NoError(t, json.Unmarshal(meta, &j.Meta))
		out = append(out, j)
	}
	require.NoError(t, rows.Err())
	return out
}

func dueTimes(jobs []job) []time.Time {
	out := make([]time.Time, len(jobs))
	for i, j := range jobs {
		out[i] = j.Meta.DueAt
	}
	return out
}

func setSetting(t testing.TB, pool *pgxpool.Pool, key string, value any) {
	t.Helper()
	require.NoError(t, settings.New(pool).Set(context.Background(), key, value))
}

func tick(t testing.TB, d *scheduler.Dispatcher) scheduler.TickResult {
	t.Helper()
	res, err := d.Tick(context.Background())
	require.NoError(t, err)
	return res
}
