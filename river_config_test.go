package sluice_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
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
