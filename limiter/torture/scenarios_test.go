package torture

import (
	"context"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/sluice-dev/sluice/limiter"
)

// The scenarios replay, through the torture harness and its checks, the
// ways the limiter's paths were found to break where they meet: fixed
// schedules instead of random ones.

// insertJobs inserts n jobs of torture.k of key, each of ms, in one
// InsertMany or (oneByOne) one insert each.
func (x *torture) insertJobs(ctx context.Context, k, key string, n, ms int, oneByOne bool) {
	x.t.Helper()
	args := make([]jobArgs, n)
	attempts := make([]int, n)
	params := make([]river.InsertManyParams, n)
	for i := range n {
		args[i], attempts[i] = jobArgs{K: k, Key: key, MS: ms}, 5
		params[i] = river.InsertManyParams{Args: args[i], InsertOpts: &river.InsertOpts{MaxAttempts: 5}}
	}
	if oneByOne {
		for i := range n {
			res, err := x.client.Insert(ctx, args[i], params[i].InsertOpts)
			if err != nil {
				x.t.Fatal(err)
			}
			x.recordJobs([]*rivertype.JobInsertResult{res}, args[i:i+1], attempts[i:i+1])
		}
		return
	}
	res, err := x.client.InsertMany(ctx, params)
	if err != nil {
		x.t.Fatal(err)
	}
	x.recordJobs(res, args, attempts)
}

// waitFor polls cond every 20 ms for up to d.
func (x *torture) waitFor(d time.Duration, what string, cond func() bool) {
	x.t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			x.t.Fatalf("timed out waiting for %s; the jobs and the line:\n%s", what, x.dumpLine(context.Background()))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dumpLine describes the jobs not completed and the line's rows, for a
// failure's message.
func (x *torture) dumpLine(ctx context.Context) string {
	var out string
	err := x.pool.QueryRow(ctx, `SELECT concat_ws(E'\n',
	    (SELECT string_agg(format('job %s %s attempt %s key %s', j.id, j.state, j.attempt, j.args->>'key'), E'\n' ORDER BY j.id)
	     FROM river_job j WHERE j.state <> 'completed'),
	    (SELECT string_agg(format('slot %s worker %s reserved %s key %s', e.job_id, e.worker_id, e.reserved, e.key), E'\n')
	     FROM concurrency_executions e),
	    (SELECT string_agg(format('waiter %s worker %s reason %s ahead %s', w.job_id, w.worker_id, w.reason, w.ahead), E'\n')
	     FROM concurrency_waiters w),
	    (SELECT string_agg(format('parked %s reason %s at %s', p.job_id, p.reason, p.parked_at), E'\n')
	     FROM concurrency_parked_jobs p),
	    (SELECT string_agg(format('limit %s %s admitted %s has_parked %s', l.kind, l.max_concurrency, l.admitted, l.has_parked), E'\n')
	     FROM concurrency_limits l))`).Scan(&out)
	if err != nil {
		return err.Error()
	}
	return out
}

func (x *torture) count(ctx context.Context, sql string, args ...any) int {
	x.t.Helper()
	var n int
	if err := x.pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		x.t.Fatal(err)
	}
	return n
}

// TestTortureSequence: a per-key limit of 1 is a sequence. Five jobs of one
// key, one insert each, before any worker runs; then one worker, and then
// the same with two: they start in job-id order.
func TestTortureSequence(t *testing.T) {
	for _, workers := range []int{1, 2} {
		x := newTorture(t, uint64(100+workers))
		ctx := context.Background()
		if err := x.lim.SetPerKey(ctx, "torture.a", []string{"key"}, 1); err != nil {
			t.Fatal(err)
		}
		x.insertJobs(ctx, "a", "repo-1", 5, 20, true)
		x.startWorkers(workers)
		x.waitFor(30*time.Second, "the sequence to run", func() bool {
			return x.count(ctx, `SELECT count(*) FROM river_job WHERE state = 'completed' AND kind = 'torture.a'`) == 5
		})
		x.finish()
		x.close()
	}
}

// TestTortureRateChanged: a rate changed at runtime holds. A backlog runs
// at 20/1s on two workers, the rate is cleared, then set to 5/2s: no 2-s
// window holds more than 5 starts.
func TestTortureRateChanged(t *testing.T) {
	x := newTorture(t, 200)
	defer x.close()
	x.slots, x.parks = 24, []time.Duration{time.Second} // sluice worker's park-after
	ctx := context.Background()
	if err := x.lim.SetRate(ctx, "torture.b", limiter.Rate{Max: 20, Per: time.Second}, nil); err != nil {
		t.Fatal(err)
	}
	x.startWorkers(2)
	x.insertJobs(ctx, "b", "k0", 300, 5, false)
	time.Sleep(1500 * time.Millisecond)
	if _, err := x.lim.ClearLimits(ctx, "torture.b", limiter.Facets{Rate: true}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if err := x.lim.SetRate(ctx, "torture.b", limiter.Rate{Max: 5, Per: 2 * time.Second}, nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(6 * time.Second)
	x.finish()
}

// TestTortureBreakerRaised: raising a circuit breaker over parked jobs
// resumes only what the new limit lets start, each with a reserved slot,
// not every parked job at once.
func TestTortureBreakerRaised(t *testing.T) {
	x := newTorture(t, 300)
	defer x.close()
	ctx := context.Background()
	if err := x.lim.SetConcurrency(ctx, "torture.b", -1); err != nil {
		t.Fatal(err)
	}
	x.startWorkers(2)
	const n = 300
	x.insertJobs(ctx, "b", "k0", n, 10, false)
	x.waitFor(60*time.Second, "every job parked", func() bool {
		return x.count(ctx, `SELECT count(*) FROM concurrency_parked_jobs p JOIN river_job j ON j.id = p.job_id
			WHERE j.state = 'pending' AND p.kind = 'torture.b'`) == n
	})
	if err := x.lim.SetConcurrency(ctx, "torture.b", 2); err != nil {
		t.Fatal(err)
	}
	x.waitFor(60*time.Second, "the parked jobs to run", func() bool {
		return x.count(ctx, `SELECT count(*) FROM river_job WHERE state = 'completed' AND kind = 'torture.b'`) == n
	})
	x.finish()
}

// TestTortureRateSetOnIdleWorkers: a rate set while the workers are idle
// holds. A backlog runs at 20/1s on two workers, the rate is cleared (the
// kind's limit row goes, the backlog drains unlimited, and each worker's
// copy of the limits says the kind has none), and only once every job has
// ended is the rate set to 5/2s. 5 s later 3 jobs, and 0.7 s later 7 more:
// no 2 s window holds more than 5 starts. (An idle worker's expired copy
// of the limits used to let jobs that arrived together run unlimited.)
func TestTortureRateSetOnIdleWorkers(t *testing.T) {
	x := newTorture(t, 210)
	defer x.close()
	x.slots, x.parks = 24, []time.Duration{time.Second}
	ctx := context.Background()
	if err := x.lim.SetRate(ctx, "torture.b", limiter.Rate{Max: 20, Per: time.Second}, nil); err != nil {
		t.Fatal(err)
	}
	x.startWorkers(2)
	x.insertJobs(ctx, "b", "k0", 300, 250, false)
	time.Sleep(1500 * time.Millisecond)
	if _, err := x.lim.ClearLimits(ctx, "torture.b", limiter.Facets{Rate: true}); err != nil {
		t.Fatal(err)
	}
	x.waitFor(60*time.Second, "the backlog to drain", func() bool {
		return x.count(ctx, `SELECT count(*) FROM river_job WHERE state = 'completed' AND kind = 'torture.b'`) == 300
	})
	time.Sleep(500 * time.Millisecond)
	if err := x.lim.SetRate(ctx, "torture.b", limiter.Rate{Max: 5, Per: 2 * time.Second}, nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second)
	x.insertJobs(ctx, "b", "k0", 3, 5, false)
	time.Sleep(700 * time.Millisecond)
	x.insertJobs(ctx, "b", "k0", 7, 5, false)
	time.Sleep(6 * time.Second)
	x.finish()
}
