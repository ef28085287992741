package torture

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/limiter"
)

// TestMain runs the test binary as a torture worker process when asked to.
func TestMain(m *testing.M) {
	if id := os.Getenv(workerEnv); id != "" {
		os.Exit(workerMain(id))
	}
	os.Exit(m.Run())
}

// testPoolSize is the size of the test's own pool (inserts, River client
// calls, limit changes, samples).
const testPoolSize = 6

// Sizes of a seed's schedule.
const (
	// defaultBudget is how long TestTorture runs seeds without
	// TORTURE_DURATION (the whole test, seeds one after the other).
	defaultBudget = 30 * time.Second
	// schedulePhase is how long a seed's operations go on.
	schedulePhase = 9 * time.Second
	// maxJobs caps the jobs a seed inserts.
	maxJobs = 1200
	// quiescenceTimeout bounds the wait for every job to end.
	quiescenceTimeout = 90 * time.Second
)

// tally counts what the seeds did and found.
type tally struct {
	seeds      int
	ops        map[string]int
	jobs, runs int
	parkings   int
	violations map[string]int
}

func (t *tally) add(o *tally) {
	t.seeds += o.seeds
	t.jobs += o.jobs
	t.runs += o.runs
	t.parkings += o.parkings
	for k, v := range o.ops {
		t.ops[k] += v
	}
	for k, v := range o.violations {
		t.violations[k] += v
	}
}

func newTally() *tally { return &tally{ops: map[string]int{}, violations: map[string]int{}} }

func (t *tally) String() string {
	var ops, vs []string
	total := 0
	for k, v := range t.ops {
		ops = append(ops, fmt.Sprintf("%s %d", k, v))
	}
	for k, v := range t.violations {
		vs = append(vs, fmt.Sprintf("%s %d", k, v))
		total += v
	}
	sort.Strings(ops)
	sort.Strings(vs)
	return fmt.Sprintf("seeds %d, jobs %d, executions %d, parkings %d; operations: %s; violations %d (%s)",
		t.seeds, t.jobs, t.runs, t.parkings, strings.Join(ops, ", "), total, strings.Join(vs, ", "))
}

// TestTorture runs seeded random schedules against two or three worker
// processes for the budget (TORTURE_DURATION, default 30s; at least one
// seed) and checks the limiter's promises against the record of each.
// TORTURE_SEED runs that seed alone.
func TestTorture(t *testing.T) {
	budget := defaultBudget
	if s := os.Getenv("TORTURE_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("TORTURE_DURATION: %v", err)
		}
		budget = d
	}
	var seeds []uint64
	if s := os.Getenv("TORTURE_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("TORTURE_SEED: %v", err)
		}
		seeds = []uint64{seed}
	}
	base := uint64(time.Now().UnixNano() % 1_000_000_000)
	deadline := time.Now().Add(budget)
	total := newTally()
	for i := 0; ; i++ {
		var seed uint64
		switch {
		case seeds != nil && i < len(seeds):
			seed = seeds[i]
		case seeds != nil:
		case i == 0 || time.Now().Add(schedulePhase).Before(deadline):
			seed = base + uint64(i)
		}
		if seed == 0 {
			break
		}
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			total.add(runSeed(t, seed))
		})
	}
	t.Logf("torture: %s", total)
	fmt.Printf("TORTURE SUMMARY: %s\n", total)
}

// torture is one seed's run: its database, workers and schedule.
type torture struct {
	t    *testing.T
	seed uint64
	rng  *rand.Rand
	url  string
	// runsDir holds the workers' run logs.
	runsDir string
	pool    *pgxpool.Pool
	client  *app.Client
	lim     *limiter.Limiter
	slots   int
	// parks are the park-after times new workers pick from.
	parks    []time.Duration
	tally    *tally
	nextWork int

	mu      sync.Mutex
	workers []*workerProc
	events  []workerEvent
	jobs    map[int64]*job
	ops     []clientOp
	vs      violations
}

func runSeed(t *testing.T, seed uint64) *tally {
	x := newTorture(t, seed)
	defer x.close()
	n := 2 + x.rng.IntN(2)
	x.slots = 8 + x.rng.IntN(17)
	x.startWorkers(n)
	stopSampling := x.sampleAccounting(context.Background())
	start := time.Now()
	for time.Since(start) < schedulePhase {
		x.step(context.Background())
		time.Sleep(time.Duration(10+x.rng.IntN(240)) * time.Millisecond)
	}
	stopSampling()
	return x.finish()
}

// newTorture prepares a seed's run: a fresh database with the record
// tables, River's client and a limiter for the test's own calls. No
// worker runs yet.
func newTorture(t *testing.T, seed uint64) *torture {
	ctx := context.Background()
	x := &torture{t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, 0x70727475)), url: testdb.New(t),
		runsDir: t.TempDir(), jobs: map[int64]*job{}, tally: newTally(), slots: 16}
	x.tally.seeds = 1
	t.Logf("seed %d (replay: TORTURE_SEED=%d make torture)", seed, seed)
	var err error
	x.pool, err = db.Open(ctx, withPoolSize(x.url, testPoolSize), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x.pool.Exec(ctx, recordSQL); err != nil {
		t.Fatalf("record tables: %v", err)
	}
	if x.client, err = app.NewInsertClient(x.pool, nil); err != nil {
		t.Fatal(err)
	}
	if x.lim, err = limiter.New(limiter.Config{Pool: x.pool, WorkerID: "torture-test"}); err != nil {
		t.Fatal(err)
	}
	x.lim.SetClient(x.client) // as the CLI's limits commands do
	return x
}

// startWorkers starts n workers at once.
func (x *torture) startWorkers(n int) {
	var wg sync.WaitGroup
	for range n {
		id, park := x.newWorkerSpec()
		wg.Add(1)
		go func() {
			defer wg.Done()
			x.addWorker(id, park)
		}()
	}
	wg.Wait()
}

// close stops the workers and closes the pool.
func (x *torture) close() {
	for _, w := range x.alive() {
		w.stop(x.t)
	}
	x.pool.Close()
}

// finish lets every job end, checks the record, reports what it found,
// and returns the tally.
func (x *torture) finish() *tally {
	ctx := context.Background()
	t := x.t
	x.quiesce(ctx)
	parkAfter := time.Duration(0)
	for _, w := range x.allWorkers() {
		parkAfter = max(parkAfter, w.parkAfter)
	}
	rec, err := loadRecord(ctx, x.pool, x.runsDir, x.jobs, x.ops, x.events, parkAfter)
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("TORTURE_DUMP") != "" {
		dump(t, rec)
	}
	vs := check(rec)
	vs.list = append(x.vs.list, vs.list...)
	for k, v := range x.vs.count {
		if vs.count == nil {
			vs.count = map[string]int{}
		}
		vs.count[k] += v
	}
	x.tally.jobs, x.tally.runs = len(rec.jobs), len(rec.runs)
	for _, cs := range rec.changes {
		for _, c := range cs {
			if c.from == "running" && c.to == "pending" {
				x.tally.parkings++
			}
		}
	}
	for k, v := range vs.count {
		x.tally.violations[k] += v
	}
	for _, v := range vs.list {
		t.Errorf("seed %d: %s", x.seed, v)
	}
	t.Logf("seed %d: %s", x.seed, x.tally)
	return x.tally
}

// newWorkerSpec names a new worker and picks its park-after.
func (x *torture) newWorkerSpec() (string, time.Duration) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.nextWork++
	parks := x.parks
	if parks == nil {
		parks = []time.Duration{30 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond}
	}
	return fmt.Sprintf("t%d-w%d", x.seed%10000, x.nextWork), parks[x.rng.IntN(len(parks))]
}

func (x *torture) addWorker(id string, park time.Duration) {
	w := startWorker(x.t, x.url, x.runsDir, id, park, x.slots)
	at, err := dbNow(context.Background(), x.pool)
	if err != nil {
		x.t.Error(err)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.workers = append(x.workers, w)
	x.events = append(x.events, workerEvent{worker: id, what: "start", at: at})
}

func (x *torture) alive() []*workerProc {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []*workerProc
	for _, w := range x.workers {
		select {
		case <-w.done:
		default:
			out = append(out, w)
		}
	}
	return out
}

func (x *torture) allWorkers() []*workerProc {
	x.mu.Lock()
	defer x.mu.Unlock()
	return slices.Clone(x.workers)
}

// step does one operation of the schedule.
func (x *torture) step(ctx context.Context) {
	r := x.rng.IntN(100)
	switch {
	case r < 22:
		x.burst(ctx)
	case r < 32:
		x.trickle(ctx)
	case r < 62:
		x.changeLimits(ctx)
	case r < 77:
		x.clientCall(ctx)
	case r < 81:
		x.replaceWorker(ctx)
	}
}

// kindFor picks a torture kind.
func (x *torture) kindFor() string { return []string{"a", "b"}[x.rng.IntN(2)] }

// newArgs picks a job: a skewed key (k0 most often), a short duration,
// sometimes a failure or a snooze.
func (x *torture) newArgs(k string) (jobArgs, int) {
	// Zipf-like: key i with weight 1/(i+1) over 8 keys.
	weights := []float64{1, 1.0 / 2, 1.0 / 3, 1.0 / 4, 1.0 / 5, 1.0 / 6, 1.0 / 7, 1.0 / 8}
	sum := 0.0
	for _, w := range weights {
		sum += w
	}
	p := x.rng.Float64() * sum
	key := 0
	for i, w := range weights {
		if p < w {
			key = i
			break
		}
		p -= w
	}
	a := jobArgs{K: k, Key: fmt.Sprintf("k%d", key), MS: x.rng.IntN(30)}
	maxAttempts := 5
	switch r := x.rng.IntN(100); {
	case r < 6:
		a.Fail = 1
	case r < 8:
		a.Fail, maxAttempts = 9, 2
	case r < 12:
		a.Snooze = true
	}
	return a, maxAttempts
}

func (x *torture) inserted() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.jobs)
}

func (x *torture) recordJobs(res []*rivertype.JobInsertResult, args []jobArgs, maxAttempts []int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for i, r := range res {
		x.jobs[r.Job.ID] = &job{id: r.Job.ID, kind: r.Job.Kind, args: args[i], maxAttempts: maxAttempts[i]}
	}
}

// burst inserts several jobs of a kind at once: in one InsertMany, or one
// insert each (separate transactions).
func (x *torture) burst(ctx context.Context) {
	if x.inserted() >= maxJobs {
		return
	}
	k := x.kindFor()
	n := 5 + x.rng.IntN(50)
	args := make([]jobArgs, n)
	attempts := make([]int, n)
	params := make([]river.InsertManyParams, n)
	for i := range n {
		args[i], attempts[i] = x.newArgs(k)
		params[i] = river.InsertManyParams{Args: args[i], InsertOpts: &river.InsertOpts{MaxAttempts: attempts[i]}}
	}
	if x.rng.IntN(3) == 0 {
		x.tally.ops["insert one by one"]++
		for i := range n {
			res, err := x.client.Insert(ctx, args[i], params[i].InsertOpts)
			if err != nil {
				x.t.Errorf("insert: %v", err)
				return
			}
			x.recordJobs([]*rivertype.JobInsertResult{res}, args[i:i+1], attempts[i:i+1])
		}
		return
	}
	x.tally.ops["insert burst"]++
	res, err := x.client.InsertMany(ctx, params)
	if err != nil {
		x.t.Errorf("insert: %v", err)
		return
	}
	x.recordJobs(res, args, attempts)
}

// trickle inserts a few jobs a few ms apart.
func (x *torture) trickle(ctx context.Context) {
	if x.inserted() >= maxJobs {
		return
	}
	x.tally.ops["insert trickle"]++
	k := x.kindFor()
	for range 3 + x.rng.IntN(8) {
		a, attempts := x.newArgs(k)
		res, err := x.client.Insert(ctx, a, &river.InsertOpts{MaxAttempts: attempts})
		if err != nil {
			x.t.Errorf("insert: %v", err)
			return
		}
		x.recordJobs([]*rivertype.JobInsertResult{res}, []jobArgs{a}, []int{attempts})
		time.Sleep(time.Duration(5+x.rng.IntN(40)) * time.Millisecond)
	}
}

// changeLimits sets, raises, lowers, breaks or clears a limit of a kind.
func (x *torture) changeLimits(ctx context.Context) {
	kind := "torture." + x.kindFor()
	var err error
	switch r := x.rng.IntN(100); {
	case r < 25:
		n := []int32{1, 2, 3, 4, 6}[x.rng.IntN(5)]
		x.tally.ops["set per-kind limit"]++
		err = x.lim.SetConcurrency(ctx, kind, n)
	case r < 35:
		x.tally.ops["set circuit breaker"]++
		err = x.lim.SetConcurrency(ctx, kind, -1)
	case r < 55:
		m := []int32{1, 1, 2, 3}[x.rng.IntN(4)]
		x.tally.ops["set per-key limit"]++
		err = x.lim.SetPerKey(ctx, kind, []string{"key"}, m)
	case r < 70:
		rate := limiter.Rate{Max: []int32{2, 3, 5, 8}[x.rng.IntN(4)], Per: []time.Duration{time.Second, 2 * time.Second}[x.rng.IntN(2)]}
		var fields []string
		if x.rng.IntN(2) == 0 {
			rate.PerKey, fields = true, []string{"key"}
		}
		x.tally.ops["set rate"]++
		err = x.lim.SetRate(ctx, kind, rate, fields)
	case r < 78:
		x.tally.ops["clear per-kind limit"]++
		_, err = x.lim.ClearLimits(ctx, kind, limiter.Facets{Concurrency: true})
	case r < 86:
		x.tally.ops["clear per-key limit"]++
		_, err = x.lim.ClearLimits(ctx, kind, limiter.Facets{PerKey: true})
	case r < 93:
		x.tally.ops["clear rate"]++
		_, err = x.lim.ClearLimits(ctx, kind, limiter.Facets{Rate: true})
	default:
		x.tally.ops["clear all limits"]++
		_, err = x.lim.ClearLimits(ctx, kind, limiter.Facets{})
	}
	if err != nil && !errors.Is(err, limiter.ErrInvalidLimit) {
		x.t.Errorf("change limits of %s: %v", kind, err)
	}
}

// clientCall cancels, deletes or retries a waiting job through River's
// client.
func (x *torture) clientCall(ctx context.Context) {
	op := []string{"cancel", "delete", "retry"}[x.rng.IntN(3)]
	states := []string{"pending", "available", "retryable", "scheduled"}
	if op == "cancel" {
		states = append(states, "running")
	}
	rows, err := x.pool.Query(ctx, `SELECT id FROM river_job WHERE kind LIKE 'torture.%' AND state::text = ANY($1) ORDER BY id`, states)
	if err != nil {
		x.t.Error(err)
		return
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(ids) == 0 {
		return
	}
	id := ids[x.rng.IntN(len(ids))]
	before, err := dbNow(ctx, x.pool)
	if err != nil {
		x.t.Error(err)
		return
	}
	var row *rivertype.JobRow
	switch op {
	case "cancel":
		row, err = x.client.JobCancel(ctx, id)
	case "delete":
		row, err = x.client.JobDelete(ctx, id)
	case "retry":
		row, err = x.client.JobRetry(ctx, id)
	}
	after, nowErr := dbNow(ctx, x.pool)
	if nowErr != nil {
		x.t.Error(nowErr)
		return
	}
	if err != nil {
		return // it started meanwhile (a running job cannot be deleted), or ended
	}
	x.tally.ops["River Job"+strings.ToUpper(op[:1])+op[1:]]++
	x.mu.Lock()
	defer x.mu.Unlock()
	x.ops = append(x.ops, clientOp{op: op, job: id, before: before, after: after, state: string(row.State)})
}

// replaceWorker starts a new worker, then stops (SIGTERM) or kills
// (SIGKILL) one of the others.
func (x *torture) replaceWorker(ctx context.Context) {
	alive := x.alive()
	victim := alive[x.rng.IntN(len(alive))]
	kill := x.rng.IntN(2) == 0
	id, park := x.newWorkerSpec()
	x.addWorker(id, park)
	what := "stop"
	if kill {
		what = "kill"
		x.tally.ops["worker killed (SIGKILL)"]++
		victim.kill()
	} else {
		x.tally.ops["worker stopped (SIGTERM)"]++
		victim.stop(x.t)
	}
	at, err := dbNow(ctx, x.pool)
	if err != nil {
		x.t.Error(err)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.events = append(x.events, workerEvent{worker: victim.id, what: what, at: at})
}

// quiesce lifts the limits (clears them, or sets a generous one) so that
// every job can end, waits until every job has, and checks the limiter's
// books: nothing held, counts equal to a recount.
func (x *torture) quiesce(ctx context.Context) {
	for _, k := range []string{"a", "b"} {
		kind := "torture." + k
		if x.rng.IntN(2) == 0 {
			if _, err := x.lim.ClearLimits(ctx, kind, limiter.Facets{}); err != nil {
				x.t.Errorf("clear %s: %v", kind, err)
			}
			continue
		}
		if _, err := x.lim.ClearLimits(ctx, kind, limiter.Facets{PerKey: true, Rate: true}); err != nil {
			x.t.Errorf("clear %s: %v", kind, err)
		}
		if err := x.lim.SetConcurrency(ctx, kind, 20); err != nil {
			x.t.Errorf("limit %s: %v", kind, err)
		}
	}
	deadline := time.Now().Add(quiescenceTimeout)
	for {
		var left int
		if err := x.pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind LIKE 'torture.%'
			AND state IN ('available', 'pending', 'running', 'retryable', 'scheduled')`).Scan(&left); err != nil {
			x.t.Fatal(err)
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			var states string
			_ = x.pool.QueryRow(ctx, `SELECT string_agg(state::text || ' ' || n, ', ') FROM (SELECT state, count(*) AS n
				FROM river_job WHERE kind LIKE 'torture.%' GROUP BY state) s`).Scan(&states)
			x.vs.add("quiescence", "%d jobs not ended %s after the schedule (%s)", left, quiescenceTimeout, states)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Leased slots no job needs go back within LeaseLinger; releases are
	// written in the background.
	time.Sleep(1500 * time.Millisecond)
	x.checkBooks(ctx, "at the end")
}

// booksSQL reads the limiter's state of the torture kinds.
const booksSQL = `
SELECT
    (SELECT count(*) FROM concurrency_executions WHERE kind LIKE 'torture.%'),
    (SELECT count(*) FROM concurrency_parked_jobs WHERE kind LIKE 'torture.%'),
    (SELECT COALESCE(sum(slots), 0) FROM concurrency_leases WHERE kind LIKE 'torture.%'),
    (SELECT count(*) FROM concurrency_starts WHERE kind LIKE 'torture.%' AND reserved),
    (SELECT count(*) FROM concurrency_key_turns WHERE kind LIKE 'torture.%'),
    (SELECT COALESCE(string_agg(format('%s admitted %s (recount %s), has_parked %s (recount %s)', l.kind, l.admitted,
                 c.n, l.has_parked, c.parked), '; '), '')
     FROM concurrency_limits l
     CROSS JOIN LATERAL (
         SELECT (SELECT count(*) FROM concurrency_executions e WHERE e.kind = l.kind)
                + (SELECT COALESCE(sum(cl.slots), 0) FROM concurrency_leases cl WHERE cl.kind = l.kind) AS n,
                EXISTS (SELECT 1 FROM concurrency_parked_jobs p WHERE p.kind = l.kind
                        AND p.reason NOT IN ('key_limit', 'key_fifo', 'key_rate')) AS parked
     ) c
     WHERE l.kind LIKE 'torture.%' AND (l.admitted <> c.n OR l.has_parked <> c.parked))`

// lineHistorySQL is the history of the slot and waiter rows of the jobs
// whose slots are left, for diagnosis.
const lineHistorySQL = `
SELECT COALESCE(string_agg(format('job %s: %s reserved=%s worker=%s at %s by %s', l.job_id, l.what, l.reserved, l.worker,
                                  l.at::time, l.query), E'\n' ORDER BY l.id), '')
FROM public.torture_line l
WHERE l.job_id IN (SELECT job_id FROM concurrency_executions WHERE kind LIKE 'torture.%')`

// leftoverSQL describes the slot rows and leases left, for diagnosis.
const leftoverSQL = `
SELECT COALESCE(string_agg(x, '; '), '') FROM (
    SELECT format('slot of job %s (%s key %s, worker %s, reserved %s, since %s; the job %s, attempt %s, finalized %s)',
                  e.job_id, e.kind, e.key, e.worker_id, e.reserved, e.admitted_at::time, j.state, j.attempt, j.finalized_at::time) AS x
    FROM concurrency_executions e LEFT JOIN river_job j ON j.id = e.job_id
    WHERE e.kind LIKE 'torture.%'
    UNION ALL
    SELECT format('lease of %s slots of %s by %s (renewed %s)', cl.slots, cl.kind, cl.worker_id, cl.renewed_at::time)
    FROM concurrency_leases cl WHERE cl.kind LIKE 'torture.%' AND cl.slots > 0
) s`

// checkBooks checks the limiter's books at quiescence: no slot, parking,
// lease, reservation or turn left, and every limit row's counts equal to
// a recount.
func (x *torture) checkBooks(ctx context.Context, when string) {
	var slots, parked, leased, reserved, turns int64
	var off string
	if err := x.pool.QueryRow(ctx, booksSQL).Scan(&slots, &parked, &leased, &reserved, &turns, &off); err != nil {
		x.t.Fatal(err)
	}
	if slots+parked+leased+reserved+turns > 0 {
		var rows, history string
		_ = x.pool.QueryRow(ctx, leftoverSQL).Scan(&rows)
		_ = x.pool.QueryRow(ctx, lineHistorySQL).Scan(&history)
		rows += "\n" + history
		x.vs.add("accounting", "%s, nothing runs or waits, yet %d slot rows, %d parked records, %d leased slots, %d reserved starts, %d key turns are left: %s",
			when, slots, parked, leased, reserved, turns, rows)
	}
	if off != "" {
		x.vs.add("accounting", "%s: counts differ from a recount: %s", when, off)
	}
}

// sampleAccounting checks, every 200 ms while the schedule runs, that each
// torture limit row's admitted count equals its slot rows plus leased slots
// (they change in the same transactions, so any snapshot must agree).
func (x *torture) sampleAccounting(ctx context.Context) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			var off string
			err := x.pool.QueryRow(ctx, `
				SELECT COALESCE(string_agg(format('%s admitted %s, recount %s', l.kind, l.admitted, c.n), '; '), '')
				FROM concurrency_limits l
				CROSS JOIN LATERAL (SELECT (SELECT count(*) FROM concurrency_executions e WHERE e.kind = l.kind)
					+ (SELECT COALESCE(sum(cl.slots), 0) FROM concurrency_leases cl WHERE cl.kind = l.kind) AS n) c
				WHERE l.kind LIKE 'torture.%' AND l.admitted <> c.n`).Scan(&off)
			if err != nil {
				continue
			}
			if off != "" {
				x.mu.Lock()
				x.vs.add("accounting", "while running: %s", off)
				x.mu.Unlock()
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

// dump logs the record of the first jobs (TORTURE_DUMP=1), for diagnosis.
func dump(t *testing.T, r *record) {
	var ids []int64
	for id := range r.jobs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	r.indexRuns()
	for _, id := range ids[:min(len(ids), 12)] {
		var b strings.Builder
		fmt.Fprintf(&b, "job %d (%s key %s):", id, r.jobs[id].kind, r.jobs[id].args.Key)
		for _, c := range r.changes[id] {
			fmt.Fprintf(&b, " %s %s→%s@%s", c.client, c.from, c.to, c.at.Format("05.000000"))
		}
		for _, x := range r.runsOf[id] {
			fmt.Fprintf(&b, " | run %s %s-%s %s", x.worker, x.start.Format("05.000000"), x.end.Format("05.000000"), x.outcome)
		}
		t.Log(b.String())
	}
}
