package torture

import (
	"context"

	"fmt"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/limiter"
)

// The scenarios replay, through the torture harness and its checks, the
// ways the limiter's paths were found to break where they meet: fixed
// schedules instead of random ones.

// insertJobs inserts n jobs of torture.k of key, each of ms, in one
// InsertMany or (oneByOne) one insert each.
func (x *torture) insertJobs(ctx context.Context, k, key string, n, ms int, oneByOne bool) {
	x.t.Helper()
	o := op{kind: "torture." + k, oneByOne: oneByOne}
	for range n {
		o.jobs = append(o.jobs, plannedJob{args: jobArgs{K: k, Key: key, MS: ms}, maxAttempts: 5})
	}
	x.burst(ctx, o)
}

// start starts n workers with park-after park each (the harness's
// default when 0: x.parks' first).
func (x *torture) start(n int, park time.Duration) {
	if park == 0 {
		park = time.Second
		if len(x.parks) > 0 {
			park = x.parks[0]
		}
	}
	parks := make([]time.Duration, n)
	for i := range parks {
		parks[i] = park
	}
	x.startWorkers(parks)
}

// waitFor polls cond every 20 ms for up to d.
func (x *torture) waitFor(d time.Duration, what string, cond func() bool) {
	x.t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			d := x.dumpLine(context.Background())
			x.t.Fatalf("timed out waiting for %s; the jobs and the line:\n%s", what, d)
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
	     FROM concurrency_limits l),
	    (SELECT string_agg(format('key %s %s slots %s waiting %s served %s', k.kind, k.key, k.slots, k.waiting, k.served_at), E'\n')
	     FROM concurrency_key_lines k))`).Scan(&out)
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
		x.start(workers, 0)
		x.waitFor(30*time.Second, "the sequence to run", func() bool {
			return x.count(ctx, `SELECT count(*) FROM river_job WHERE state = 'completed' AND kind = 'torture.a'`) == 5
		})
		x.finish([2]bool{true, true})
		x.close()
	}
}

// TestTortureRateChanged: a rate changed at runtime holds. A backlog runs
// at 20/1s on two workers, the rate is cleared, then set to 5/2s: no 2-s
// window holds more than 5 starts.
//
// The jobs that start unlimited in the 50 ms after the new rate is set
// (fetched before their worker heard of it) cannot be judged, and they
// must stay under a tenth of the rate's candidates: each worker runs 4
// jobs of 50 ms at once, so that few start in any 50 ms however slowly a
// loaded machine hears the change (with 24 slots and jobs of 5 ms, 16 to
// 24 did on a busy machine, against 59 to 79 candidates).
func TestTortureRateChanged(t *testing.T) {
	x := newTorture(t, 200)
	defer x.close()
	x.slots, x.parks = 4, []time.Duration{time.Second} // sluice worker's park-after
	ctx := context.Background()
	if err := x.lim.SetRate(ctx, "torture.b", limiter.Rate{Max: 20, Per: time.Second}, nil); err != nil {
		t.Fatal(err)
	}
	x.start(2, 0)
	x.insertJobs(ctx, "b", "k0", 300, 50, false)
	time.Sleep(1500 * time.Millisecond)
	if _, err := x.lim.ClearLimits(ctx, "torture.b", limiter.Facets{Rate: true}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if err := x.lim.SetRate(ctx, "torture.b", limiter.Rate{Max: 5, Per: 2 * time.Second}, nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(8 * time.Second)
	x.finish([2]bool{true, true})
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
	x.start(2, 0)
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
	x.finish([2]bool{true, true})
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
	x.start(2, 0)
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
	x.finish([2]bool{true, true})
}

// TestTortureFairnessBehindABacklog (the torture issue's item 10): a
// per-kind limit of 4 and a per-key limit of 4; tenant A inserts 400 jobs
// of 50 ms, and while they wait in the worker's River slots beyond the
// kind's 4 working (the rest of the backlog parked ahead at the fetch),
// tenant B inserts 5 jobs in one insert. Round-robin across keys lets B's
// jobs in at once, one per turn: B is fetched within the README's 2 s of
// its insert (A's backlog, ahead of it in River's fetch order, parks ahead
// of the fetch), and at most a few of A's jobs start between B's fetch
// and B's last finish (its 5 turns and the kind's limit in flight), not
// A's backlog. The fairness check judges the same from the record.
func TestTortureFairnessBehindABacklog(t *testing.T) {
	x := newTorture(t, 910)
	defer x.close()
	x.slots = 50 // a sluice worker's --default-workers
	ctx := context.Background()
	if err := x.lim.SetConcurrency(ctx, "torture.a", 4); err != nil {
		t.Fatal(err)
	}
	if err := x.lim.SetPerKey(ctx, "torture.a", []string{"key"}, 4); err != nil {
		t.Fatal(err)
	}
	x.start(1, time.Second)
	x.insertJobs(ctx, "a", "A", 400, 50, false)
	// The worker fetches a River batch of A and parks the rest of A's
	// backlog ahead (the fetch's decision), so its slots hold the kind's 4
	// working and some waiting for their turn, not all 50.
	x.waitFor(30*time.Second, "A's jobs to wait in the worker, the rest parked", func() bool {
		return x.count(ctx, `SELECT count(*) FROM river_job WHERE kind = 'torture.a' AND state = 'running'`) > 8 &&
			x.count(ctx, `SELECT count(*) FROM river_job WHERE kind = 'torture.a' AND state = 'pending'`) >= 100
	})
	insertedB, err := dbNow(ctx, x.pool)
	if err != nil {
		t.Fatal(err)
	}
	x.insertJobs(ctx, "a", "B", 5, 50, false)
	x.waitFor(60*time.Second, "B's jobs to end", func() bool {
		return x.count(ctx, `SELECT count(*) FROM river_job WHERE kind = 'torture.a' AND args->>'key' = 'B' AND state = 'completed'`) == 5
	})
	runs, err := readRunLogs(x.runsDir)
	if err != nil {
		t.Fatal(err)
	}
	var lastB time.Time
	for _, r := range runs {
		if r.key == "B" && r.end.After(lastB) {
			lastB = r.end
		}
	}
	// B's first fetch, as the record has it (River's fetch of the job).
	var fetchedB time.Time
	if err := x.pool.QueryRow(ctx, `SELECT min(s.at) FROM public.torture_states s JOIN river_job j ON j.id = s.job_id
		WHERE j.args->>'key' = 'B' AND s.new_state = 'running'`).Scan(&fetchedB); err != nil {
		t.Fatal(err)
	}
	aStarts, aSinceInsert := 0, 0
	for _, r := range runs {
		if r.key != "A" || !r.start.Before(lastB) {
			continue
		}
		if r.start.After(insertedB) {
			aSinceInsert++
		}
		if r.start.After(fetchedB) {
			aStarts++
		}
	}
	t.Logf("B fetched %s after its insert; %d of A's jobs started between B's fetch and B's last finish (%s), %d since B's insert",
		fetchedB.Sub(insertedB).Round(time.Millisecond), aStarts, lastB.Sub(fetchedB).Round(time.Millisecond), aSinceInsert)
	if fetchedB.Sub(insertedB) > fairFetchedWithin {
		t.Errorf("B's first job was fetched %s after its insert, behind A's backlog; the README promises %s",
			fetchedB.Sub(insertedB).Round(time.Millisecond), fairFetchedWithin)
	}
	if aStarts > fairBehindABacklog {
		t.Errorf("%d of A's jobs started between B's fetch and B's last finish (%s), a fair line lets in at most %d",
			aStarts, lastB.Sub(fetchedB).Round(time.Millisecond), fairBehindABacklog)
	}
	if _, err := x.lim.ClearLimits(ctx, "torture.a", limiter.Facets{}); err != nil {
		t.Fatal(err)
	}
	x.finish([2]bool{true, true})
}

// fairBehindABacklog is how many of A's jobs may start from B's fetch to
// B's last finish in TestTortureFairnessBehindABacklog (the README's
// fairness row counts from a job's fetch): B's 5 turns, one of A's each,
// and the kind's limit of 4 in flight when B arrives, twice over for the
// time B's jobs take to be decided.
const fairBehindABacklog = 12

// fairFetchedWithin is the README's bound on the fetch of a key's job that
// arrives behind another key's backlog.
const fairFetchedWithin = 2 * time.Second

// TestTortureMixedRun (the torture issue's item 11): three workers, then
// a fourth; per-kind and per-key limits changed in three phases while
// bursts of eight keys come in; cancels; one worker killed (SIGKILL); then
// a steady drain under a per-kind limit of 8 and a per-key limit of 3. In
// the run that found it, a job of key k7 started 740 ms after four younger
// jobs of k7 had each started and finished, 40 s after the last change.
// The checks judge every start of the run (order, fairness, and the rest).
func TestTortureMixedRun(t *testing.T) {
	x := newTorture(t, 911)
	defer x.close()
	x.slots = 16
	ctx := context.Background()
	burst := func(n, ms int) {
		for k := range 8 {
			x.insertJobs(ctx, "a", fmt.Sprintf("k%d", k), n, ms, k%3 == 0)
		}
	}
	x.start(3, 200*time.Millisecond)
	// Phase 1: a per-kind limit of 4.
	if err := x.lim.SetConcurrency(ctx, "torture.a", 4); err != nil {
		t.Fatal(err)
	}
	burst(6, 20)
	time.Sleep(time.Second)
	// Phase 2: a per-kind limit of 8 and a per-key limit of 3; a fourth
	// worker; cancels of waiting jobs.
	if err := x.lim.SetPerKey(ctx, "torture.a", []string{"key"}, 3); err != nil {
		t.Fatal(err)
	}
	if err := x.lim.SetConcurrency(ctx, "torture.a", 8); err != nil {
		t.Fatal(err)
	}
	x.addWorker(x.newWorkerID(), 500*time.Millisecond)
	burst(10, 30)
	for i := range 4 {
		x.clientCall(ctx, "cancel", float64(i)/4)
	}
	time.Sleep(time.Second)
	// Phase 3: the per-key limit lowered to 2, then raised to 3 again; a
	// worker killed.
	if err := x.lim.SetPerKey(ctx, "torture.a", []string{"key"}, 2); err != nil {
		t.Fatal(err)
	}
	burst(10, 10)
	alive := x.alive()
	victim := alive[1]
	victim.kill()
	at, err := dbNow(ctx, x.pool)
	if err != nil {
		t.Fatal(err)
	}
	x.mu.Lock()
	x.events = append(x.events, workerEvent{worker: victim.id, what: "kill", at: at})
	x.mu.Unlock()
	if err := x.lim.SetPerKey(ctx, "torture.a", []string{"key"}, 3); err != nil {
		t.Fatal(err)
	}
	// The steady drain.
	burst(20, 15)
	x.waitFor(90*time.Second, "the drain", func() bool {
		return x.count(ctx, `SELECT count(*) FROM river_job WHERE kind = 'torture.a'
			AND state IN ('available', 'pending', 'running', 'retryable', 'scheduled')`) == 0
	})
	x.finish([2]bool{true, true})
}
