package e2e_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/proc"
)

// workerConns is the pool size of every worker process a test starts: the
// tests share one server (max_connections is 100 on a stock install) with
// the rest of the suite, and a worker's default pool is 20.
const workerConns = 8

// harness is one test's database and the sluice processes working on it.
type harness struct {
	t    *testing.T
	url  string
	pool *pgxpool.Pool
}

// newHarness opens a pool on the test's database url.
func newHarness(t *testing.T, url string) *harness {
	t.Helper()
	pool, err := pgkit.Open(context.Background(), withParam(url, "pool_max_conns", "4"), 30*time.Second)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &harness{t: t, url: url, pool: pool}
}

// withParam returns the connection string conn with key set to value; it
// handles URL and key=value strings.
func withParam(conn, key, value string) string {
	if u, err := url.Parse(conn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		q.Set(key, value)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return conn + " " + key + "=" + value
}

// sluice runs the CLI against the test's database.
func (h *harness) sluice(args ...string) proc.Result {
	h.t.Helper()
	return proc.Run(h.t, h.url, nil, args...)
}

// ok runs the CLI and requires exit 0; it returns stdout.
func (h *harness) ok(args ...string) string {
	h.t.Helper()
	res := h.sluice(args...)
	require.Equal(h.t, 0, res.Code, "sluice %v: stdout=%q stderr=%q", args, res.Stdout, res.Stderr)
	return res.Stdout
}

// worker starts `sluice worker` with id and extra args, its pool limited to
// workerConns connections.
func (h *harness) worker(id string, args ...string) *proc.Worker {
	h.t.Helper()
	return proc.StartWorker(h.t, withParam(h.url, "pool_max_conns", fmt.Sprint(workerConns)), id, args...)
}

// count runs a query returning one integer.
func (h *harness) count(sql string, args ...any) int64 {
	h.t.Helper()
	var n int64
	require.NoError(h.t, h.pool.QueryRow(context.Background(), sql, args...).Scan(&n), sql)
	return n
}

// exec runs a statement.
func (h *harness) exec(sql string, args ...any) {
	h.t.Helper()
	_, err := h.pool.Exec(context.Background(), sql, args...)
	require.NoError(h.t, err, sql)
}

// eventually waits up to timeout for cond, polling every 100ms. The
// timeouts are generous: these machines are slow and shared.
func (h *harness) eventually(timeout time.Duration, cond func() bool, msg string, args ...any) {
	h.t.Helper()
	require.Eventually(h.t, cond, timeout, 100*time.Millisecond, fmt.Sprintf(msg, args...))
}

// sampler runs a query returning one integer over and over in the
// background and keeps the largest value seen.
type sampler struct {
	max     atomic.Int64
	samples atomic.Int64
	errs    atomic.Int64
	stop    chan struct{}
	done    sync.WaitGroup
}

// sampleMax starts sampling sql every interval until Stop (or the end of
// the test).
func (h *harness) sampleMax(sql string, interval time.Duration) *sampler {
	s := &sampler{stop: make(chan struct{})}
	s.done.Add(1)
	go func() {
		defer s.done.Done()
		for {
			select {
			case <-s.stop:
				return
			case <-time.After(interval):
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			var n int64
			err := h.pool.QueryRow(ctx, sql).Scan(&n)
			cancel()
			if err != nil {
				s.errs.Add(1)
				continue
			}
			s.samples.Add(1)
			for {
				cur := s.max.Load()
				if n <= cur || s.max.CompareAndSwap(cur, n) {
					break
				}
			}
		}
	}()
	h.t.Cleanup(func() { s.Stop() })
	return s
}

// Stop ends the sampling (idempotent) and returns the largest value seen.
func (s *sampler) Stop() int64 {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	s.done.Wait()
	return s.max.Load()
}

// scheduledRun is one River job a schedule's dispatcher inserted: the due
// time it stands for and the earlier due times its misfire policy did not
// run.
type scheduledRun struct {
	dueAt  time.Time
	missed int
}

// scheduledRuns returns the runs of schedule name, oldest due time first
// (triggers excluded).
func (h *harness) scheduledRuns(name string) []scheduledRun {
	h.t.Helper()
	rows, err := h.pool.Query(context.Background(), `
		SELECT (metadata->>'due_at')::timestamptz, COALESCE((metadata->>'missed')::int, 0)
		FROM river_job
		WHERE metadata->>'schedule' = $1 AND NOT COALESCE((metadata->>'trigger')::bool, false)
		ORDER BY 1`, name)
	require.NoError(h.t, err)
	defer rows.Close()
	var runs []scheduledRun
	for rows.Next() {
		var r scheduledRun
		require.NoError(h.t, rows.Scan(&r.dueAt, &r.missed))
		runs = append(runs, r)
	}
	require.NoError(h.t, rows.Err())
	return runs
}

// requireEveryDueTimeOnce checks the runs of a schedule due every step:
// each due time between the first and the last is accounted for exactly
// once — by a job of its own, or as one of the `missed` due times a
// run_once job collapsed (a job for due time T with missed N stands for T
// and the N due times before it). With allowMissed false, no due time may be
// missed at all (run_all). It returns the number of due times covered.
func requireEveryDueTimeOnce(t *testing.T, name string, runs []scheduledRun, step time.Duration, allowMissed bool) int {
	t.Helper()
	require.NotEmpty(t, runs, "schedule %s dispatched nothing", name)
	covered := map[time.Time]int{}
	first, last := runs[0].dueAt, runs[len(runs)-1].dueAt
	for _, r := range runs {
		if !allowMissed {
			require.Zero(t, r.missed, "schedule %s: due time %s missed %d earlier ones", name, r.dueAt, r.missed)
		}
		for k := 0; k <= r.missed; k++ {
			due := r.dueAt.Add(-time.Duration(k) * step).UTC()
			covered[due]++
			if due.Before(first) {
				first = due
			}
		}
	}
	var problems []string
	n := 0
	for due := first; !due.After(last); due = due.Add(step) {
		n++
		switch c := covered[due.UTC()]; {
		case c == 0:
			problems = append(problems, "lost "+due.Format(time.RFC3339))
		case c > 1:
			problems = append(problems, fmt.Sprintf("%s dispatched %d times", due.Format(time.RFC3339), c))
		}
		delete(covered, due.UTC())
	}
	for due := range covered {
		problems = append(problems, "off-cadence due time "+due.Format(time.RFC3339Nano))
	}
	require.Empty(t, problems, "schedule %s (%d jobs, due %s .. %s): %s", name, len(runs), first, last, strings.Join(problems, "; "))
	return n
}
