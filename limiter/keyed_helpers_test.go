package limiter_test

import (
	"context"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/limiter"
	"github.com/sluice-dev/sluice/maintenance"
)

// keyedArgs is a test kind with a partition field (tenant) whose worker
// records, exactly, how many jobs run at once per tenant and in all.
type keyedArgs struct {
	Seq    int    `json:"seq"`
	Tenant string `json:"tenant"`
	MS     int    `json:"ms"`
	K      string `json:"k"`
}

func (a keyedArgs) Kind() string { return "test.keyed." + a.K }

// keyedStart is one execution of a keyed job.
type keyedStart struct {
	seq    int
	tenant string
	at     time.Time
}

// keyedTracker records the executions of keyed jobs.
type keyedTracker struct {
	mu          sync.Mutex
	running     int
	maxRunning  int
	perKey      map[string]int
	maxPerKey   map[string]int
	starts      []keyedStart
	ends        map[int]time.Time
	worked      map[int]int
	failFirstOf map[int]bool // seqs whose first execution fails
}

func newKeyedTracker() *keyedTracker {
	return &keyedTracker{perKey: map[string]int{}, maxPerKey: map[string]int{}, worked: map[int]int{}, failFirstOf: map[int]bool{},
		ends: map[int]time.Time{}}
}

func (k *keyedTracker) enter(a keyedArgs) (fail bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.running++
	k.maxRunning = max(k.maxRunning, k.running)
	k.perKey[a.Tenant]++
	k.maxPerKey[a.Tenant] = max(k.maxPerKey[a.Tenant], k.perKey[a.Tenant])
	k.starts = append(k.starts, keyedStart{seq: a.Seq, tenant: a.Tenant, at: time.Now()})
	k.worked[a.Seq]++
	return k.failFirstOf[a.Seq] && k.worked[a.Seq] == 1
}

// startTimes returns when each execution began, as the worker saw it.
func (k *keyedTracker) startTimes() []time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]time.Time, len(k.starts))
	for i, s := range k.starts {
		out[i] = s.at
	}
	return out
}

// rateJitter is the README's stated jitter of a rate's starts: a job's
// code begins up to 150 ms after the limiter let it start, so a window of
// the period less it holds at most the rate's starts.
const rateJitter = 150 * time.Millisecond

func (k *keyedTracker) leave(a keyedArgs) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.running--
	k.perKey[a.Tenant]--
	k.ends[a.Seq] = time.Now()
}

// runningNow returns the most jobs of one tenant running right now.
func (k *keyedTracker) runningNow() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	most := 0
	for _, n := range k.perKey {
		most = max(most, n)
	}
	return most
}

// endOf returns when seq's last execution ended (zero: not yet).
func (k *keyedTracker) endOf(seq int) time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.ends[seq]
}

// snapshot returns the most jobs that ran at once, per tenant and in all,
// and the starts so far in order.
func (k *keyedTracker) snapshot() (int, map[string]int, []keyedStart, map[int]int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	perKey := map[string]int{}
	for t, n := range k.maxPerKey {
		perKey[t] = n
	}
	worked := map[int]int{}
	for s, n := range k.worked {
		worked[s] = n
	}
	return k.maxRunning, perKey, append([]keyedStart(nil), k.starts...), worked
}

type keyedWorker struct {
	river.WorkerDefaults[keyedArgs]
	tracker *keyedTracker
}

func (w *keyedWorker) Work(ctx context.Context, job *river.Job[keyedArgs]) error {
	fail := w.tracker.enter(job.Args)
	defer w.tracker.leave(job.Args)
	select {
	case <-time.After(time.Duration(job.Args.MS) * time.Millisecond):
	case <-ctx.Done():
		return ctx.Err()
	}
	if fail {
		return errFirstAttempt
	}
	return nil
}

type firstAttemptError struct{}

func (firstAttemptError) Error() string { return "first attempt fails" }

var errFirstAttempt = firstAttemptError{}

// startKeyedWorker starts a worker process (own pool, limiter) named id that
// works the keyed kind, with maxWorkers on the default queue.
func startKeyedWorker(t testing.TB, url, id, kind string, tracker *keyedTracker, maxWorkers int) (*jobtest.Client, *limiter.Limiter) {
	t.Helper()
	return startKeyedWorkerParkAfter(t, url, id, kind, tracker, maxWorkers, 20*time.Millisecond)
}

// startKeyedWorkerParkAfter is startKeyedWorker with its own park-after
// time.
func startKeyedWorkerParkAfter(t testing.TB, url, id, kind string, tracker *keyedTracker, maxWorkers int, parkAfter time.Duration) (*jobtest.Client, *limiter.Limiter) {
	t.Helper()
	pool, err := pgkit.Open(context.Background(), url, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	deps, _ := jobtest.NewJobsConfig(t, pool, app.JobsConfig{WorkerID: id, ParkAfter: parkAfter})
	client := jobtest.Start(t, pool, deps, jobtest.Config{
		ID: id,
		Configure: func(c *river.Config) {
			river.AddWorkerArgs(c.Workers, keyedArgs{K: kind}, &keyedWorker{tracker: tracker})
			c.Queues = map[string]river.QueueConfig{
				river.QueueDefault: {MaxWorkers: maxWorkers},
				maintenance.Queue:  {MaxWorkers: 5},
			}
			c.RetryPolicy = &immediateRetry{}
		},
	})
	return client, deps.Limiter
}

// insertKeyed inserts n keyed jobs of tenant (seqs from, from+1, …) and
// returns their ids.
func insertKeyed(t testing.TB, client *jobtest.Client, kind, tenant string, from, n, ms int) []int64 {
	t.Helper()
	params := make([]river.InsertManyParams, n)
	for i := range n {
		params[i] = river.InsertManyParams{Args: keyedArgs{Seq: from + i, Tenant: tenant, MS: ms, K: kind}}
	}
	res, err := client.InsertMany(context.Background(), params)
	require.NoError(t, err)
	ids := make([]int64, n)
	for i, r := range res {
		ids[i] = r.Job.ID
	}
	return ids
}

// maxInWindow is the most times of ts (sorted here) within any window of
// length w (a window [t, t+w) starting at any instant).
func maxInWindow(ts []time.Time, w time.Duration) int {
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	best, lo := 0, 0
	for hi := range ts {
		for ts[hi].Sub(ts[lo]) >= w {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return best
}

// parkedSeqs returns the seqs of the keyed jobs that parked (logParkings).
func parkedSeqs(t testing.TB, pool *pgxpool.Pool) map[int]bool {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT DISTINCT (j.args->>'seq')::int FROM test_parkings p JOIN river_job j ON j.id = p.job_id`)
	require.NoError(t, err)
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	out := map[int]bool{}
	for _, s := range seqs {
		out[s] = true
	}
	return out
}

// requireStartOrder checks that, per tenant, the jobs of seqs started in
// seq order, but for jobs started together (up to slack apart).
func requireStartOrder(t *testing.T, starts []keyedStart, seqs map[int]bool, slack int) {
	t.Helper()
	byTenant := map[string][]int{}
	for _, s := range starts {
		if seqs[s.seq] {
			byTenant[s.tenant] = append(byTenant[s.tenant], s.seq)
		}
	}
	for tenant, order := range byTenant {
		sorted := slices.Clone(order)
		slices.Sort(sorted)
		for i, seq := range order {
			rank := slices.Index(sorted, seq)
			require.Less(t, abs(rank-i), slack, "tenant %s: seq %d started %dth of its waiting jobs, its rank is %d (order %v)",
				tenant, seq, i, rank, order)
		}
	}
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}
