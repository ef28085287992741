package limiter_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/limiter"
	"github.com/sluice-dev/sluice/maintenance"
	"github.com/sluice-dev/sluice/modules/demo"
)

// probeArgs is a test kind whose worker measures its own concurrency.
type probeArgs struct {
	Seq int    `json:"seq"`
	MS  int    `json:"ms"`
	K   string `json:"k"`
}

func (a probeArgs) Kind() string { return "test.probe." + a.K }

// probeTracker records how many probe jobs run at once and in which order.
type probeTracker struct {
	running atomic.Int32
	max     atomic.Int32
	done    atomic.Int32
	mu      sync.Mutex
	order   []int
	worked  map[int]int
	events  []probeEvent
}

// probeEvent is a probe job's start or end in a worker.
type probeEvent struct {
	at     time.Time
	worker string
	start  bool
}

func (p *probeTracker) event(worker string, start bool) {
	p.mu.Lock()
	p.events = append(p.events, probeEvent{time.Now(), worker, start})
	p.mu.Unlock()
}

// turnovers describes how long after a job's end the next job began (each
// start since paired with the earliest end not paired yet), split by
// whether they ran in the same worker (a slot handed over in memory) or in
// different ones (through the ledger): count, mean, p50, p90, p99, max and
// sum in ms.
func (p *probeTracker) turnovers(since time.Time) string {
	p.mu.Lock()
	ev := slices.Clone(p.events)
	p.mu.Unlock()
	slices.SortFunc(ev, func(a, b probeEvent) int { return a.at.Compare(b.at) })
	var ends []probeEvent
	var same, cross []float64
	for _, e := range ev {
		switch {
		case e.at.Before(since):
		case !e.start:
			ends = append(ends, e)
		case len(ends) > 0:
			g := float64(e.at.Sub(ends[0].at).Microseconds()) / 1000
			if ends[0].worker == e.worker {
				same = append(same, g)
			} else {
				cross = append(cross, g)
			}
			ends = ends[1:]
		}
	}
	describe := func(v []float64) string {
		if len(v) == 0 {
			return "none"
		}
		slices.Sort(v)
		sum := 0.0
		for _, x := range v {
			sum += x
		}
		return fmt.Sprintf("%d, mean %.2f, p50 %.2f, p90 %.2f, p99 %.2f, max %.1f, sum %.0f ms", len(v), sum/float64(len(v)),
			v[len(v)/2], v[len(v)*9/10], v[len(v)*99/100], v[len(v)-1], sum)
	}
	return "same worker " + describe(same) + "; across workers " + describe(cross)
}

func newProbeTracker() *probeTracker { return &probeTracker{worked: map[int]int{}} }

func (p *probeTracker) enter(seq int) {
	n := p.running.Add(1)
	for {
		m := p.max.Load()
		if n <= m || p.max.CompareAndSwap(m, n) {
			break
		}
	}
	p.mu.Lock()
	p.order = append(p.order, seq)
	p.worked[seq]++
	p.mu.Unlock()
}

func (p *probeTracker) leave() {
	p.running.Add(-1)
	p.done.Add(1)
}

// doneCount is how many executions ended.
func (p *probeTracker) doneCount() int { return int(p.done.Load()) }

// workedOf is how many times seq was worked.
func (p *probeTracker) workedOf(seq int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.worked[seq]
}

func (p *probeTracker) snapshot() ([]int, map[int]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	worked := map[int]int{}
	for k, v := range p.worked {
		worked[k] = v
	}
	return append([]int(nil), p.order...), worked
}

type probeWorker struct {
	river.WorkerDefaults[probeArgs]
	kind    string
	tracker *probeTracker
}

func (w *probeWorker) Work(ctx context.Context, job *river.Job[probeArgs]) error {
	w.tracker.enter(job.Args.Seq)
	defer w.tracker.leave()
	by := job.AttemptedBy[len(job.AttemptedBy)-1]
	w.tracker.event(by, true)
	defer w.tracker.event(by, false)
	select {
	case <-time.After(time.Duration(job.Args.MS) * time.Millisecond):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// startProbeWorker starts a River client ("a worker process": its own pool,
// deps and limiter, named id) that works the probe kind and every sluice
// kind; a job waits parkAfter for a slot before it parks (0: the default).
func startProbeWorker(t testing.TB, url, id, kind string, tracker *probeTracker, parkAfter time.Duration, configure func(*river.Config)) *jobtest.Client {
	t.Helper()
	client, _ := startProbeWorkerWith(t, url, id, kind, tracker, parkAfter, configure, false)
	return client
}

// startProbeWorkerSignals is startProbeWorker that also returns the
// worker's Limiter, its test signals initialized (for short tests only:
// signals nobody waits for fill their channel).
func startProbeWorkerSignals(t testing.TB, url, id, kind string, tracker *probeTracker, parkAfter time.Duration, configure func(*river.Config)) (*jobtest.Client, *limiter.Limiter) {
	t.Helper()
	return startProbeWorkerWith(t, url, id, kind, tracker, parkAfter, configure, true)
}

func startProbeWorkerWith(t testing.TB, url, id, kind string, tracker *probeTracker, parkAfter time.Duration, configure func(*river.Config), signals bool) (*jobtest.Client, *limiter.Limiter) {
	t.Helper()
	return startProbeWorkerJobs(t, url, kind, tracker, app.JobsConfig{WorkerID: id, ParkAfter: parkAfter}, configure, signals)
}

// startProbeWorkerJobs is startProbeWorkerWith with the worker's jobs
// configured by jc (its WorkerID the worker's id).
func startProbeWorkerJobs(t testing.TB, url, kind string, tracker *probeTracker, jc app.JobsConfig, configure func(*river.Config), signals bool) (*jobtest.Client, *limiter.Limiter) {
	t.Helper()
	id := jc.WorkerID
	pool, err := pgkit.Open(context.Background(), url, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	deps, _ := jobtest.NewJobsConfig(t, pool, jc)
	if signals {
		deps.Limiter.TestSignals.Init(t)
	}
	return jobtest.Start(t, pool, deps, jobtest.Config{
		ID: id,
		Configure: func(c *river.Config) {
			river.AddWorkerArgs(c.Workers, probeArgs{K: kind}, &probeWorker{kind: kind, tracker: tracker})
			c.Queues = map[string]river.QueueConfig{
				river.QueueDefault: {MaxWorkers: 20},
				maintenance.Queue:  {MaxWorkers: 5},
			}
			if configure != nil {
				configure(c)
			}
		},
	}), deps.Limiter
}

func insertProbes(t testing.TB, client *jobtest.Client, kind string, from, n, ms int) []int64 {
	t.Helper()
	params := make([]river.InsertManyParams, n)
	for i := range n {
		params[i] = river.InsertManyParams{Args: probeArgs{Seq: from + i, MS: ms, K: kind}}
	}
	res, err := client.InsertMany(context.Background(), params)
	require.NoError(t, err)
	ids := make([]int64, n)
	for i, r := range res {
		ids[i] = r.Job.ID
	}
	return ids
}

// limitedProbes sets up a probe kind ("test.probe." + kind) limited to
// limit, with its parkings logged, worked by two probe workers (a and b,
// prefixed with kind) that park a job after parkAfter; it returns the pool,
// the tracker and the first worker's client.
func limitedProbes(t *testing.T, kind string, limit int32, parkAfter time.Duration) (*pgxpool.Pool, *probeTracker, *jobtest.Client) {
	t.Helper()
	url, pool, tracker := probeKind(t, kind, limit)
	logParkings(t, pool)
	a := startProbeWorker(t, url, kind+"-a", kind, tracker, parkAfter, nil)
	startProbeWorker(t, url, kind+"-b", kind, tracker, parkAfter, nil)
	return pool, tracker, a
}

// probeKind makes a test database whose probe kind ("test.probe." + kind)
// is limited to limit, and returns its URL, a pool and a tracker for the
// probe workers to start.
func probeKind(t testing.TB, kind string, limit int32) (string, *pgxpool.Pool, *probeTracker) {
	t.Helper()
	url := testdb.New(t)
	pool := openPool(t, url)
	jobtest.SetLimit(t, pool, "test.probe."+kind, limit)
	return url, pool, newProbeTracker()
}

func count(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// waitAllDone waits until every probe seq in [0, n) was worked and nothing of
// kind is left in River or parked.
func waitAllDone(t *testing.T, pool *pgxpool.Pool, tracker *probeTracker, kind string, n int, timeout time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, worked := tracker.snapshot()
		if len(worked) < n {
			return false
		}
		return count(t, pool, "SELECT count(*) FROM concurrency_parked_jobs WHERE kind = $1", kind) == 0 &&
			count(t, pool, "SELECT count(*) FROM river_job WHERE kind = $1 AND finalized_at IS NULL", kind) == 0
	}, timeout, 20*time.Millisecond)
}

func TestConcurrencyLimitHoldsAcrossWorkers(t *testing.T) {
	t.Parallel()

	kind := "holds"
	fullKind := "test.probe." + kind
	pool, tracker, a := limitedProbes(t, kind, 3, time.Millisecond)

	const n = 60
	insertProbes(t, a, kind, 0, n, 30)

	// Sample the slot table while the jobs run: the invariant holds in the
	// database too.
	stop := make(chan struct{})
	var maxRows atomic.Int32
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
				var c int32
				if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM concurrency_executions WHERE kind = $1", fullKind).Scan(&c); err == nil && c > maxRows.Load() {
					maxRows.Store(c)
				}
			}
		}
	}()
	waitAllDone(t, pool, tracker, fullKind, n, 2*time.Minute)
	close(stop)

	require.LessOrEqual(t, tracker.max.Load(), int32(3), "more jobs ran at once than the limit")
	require.Equal(t, int32(3), tracker.max.Load(), "the limit is used fully")
	require.LessOrEqual(t, maxRows.Load(), int32(3))
	_, worked := tracker.snapshot()
	for seq := range n {
		require.Equal(t, 1, worked[seq], "job %d worked %d times", seq, worked[seq])
	}
	require.Eventually(t, func() bool { return count(t, pool, "SELECT count(*) FROM concurrency_executions") == 0 },
		10*time.Second, 10*time.Millisecond, "every slot released")
	require.Positive(t, parkings(t, pool, fullKind), "with 60 jobs through 3 slots some were parked")
	// Parked in place: every job completed on its own row, in one attempt.
	require.Equal(t, n, count(t, pool, "SELECT count(*) FROM river_job WHERE kind = $1 AND state = 'completed' AND attempt = 1 AND cardinality(attempted_by) = 1", fullKind))
}

func TestConcurrencyLimitUnlimited(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name  string
		limit *int32
	}{
		{"no row", nil},
		{"zero", new(int32)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			url := testdb.New(t)
			pool := openPool(t, url)
			kind := "unlimited"
			if tc.limit != nil {
				jobtest.SetLimit(t, pool, "test.probe."+kind, *tc.limit)
			}
			logParkings(t, pool)
			tracker := newProbeTracker()
			client := startProbeWorker(t, url, "w", kind, tracker, 0, nil)
			insertProbes(t, client, kind, 0, 10, 300)
			waitAllDone(t, pool, tracker, "test.probe."+kind, 10, time.Minute)
			require.Greater(t, tracker.max.Load(), int32(3), "unlimited jobs run side by side")
			require.Zero(t, count(t, pool, "SELECT count(*) FROM concurrency_executions"), "no slots taken")
			require.Zero(t, parkings(t, pool, "test.probe."+kind), "nothing parked")
		})
	}
}

func TestConcurrencyLimitChangeAtRunTime(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	pool := openPool(t, url)
	kind := "change"
	fullKind := "test.probe." + kind
	jobtest.SetLimit(t, pool, fullKind, 1)
	tracker := newProbeTracker()
	client := startProbeWorker(t, url, "w", kind, tracker, 0, nil)

	insertProbes(t, client, kind, 0, 6, 100)
	waitAllDone(t, pool, tracker, fullKind, 6, time.Minute)
	require.Equal(t, int32(1), tracker.max.Load())

	jobtest.SetLimit(t, pool, fullKind, 4)
	time.Sleep(limiter.LimitCacheTTL + 100*time.Millisecond) // workers re-read limits within the TTL
	tracker.max.Store(0)
	insertProbes(t, client, kind, 100, 12, 150)
	if !assert.Eventually(t, func() bool { _, w := tracker.snapshot(); return len(w) == 18 }, 20*time.Second, 20*time.Millisecond) {
		dumpState(t, pool, fullKind)
		_, w := tracker.snapshot()
		t.Fatalf("worked: %v", w)
	}
	require.Equal(t, int32(4), tracker.max.Load(), "the raised limit takes effect")
}

func TestConcurrencyLimitCircuitBreaker(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	pool := openPool(t, url)
	jobtest.SetLimit(t, pool, "demo.sleep", -1)
	deps, _ := jobtest.NewJobs(t, pool)
	client := jobtest.Start(t, pool, deps, jobtest.Config{})

	var ids []int64
	for range 5 {
		res, err := client.Insert(ctx, demo.SleepArgs{MS: 1}, nil)
		require.NoError(t, err)
		ids = append(ids, res.Job.ID)
	}
	waitParked(t, pool, ids...)
	for _, id := range ids {
		// The same row, pending, its attempt undone, no mark left.
		job, err := client.JobGet(ctx, id)
		require.NoError(t, err)
		require.Equal(t, rivertype.JobStatePending, job.State)
		require.Zero(t, job.Attempt)
		require.Empty(t, job.AttemptedBy)
		require.Nil(t, job.FinalizedAt)
		require.NotContains(t, string(job.Metadata), `"sluice_park"`, "the parking marker is gone")
		require.Equal(t, "breaker", parkingRecord(t, job.Metadata)["reason"])
	}
	require.Equal(t, 5, count(t, pool, "SELECT count(*) FROM concurrency_parked_jobs WHERE kind = 'demo.sleep' AND reason = 'breaker'"))

	// The resume worker, with and without a kind, resumes nothing.
	client.InsertAndWait(t, limiter.ResumeArgs{JobKind: "demo.sleep"}, nil)
	client.InsertAndWait(t, limiter.ResumeArgs{}, nil)
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, 5, count(t, pool, "SELECT count(*) FROM concurrency_parked_jobs WHERE kind = 'demo.sleep'"))
	require.Zero(t, count(t, pool, "SELECT count(*) FROM river_job WHERE kind = 'concurrency_limit.resume' AND args->>'kind' = 'demo.sleep' AND finalized_at IS NULL"),
		"no resume scheduled for a broken circuit")

	// Lifting the breaker: the resume worker brings them all back.
	jobtest.SetLimit(t, pool, "demo.sleep", 0)
	client.InsertAndWait(t, limiter.ResumeArgs{JobKind: "demo.sleep"}, nil)
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT count(*) FROM river_job WHERE id = ANY($1) AND state = 'completed' AND attempt = 1", ids) == 5
	}, 30*time.Second, 20*time.Millisecond)
	require.Zero(t, count(t, pool, "SELECT count(*) FROM concurrency_parked_jobs"))
	require.Equal(t, 5, count(t, pool, "SELECT count(*) FROM river_job WHERE kind = 'demo.sleep'"), "no copies")
}

func TestConcurrencyLimitFIFO(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	pool := openPool(t, url)
	jobtest.SetLimit(t, pool, "demo.sleep", -1) // park everything, in insertion order
	deps, _ := jobtest.NewJobs(t, pool)
	client := jobtest.Start(t, pool, deps, jobtest.Config{})

	const n = 8
	var originals []int64
	for i := range n {
		res, err := client.Insert(ctx, demo.SleepArgs{MS: 20}, nil)
		require.NoError(t, err)
		originals = append(originals, res.Job.ID)
		require.Eventually(t, func() bool {
			return count(t, pool, "SELECT count(*) FROM concurrency_parked_jobs") == i+1
		}, 30*time.Second, 10*time.Millisecond)
	}
	jobtest.SetLimit(t, pool, "demo.sleep", 1)
	client.InsertAndWait(t, limiter.ResumeArgs{JobKind: "demo.sleep"}, nil)
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND state = 'completed'") == n
	}, time.Minute, 20*time.Millisecond)

	// With one slot the resumed jobs ran one after the other (each ended
	// before the next started), in job-id order. (Fetch times say less:
	// jobs resumed ahead of the slot are fetched together, and wait.)
	rows, err := pool.Query(ctx, `SELECT id FROM river_job WHERE kind = 'demo.sleep' ORDER BY finalized_at`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Equal(t, originals, got)
	require.Eventually(t, func() bool { return count(t, pool, "SELECT count(*) FROM concurrency_executions") == 0 },
		10*time.Second, 10*time.Millisecond, "every slot released")
}

func openPool(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgkit.Open(context.Background(), url, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func dumpState(t *testing.T, pool *pgxpool.Pool, kind string) {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT id, state, attempt, metadata::text, coalesce(errors::text,'') FROM river_job WHERE kind=$1 ORDER BY id", kind)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var id int64
		var st, md, er string
		var at int
		require.NoError(t, rows.Scan(&id, &st, &at, &md, &er))
		t.Logf("job %d %s attempt=%d meta=%s errors=%s", id, st, at, md, er)
	}
	var p, e int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT (SELECT count(*) FROM concurrency_parked_jobs), (SELECT count(*) FROM concurrency_executions)").Scan(&p, &e))
	t.Logf("parked=%d executions=%d", p, e)
}

// TestConcurrencyLimitParkingIsAtomic makes the parking transaction fail at
// its last step: nothing of it survives (no parking record, no parking mark,
// the job fails that attempt and is retried), and the retry parks the job
// exactly once, in place.
func TestConcurrencyLimitParkingIsAtomic(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	pool := openPool(t, url)
	// Fail the first two inserts of a parking record, after the River job
	// was marked for parking in the same transaction: the decision made at
	// the fetch, and the middleware's own when it finds none.
	_, err := pool.Exec(ctx, `
		CREATE SEQUENCE test_fail_once; -- not transactional: survives the rollback
		CREATE FUNCTION test_fail_park() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF nextval('test_fail_once') <= 2 THEN
				RAISE EXCEPTION 'injected crash while parking';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER test_fail_park BEFORE INSERT ON concurrency_parked_jobs
			FOR EACH ROW EXECUTE FUNCTION test_fail_park();`)
	require.NoError(t, err)
	jobtest.SetLimit(t, pool, "demo.sleep", -1)
	deps, _ := jobtest.NewJobs(t, pool)
	client := jobtest.Start(t, pool, deps, jobtest.Config{Configure: func(c *river.Config) {
		c.RetryPolicy = &immediateRetry{}
	}})

	res, err := client.Insert(ctx, demo.SleepArgs{MS: 1}, nil)
	require.NoError(t, err)
	id := res.Job.ID
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT count(*) FROM river_job WHERE id = $1 AND state = 'pending'", id) == 1
	}, 30*time.Second, 10*time.Millisecond)

	// The failed attempt's transaction left nothing behind (its mark on the
	// River job was rolled back with the record), so that attempt failed
	// with the error; the second attempt parked the job, which undid that
	// attempt only: one real attempt, its error kept.
	job, err := client.JobGet(ctx, id)
	require.NoError(t, err)
	require.Equal(t, 1, job.Attempt, "the parking attempt is undone, the failed one counts")
	require.Len(t, job.Errors, 1)
	require.Contains(t, job.Errors[0].Error, "injected crash while parking")
	require.NotContains(t, string(job.Metadata), `"sluice_park"`, "the parking marker is gone")
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM concurrency_parked_jobs WHERE job_id = $1", id))
	require.Equal(t, 1, count(t, pool, "SELECT has_parked::int FROM concurrency_limits WHERE kind = 'demo.sleep'"))
}

// immediateRetry retries a failed job at once.
type immediateRetry struct{}

func (*immediateRetry) NextRetry(*rivertype.JobRow) time.Time { return time.Now() }

// TestConcurrencyLimitResumeDoesNotPileUp parks many jobs and runs the resume
// worker over and over: never more than one pending resume per kind.
func TestConcurrencyLimitResumeDoesNotPileUp(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	pool := openPool(t, url)
	jobtest.SetLimit(t, pool, "demo.sleep", -1)
	deps, _ := jobtest.NewJobs(t, pool)
	client := jobtest.Start(t, pool, deps, jobtest.Config{})

	params := make([]river.InsertManyParams, 30)
	for i := range params {
		params[i] = river.InsertManyParams{Args: demo.SleepArgs{MS: 200}}
	}
	_, err := client.InsertMany(ctx, params)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT count(*) FROM concurrency_parked_jobs") == 30
	}, 30*time.Second, 10*time.Millisecond)

	jobtest.SetLimit(t, pool, "demo.sleep", 2)
	pending := func() int {
		return count(t, pool, `SELECT count(*) FROM river_job
			WHERE kind = 'concurrency_limit.resume' AND args->>'kind' = 'demo.sleep' AND finalized_at IS NULL`)
	}
	maxPending := 0
	for range 20 {
		// The cron's kindless run, again and again.
		_, err := client.Insert(ctx, limiter.ResumeArgs{}, nil)
		require.NoError(t, err)
		_, err = client.Insert(ctx, limiter.ResumeArgs{JobKind: "demo.sleep"}, nil)
		require.NoError(t, err)
		maxPending = max(maxPending, pending())
		time.Sleep(50 * time.Millisecond)
	}
	require.LessOrEqual(t, maxPending, 1)
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND state = 'completed'") == 30
	}, 2*time.Minute, 50*time.Millisecond)
	require.Zero(t, count(t, pool, "SELECT count(*) FROM concurrency_parked_jobs"))
	require.Eventually(t, func() bool { return count(t, pool, "SELECT count(*) FROM concurrency_executions") == 0 },
		10*time.Second, 10*time.Millisecond, "every slot released")
	var admitted int
	var hasParked bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT admitted, has_parked FROM concurrency_limits WHERE kind = 'demo.sleep'").Scan(&admitted, &hasParked))
	require.Zero(t, admitted, "kept counts match the tables")
	require.False(t, hasParked)
}

// TestConcurrencyLimitStaleSlots: slots of jobs that are no longer running
// (their worker died and the job was rescued) are freed by the resume worker,
// and parked work proceeds.
func TestConcurrencyLimitStaleSlots(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	pool := openPool(t, url)
	jobtest.SetLimit(t, pool, "demo.sleep", 2)
	// Two slots held by jobs of a worker that died: River's rescuer has
	// since made them retryable.
	var ids [2]int64
	for i := range ids {
		require.NoError(t, pool.QueryRow(ctx, `INSERT INTO river_job (kind, args, queue, max_attempts, state, attempt, attempted_by, scheduled_at)
			VALUES ('demo.sleep', '{"ms": 1}', 'default', 25, 'retryable', 1, '{dead-worker}', now() + interval '1 hour') RETURNING id`).Scan(&ids[i]))
	}
	_, err := pool.Exec(ctx, `INSERT INTO concurrency_executions (job_id, kind, worker_id) VALUES ($1, 'demo.sleep', 'dead-worker'), ($2, 'demo.sleep', 'dead-worker')`, ids[0], ids[1])
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE concurrency_limits SET admitted = 2 WHERE kind = 'demo.sleep'`)
	require.NoError(t, err)

	deps, _ := jobtest.NewJobs(t, pool)
	client := jobtest.Start(t, pool, deps, jobtest.Config{})
	res, err := client.Insert(ctx, demo.SleepArgs{MS: 1}, nil)
	require.NoError(t, err)
	waitParked(t, pool, res.Job.ID) // all slots taken

	client.InsertAndWait(t, limiter.ResumeArgs{JobKind: "demo.sleep"}, nil)
	require.Eventually(t, func() bool { return jobState(t, pool, res.Job.ID) == "completed" }, 30*time.Second, 20*time.Millisecond)
	require.Zero(t, count(t, pool, "SELECT count(*) FROM concurrency_executions WHERE worker_id = 'dead-worker'"), "stale slots freed")
}

// TestConcurrencyLimitResumeUnknownKind: an unknown kind is skipped with a
// log line, not an error.
func TestConcurrencyLimitResumeUnknownKind(t *testing.T) {
	t.Parallel()

	pool := testdb.NewPool(t)
	deps, _ := jobtest.NewJobs(t, pool)
	client := jobtest.Start(t, pool, deps, jobtest.Config{})
	job := client.InsertAndWait(t, limiter.ResumeArgs{JobKind: "no.such.kind"}, nil)
	require.Equal(t, rivertype.JobStateCompleted, job.State)
}

// TestResumeNotifiesRiver: the notification that wakes River's producers
// when parked jobs are resumed goes to River's channel
// (<River's schema>.river_insert), not to sluice's schema, which comes
// first on sluice's search_path.
func TestResumeNotifiesRiver(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool := testdb.NewPool(t)
	river := pgkit.SchemasOf(pool).River
	require.Equal(t, "public", river)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `LISTEN "public.river_insert"`)
	require.NoError(t, err)

	require.NoError(t, db.New(pool).NotifyRiverInsert(ctx, []string{"default"}))
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := conn.Conn().WaitForNotification(waitCtx)
	require.NoError(t, err)
	require.Equal(t, "public.river_insert", n.Channel)
	require.JSONEq(t, `{"queue": "default"}`, n.Payload)
}

// TestReservedSlotCountsOnce: a slot reserved for a job (sluice run) is
// one slot row and one count however often it is reserved, and goes only
// when its reserver forgets it.
func TestReservedSlotCountsOnce(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool := testdb.NewPool(t)
	jobtest.SetLimit(t, pool, "demo.sleep", 5)
	counted := func() (admitted, rows int) {
		return count(t, pool, "SELECT admitted FROM concurrency_limits WHERE kind = 'demo.sleep'"),
			count(t, pool, "SELECT count(*) FROM concurrency_executions WHERE kind = 'demo.sleep'")
	}
	lim, err := limiter.New(limiter.Config{Pool: pool, WorkerID: "run"})
	require.NoError(t, err)
	res, err := lim.ReserveSlot(ctx, &rivertype.JobRow{ID: 8, Kind: "demo.sleep", EncodedArgs: []byte(`{}`)})
	require.NoError(t, err)
	require.True(t, res.Reserved)
	_, err = lim.ReserveSlot(ctx, &rivertype.JobRow{ID: 8, Kind: "demo.sleep", EncodedArgs: []byte(`{}`)})
	require.NoError(t, err)
	admitted, n := counted()
	require.Equal(t, 1, n, "reserving twice writes one row")
	require.Equal(t, n, admitted, "the count equals the rows")
	require.NoError(t, lim.Forget(ctx, "demo.sleep", 8))
	admitted, n = counted()
	require.Zero(t, n)
	require.Zero(t, admitted)
}

func ptrTo[T any](v T) *T { return &v }

// TestLimitChangesRace: limits set and cleared from two connections at
// once, over and over (a clear removes the empty row, which the set must
// create again or lock, never find gone between the two): every change
// succeeds, and the last one holds.
func TestLimitChangesRace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.New(t)
	setter, clearer := newLimiter(t, url), newLimiter(t, url)
	const rounds = 200
	errs := make(chan error, 2)
	go func() {
		for range rounds {
			if err := setter.SetConcurrency(ctx, "race.kind", 2); err != nil {
				errs <- err
				return
			}
		}
		errs <- nil
	}()
	go func() {
		for range rounds {
			if _, err := clearer.ClearLimits(ctx, "race.kind", limiter.Facets{}); err != nil {
				errs <- err
				return
			}
		}
		errs <- nil
	}()
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	require.NoError(t, setter.SetConcurrency(ctx, "race.kind", 3))
	require.Equal(t, 3, count(t, openPool(t, url), "SELECT max_concurrency FROM concurrency_limits WHERE kind = 'race.kind'"))
}

// TestResumedGrantUnderStaleLimits: a parked job resumed with a slot
// reserved for it (a grant round of another process, under a limit set a
// moment ago) is fetched by a worker whose copy of the limits still says
// the kind has none. It claims its slot (the line knows the grant) and
// frees it when it ends, rather than run beside it and leave the slot
// taken (and the kind's count raised) until the safety net frees it a
// minute later.
func TestResumedGrantUnderStaleLimits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind = "test.probe.stalegrant"
	url := testdb.New(t)
	pool := openPool(t, url)
	tracker := newProbeTracker()
	client := startProbeWorker(t, url, "stalegrant", "stalegrant", tracker, 0, nil)

	// The worker reads the limits (none for the kind) as it fetches a job.
	first := insertProbes(t, client, "stalegrant", 0, 1, 0)
	firstAt := *client.WaitFinished(t, 10*time.Second, first...)[first[0]].Job.AttemptedAt

	// Within its copy's life: a limit of 1 and a job resumed from its
	// parking with the slot reserved for it, as a grant round leaves them.
	var resumed int64
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		res, err := client.InsertTx(ctx, tx, probeArgs{Seq: 1, K: "stalegrant"}, &river.InsertOpts{
			Metadata: []byte(`{"sluice_parking": {"attempt": 1, "parks": 1, "reason": "limit"}}`),
		})
		if err != nil {
			return err
		}
		resumed = res.Job.ID
		if _, err := tx.Exec(ctx, `INSERT INTO concurrency_executions (job_id, kind, reserved) VALUES ($1, $2, true)`, resumed, kind); err != nil {
			return err
		}
		// The new row counts the slot rows it finds (admitted 1).
		_, err = tx.Exec(ctx, `INSERT INTO concurrency_limits (kind, max_concurrency) VALUES ($1, 1)`, kind)
		return err
	}))
	require.Equal(t, 1, count(t, pool, "SELECT admitted FROM concurrency_limits WHERE kind = $1", kind))
	events := client.WaitFinished(t, 10*time.Second, resumed)
	if gap := events[resumed].Job.AttemptedAt.Sub(firstAt); gap > limiter.LimitCacheTTL {
		t.Logf("the resumed job was fetched %s after the first: the worker's copy of the limits may have been fresh", gap)
	}

	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT count(*) FROM concurrency_executions WHERE kind = $1", kind) == 0 &&
			count(t, pool, "SELECT admitted FROM concurrency_limits WHERE kind = $1", kind) == 0
	}, 5*time.Second, 20*time.Millisecond, "the slot reserved for the resumed job is still taken after it ended")
}

// TestALineHeldByAChangeIsGrantedAfterTheHold: under a rate alone, job A
// runs (it began: its start is logged, it holds no slot) and B, behind the
// rate, parked. A per-kind limit is set beside the rate, then the rate is
// cleared: at each change A lacks the slot the limits ask, so it holds its
// line for ledger.RecheckHold, and the change's round passes B over. A
// began, so its worker never decides it again, its end would free no
// slot, and no rate wakes the line: B starts while A still runs because
// the worker that heard the change runs the kind's round again once the
// hold is over.
func TestALineHeldByAChangeIsGrantedAfterTheHold(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.New(t)
	pool := openPool(t, url)
	const kind = "heldline"
	const fullKind = "test.probe." + kind
	admin, err := limiter.New(limiter.Config{Pool: pool})
	require.NoError(t, err)
	require.NoError(t, admin.SetRate(ctx, fullKind, limiter.Rate{Max: 1, Per: time.Minute}, nil))
	tracker := newProbeTracker()
	// Without the maintenance queue: concurrency_limit.resume, the safety
	// net that runs the kind's round every second while jobs wait, would
	// grant B too.
	client := startProbeWorker(t, url, "w", kind, tracker, 50*time.Millisecond, func(c *river.Config) {
		c.Queues = map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 20}}
	})

	insertProbes(t, client, kind, 0, 1, 20_000) // A
	require.Eventually(t, func() bool { return tracker.running.Load() == 1 }, 10*time.Second, 5*time.Millisecond, "A never began")
	b := insertProbes(t, client, kind, 1, 1, 1)[0]
	waitParked(t, pool, b)
	time.Sleep(1200 * time.Millisecond) // past the rounds that follow a parking (parkRechecks)

	require.NoError(t, admin.SetConcurrency(ctx, fullKind, 2))
	_, err = admin.ClearLimits(ctx, fullKind, limiter.Facets{Rate: true})
	require.NoError(t, err)
	if !assert.Eventually(t, func() bool { return tracker.workedOf(1) == 1 }, 5*time.Second, 10*time.Millisecond) {
		dumpState(t, pool, fullKind)
		t.Fatalf("B did not start while A ran: %s", jobState(t, pool, b))
	}
	require.Equal(t, int32(2), tracker.max.Load(), "A still runs beside B")
}
