package sluice_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/cli"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/modules/exports"
)

// RiverCfgArgs is a job of TestRiverConfig: it fails its first Fail
// attempts, and takes MS.
type RiverCfgArgs struct {
	Fail int `json:"fail"`
	MS   int `json:"ms"`
}

func (RiverCfgArgs) Kind() string { return "test.river_cfg" }

// countingMiddleware counts the jobs that pass through it, by id.
type countingMiddleware struct {
	river.MiddlewareDefaults
	mu   sync.Mutex
	seen map[int64]int
}

func (m *countingMiddleware) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	m.mu.Lock()
	m.seen[job.ID]++
	m.mu.Unlock()
	return doInner(ctx)
}

// countingErrorHandler counts the errors it is handed, by job id.
type countingErrorHandler struct {
	mu     sync.Mutex
	errors map[int64]int
}

func (h *countingErrorHandler) HandleError(_ context.Context, job *rivertype.JobRow, _ error) *river.ErrorHandlerResult {
	h.mu.Lock()
	h.errors[job.ID]++
	h.mu.Unlock()
	return nil
}

func (h *countingErrorHandler) HandlePanic(context.Context, *rivertype.JobRow, any, string) *river.ErrorHandlerResult {
	return nil
}

// immediately retries a failed job at once.
type immediately struct{}

func (immediately) NextRetry(*rivertype.JobRow) time.Time { return time.Now() }

// TestRiverConfigOwnedFields: a Config.River that changes a field sluice
// owns is refused by New, naming the field and what to use instead.
func TestRiverConfigOwnedFields(t *testing.T) {
	t.Parallel()
	for field, change := range map[string]func(*river.Config){
		"Queues":  func(c *river.Config) { c.Queues["extra"] = river.QueueConfig{MaxWorkers: 1} },
		"Workers": func(c *river.Config) { c.Workers = river.NewWorkers() },
		"Schema":  func(c *river.Config) { c.Schema = "elsewhere" },
		"ID":      func(c *river.Config) { c.ID = "mine" },
	} {
		t.Run(field, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig(t, greetWorkers())
			cfg.River = change
			w, err := sluice.New(context.Background(), cfg)
			require.Nil(t, w)
			require.ErrorContains(t, err, "Config.River changed River's "+field+", which sluice sets")
		})
	}
}

// TestRiverConfig: what a program's Config.River sets is used. Its
// ErrorHandler gets each failed attempt once, its RetryPolicy retries, and
// its middleware (River's Middleware field) runs inside sluice's limiter:
// under a limit of 1 with jobs parking, each job passes through it exactly
// once, when it runs.
func TestRiverConfig(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	workers := river.NewWorkers()
	var mu sync.Mutex
	running, mostRunning := 0, 0
	river.AddWorker(workers, river.WorkFunc(func(ctx context.Context, job *river.Job[RiverCfgArgs]) error {
		mu.Lock()
		running++
		mostRunning = max(mostRunning, running)
		mu.Unlock()
		defer func() { mu.Lock(); running--; mu.Unlock() }()
		time.Sleep(time.Duration(job.Args.MS) * time.Millisecond)
		if job.Attempt <= job.Args.Fail {
			return errors.New("failing on purpose")
		}
		return nil
	}))
	mw := &countingMiddleware{seen: map[int64]int{}}
	eh := &countingErrorHandler{errors: map[int64]int{}}
	cfg := testConfig(t, workers)
	cfg.ParkAfter = 20 * time.Millisecond
	cfg.Limits = []sluice.Limit{{Kind: "test.river_cfg", Max: 1}}
	cfg.River = func(c *river.Config) {
		c.Middleware = []rivertype.Middleware{mw}
		c.ErrorHandler = eh
		c.RetryPolicy = immediately{}
	}
	w, err := sluice.New(ctx, cfg)
	require.NoError(t, err)
	require.NoError(t, w.Start(ctx))
	t.Cleanup(func() { _ = stop(t, w) })

	failing, err := w.Client().Insert(ctx, RiverCfgArgs{Fail: 2}, nil)
	require.NoError(t, err)
	var slow []int64
	for range 3 {
		res, err := w.Client().Insert(ctx, RiverCfgArgs{MS: 300}, nil)
		require.NoError(t, err)
		slow = append(slow, res.Job.ID)
	}
	require.Eventually(t, func() bool {
		var done int
		require.NoError(t, w.Pool().QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = 'test.river_cfg' AND state = 'completed'`).Scan(&done))
		return done == 4
	}, 30*time.Second, 20*time.Millisecond)

	// The two slow jobs behind the first waited 300 ms for a slot: they
	// parked (park-after 20 ms).
	srv := httptest.NewServer(w.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	m := regexp.MustCompile(`sluice_concurrency_parked_total\{kind="test.river_cfg"\} (\d+)`).FindSubmatch(body)
	require.NotNil(t, m, "no parkings counted")
	require.NotEqual(t, "0", string(m[1]), "no job parked")
	mw.mu.Lock()
	defer mw.mu.Unlock()
	eh.mu.Lock()
	defer eh.mu.Unlock()
	require.Equal(t, 2, eh.errors[failing.Job.ID], "the ErrorHandler gets each failed attempt once")
	require.Equal(t, 3, mw.seen[failing.Job.ID], "the middleware sees each attempt once")
	for _, id := range slow {
		require.Equal(t, 1, mw.seen[id], "job %d passed the middleware %d times", id, mw.seen[id])
	}
	require.Equal(t, 1, mostRunning, "the limit of 1 held")
}

// TeamArgs is a job of TestRiverConfigInMainsCommands.
type TeamArgs struct {
	N int `json:"n"`
}

func (TeamArgs) Kind() string { return "test.team" }

// tagInserts is a team's insert middleware: it tags every job it inserts.
type tagInserts struct{ river.MiddlewareDefaults }

func (*tagInserts) InsertMany(ctx context.Context, manyParams []*rivertype.JobInsertParams,
	doInner func(context.Context) ([]*rivertype.JobInsertResult, error),
) ([]*rivertype.JobInsertResult, error) {
	for _, p := range manyParams {
		p.Tags = append(p.Tags, "team-mw")
	}
	return doInner(ctx)
}

// TestRiverConfigInMainsCommands: every command of a team's binary that
// inserts jobs (enqueue, schedule trigger, a module's command, run) and the
// worker's dispatcher build their River client with the team's
// Config.River: its MaxAttempts is the default of their inserts (an
// option given, or the kind's own, wins, as River documents), its insert
// middleware and its hooks see each insert, and its PeriodicJobs (which
// River runs on the leader only) do not stop run's client, which never
// leads. A Config.River that changes a field sluice owns is refused there
// too (exit 1), and nothing is inserted.
func TestRiverConfigInMainsCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(func(context.Context, *river.Job[TeamArgs]) error { return nil }))
	var mu sync.Mutex
	hooked := map[string]int{}
	cfg := testConfig(t, workers, exports.Module(exports.Config{Dir: t.TempDir()}))
	cfg.HTTPAddr = ""
	cfg.SchedulePollInterval = 100 * time.Millisecond
	cfg.River = func(c *river.Config) {
		c.MaxAttempts = 4
		c.Middleware = append(c.Middleware, &tagInserts{})
		c.Hooks = append(c.Hooks, river.HookInsertBeginFunc(func(_ context.Context, p *rivertype.JobInsertParams) error {
			mu.Lock()
			hooked[p.Kind]++
			mu.Unlock()
			return nil
		}))
		c.PeriodicJobs = append(c.PeriodicJobs, river.NewPeriodicJob(river.PeriodicInterval(24*time.Hour),
			func() (river.JobArgs, *river.InsertOpts) { return TeamArgs{N: 99}, nil }, nil))
	}
	pool, err := pgkit.Open(ctx, cfg.DatabaseURL, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	run := func(cfg sluice.Config, args ...string) (int, string, string) {
		t.Helper()
		var out, errOut strings.Builder
		code := cli.Run(ctx, cfg, append([]string{"--database-url", cfg.DatabaseURL}, args...), &out, &errOut)
		return code, out.String(), errOut.String()
	}
	type row struct {
		Kind        string
		MaxAttempts int
		Tags        []string
	}
	jobRow := func(id int64) row {
		t.Helper()
		var r row
		require.NoError(t, pool.QueryRow(ctx, `SELECT kind, max_attempts, tags FROM river_job WHERE id = $1`, id).
			Scan(&r.Kind, &r.MaxAttempts, &r.Tags))
		return r
	}
	jobID := func(s string) int64 {
		t.Helper()
		m := regexp.MustCompile(`(?:^|job )(\d+)\b`).FindStringSubmatch(s)
		require.NotNil(t, m, s)
		id, err := strconv.ParseInt(m[1], 10, 64)
		require.NoError(t, err)
		return id
	}

	t.Run("enqueue", func(t *testing.T) {
		code, out, errOut := run(cfg, "enqueue", "test.team", "--args", `{"n": 1}`)
		require.Equal(t, 0, code, errOut)
		require.Equal(t, row{"test.team", 4, []string{"team-mw"}}, jobRow(jobID(out)))
		code, out, errOut = run(cfg, "enqueue", "test.team", "--args", `{"n": 2}`, "--max-attempts", "7")
		require.Equal(t, 0, code, errOut)
		require.Equal(t, row{"test.team", 7, []string{"team-mw"}}, jobRow(jobID(out)), "an option given wins")
	})
	t.Run("schedule trigger", func(t *testing.T) {
		code, _, errOut := run(cfg, "schedule", "add", "--name", "team", "--cron", "@yearly", "--kind", "test.team", "--args", `{"n": 3}`)
		require.Equal(t, 0, code, errOut)
		code, out, errOut := run(cfg, "schedule", "trigger", "team")
		require.Equal(t, 0, code, errOut)
		require.Equal(t, row{"test.team", 4, []string{"team-mw"}}, jobRow(jobID(out)))
	})
	t.Run("a module's command", func(t *testing.T) {
		code, out, errOut := run(cfg, "export", "1")
		require.Equal(t, 0, code, errOut)
		m := regexp.MustCompile(`River job (\d+)`).FindStringSubmatch(out)
		require.NotNil(t, m, out)
		require.Equal(t, row{"export.project", exports.ExportProjectMaxAttempts, []string{"team-mw"}}, jobRow(jobID("job "+m[1])),
			"the kind's own MaxAttempts wins")
	})
	t.Run("run", func(t *testing.T) {
		code, out, errOut := run(cfg, "run", "test.team", "--args", `{"n": 4}`)
		require.Equal(t, 0, code, errOut)
		require.Equal(t, row{"test.team", 1, []string{"team-mw"}}, jobRow(jobID(out)), "one attempt, as run says")
	})
	t.Run("the worker's dispatcher", func(t *testing.T) {
		declared := cfg
		declared.Schedules = []sluice.Schedule{{Name: "team-declared", Cron: "@every 1s", Args: TeamArgs{N: 5}}}
		var dispatched int64
		runWorkers(t, declared, []string{"team-worker"}, func() bool {
			return pool.QueryRow(ctx, `SELECT id FROM river_job WHERE kind = 'test.team' AND args->>'n' = '5' ORDER BY id LIMIT 1`).
				Scan(&dispatched) == nil
		})
		require.Equal(t, row{"test.team", 4, []string{"team-mw"}}, jobRow(dispatched))
	})
	t.Run("the hook saw each insert", func(t *testing.T) {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = 'test.team'`).Scan(&n))
		mu.Lock()
		defer mu.Unlock()
		require.Equal(t, n, hooked["test.team"])
		require.Equal(t, 1, hooked["export.project"])
	})

	// A Config.River that changes a field sluice owns: refused, nothing
	// inserted.
	owned := cfg
	owned.River = func(c *river.Config) { c.Schema = "elsewhere" }
	before := testdb.Checksum(t, pool, "river_job")
	code, out, errOut := run(owned, "enqueue", "test.team", "--args", `{"n": 6}`)
	require.Equal(t, 1, code, out)
	require.Contains(t, errOut, "Config.River changed River's Schema, which sluice sets: use sluice's Config.RiverSchema (--river-schema)")
	require.Equal(t, before, testdb.Checksum(t, pool, "river_job"))
}
