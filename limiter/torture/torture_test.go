package torture

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/limiter"
	"github.com/sluice-dev/sluice/policy"
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

const (
	// defaultBudget is how long TestTorture runs seeds without
	// TORTURE_DURATION (the whole test, seeds one after the other).
	defaultBudget = 30 * time.Second
	// quiescenceTimeout bounds the wait for every job to end.
	quiescenceTimeout = 90 * time.Second
	// sampleEvery is how often the accounting is sampled while the
	// schedule runs.
	sampleEvery = 200 * time.Millisecond
)

// requireTorture skips a run against real worker processes unless it was
// asked for: make torture sets TORTURE=1 (TORTURE_SEED, TORTURE_DURATION
// and TORTURE_CORPUS ask too), and so does make test for its 30-second run
// after the suite. Those runs search the limiter for bugs, with random
// schedules and timing tolerances; the suite itself runs the package's
// deterministic tests (the checks on hand-written records, the schedule
// drawn from its seed).
func requireTorture(t *testing.T) {
	t.Helper()
	for _, v := range []string{"TORTURE", "TORTURE_SEED", "TORTURE_DURATION", "TORTURE_CORPUS"} {
		if os.Getenv(v) != "" {
			return
		}
	}
	t.Skip("runs against real worker processes under make torture (TORTURE=1)")
}

// seedFromEnv is TORTURE_SEED, if set.
func seedFromEnv(t *testing.T) (uint64, bool) {
	s := os.Getenv("TORTURE_SEED")
	if s == "" {
		return 0, false
	}
	seed, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatalf("TORTURE_SEED: %v", err)
	}
	return seed, true
}

// TestTorture runs seeded random schedules against two or three worker
// processes for the budget (TORTURE_DURATION, default 30s; at least one
// seed) and checks the limiter's promises against the record of each. It
// prints what each check judged and exempted, and fails a check that
// exempted too much (starved). TORTURE_SEED runs that seed alone.
func TestTorture(t *testing.T) {
	requireTorture(t)
	budget := defaultBudget
	if s := os.Getenv("TORTURE_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("TORTURE_DURATION: %v", err)
		}
		budget = d
	}
	only, replay := seedFromEnv(t)
	base := uint64(time.Now().UnixNano() % 1_000_000_000)
	deadline := time.Now().Add(budget)
	total := newTally()
	for i := 0; ; i++ {
		seed := base + uint64(i)
		switch {
		case replay && i > 0:
			seed = 0
		case replay:
			seed = only
		case i > 0 && time.Now().Add(schedulePhase).After(deadline):
			seed = 0
		}
		if seed == 0 {
			break
		}
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			total.add(runSeed(t, seed))
		})
	}
	summary := total.summary()
	t.Logf("torture:\n%s", summary)
	fmt.Printf("TORTURE SUMMARY:\n%s", summary)
	for _, msg := range total.starved() {
		t.Errorf("over every seed: %s", msg)
	}
}

// torture is one seed's run: its database, workers and schedule.
type torture struct {
	t     *testing.T
	seed  uint64
	sched *schedule
	url   string
	// runsDir holds the workers' run logs.
	runsDir string
	pool    *pgxpool.Pool
	client  *app.Client
	lim     *limiter.Limiter
	// slots is the workers' MaxWorkers; parks the park-after times new
	// workers pick from (scenarios set them).
	slots    int
	parks    []time.Duration
	tally    *tally
	nextWork int

	mu      sync.Mutex
	workers []*workerProc
	events  []workerEvent
	jobs    map[int64]*job
	ops     []clientOp
	samples []sample
	vs      violations
	// drainFrom is when the schedule ended and the drain's changes of
	// limits began (quiesce; the database's clock).
	drainFrom time.Time
}

// runSeed draws the seed's schedule, logs it, carries it out against two
// or three workers, and checks the record.
func runSeed(t *testing.T, seed uint64) *tally {
	s := drawSchedule(seed)
	t.Logf("schedule (replay: TORTURE_SEED=%d make torture):\n%s", seed, s)
	x := newTorture(t, seed)
	defer x.close()
	x.sched, x.slots = s, s.slots
	x.setPolicy(s.policy)
	x.startWorkers(s.parks)
	stopSampling := x.sampleAccounting()
	start := time.Now()
	ctx := context.Background()
	for _, o := range s.ops {
		time.Sleep(time.Until(start.Add(o.at)))
		x.do(ctx, o)
	}
	stopSampling()
	return x.finish(s.quiesceClear)
}

// newTorture prepares a seed's run: a fresh database with the record
// tables, River's client and a limiter for the test's own calls. No
// worker runs yet.
func newTorture(t *testing.T, seed uint64) *torture {
	requireTorture(t)
	ctx := context.Background()
	x := &torture{t: t, seed: seed, url: testdb.New(t), runsDir: t.TempDir(), jobs: map[int64]*job{}, tally: newTally(),
		slots: 16}
	x.tally.seeds = 1
	var err error
	x.pool, err = pgkit.Open(ctx, withPoolSize(x.url, testPoolSize), 10*time.Second)
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

// startWorkers starts a worker for each park-after time, at once.
func (x *torture) startWorkers(parks []time.Duration) {
	var wg sync.WaitGroup
	for _, park := range parks {
		id := x.newWorkerID()
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

// finish lifts the limits (clearAll per kind, a and b: clear them, or set
// a generous one), lets every job end, checks the record and the
// limiter's books at rest, reports what it found, and returns the tally.
func (x *torture) finish(clearAll [2]bool) *tally {
	ctx := context.Background()
	t := x.t
	x.quiesce(ctx, clearAll)
	parkAfter := time.Duration(0)
	for _, w := range x.allWorkers() {
		parkAfter = max(parkAfter, w.parkAfter)
	}
	x.mu.Lock()
	rec, err := loadRecord(ctx, x.pool, x.runsDir, x.jobs, x.ops, x.events, x.samples, parkAfter)
	x.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	rec.drainFrom = x.drainFrom
	if os.Getenv("TORTURE_DUMP") != "" {
		dump(t, rec)
	}
	res := check(rec)
	vs := res.violations
	vs.merge(&x.vs)
	x.tally.jobs, x.tally.runs = len(rec.jobs), len(rec.runs)
	for _, cs := range rec.changes {
		for _, c := range cs {
			if c.from == "running" && c.to == "pending" {
				x.tally.parkings++
			}
		}
	}
	x.tally.coverage = res.coverage
	for _, msg := range res.coverage.starved(false) {
		vs.add("starved", "%s", msg)
	}
	for k, v := range vs.count {
		x.tally.violations[k] += v
	}
	for _, v := range vs.list {
		t.Errorf("seed %d: %s", x.seed, v)
	}
	if dir := os.Getenv(failedLogsEnv); dir != "" && len(vs.list) > 0 {
		x.keepWorkerLogs(filepath.Join(dir, fmt.Sprintf("seed-%d", x.seed)))
	}
	t.Logf("seed %d: %s\n%s", x.seed, x.tally, res.coverage.table())
	if n, worst := rec.lateFetchCommits(lateFetchCommit); n > 0 {
		t.Logf("seed %d: %d fetches committed more than %s after River's statement marked their jobs running (the latest %s after): other workers saw those jobs only as a fetch in flight until then",
			x.seed, n, lateFetchCommit, worst.Round(10*time.Microsecond))
	}
	return x.tally
}

// newWorkerID names a new worker.
func (x *torture) newWorkerID() string {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.nextWork++
	return fmt.Sprintf("t%d-w%d", x.seed%10000, x.nextWork)
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

// failedLogsEnv names a directory where a seed that fails leaves its
// workers' logs, the limiter's debug trace in them (the workers log at
// debug level when it is set): a failure that does not replay can still
// be read.
const failedLogsEnv = "TORTURE_FAILED_LOGS"

// keepWorkerLogs writes every worker's log of the seed to dir, one file
// per worker.
func (x *torture) keepWorkerLogs(dir string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		x.t.Errorf("%s: %v", failedLogsEnv, err)
		return
	}
	for _, w := range x.allWorkers() {
		if err := os.WriteFile(filepath.Join(dir, w.id+".log"), []byte(w.output()), 0o644); err != nil {
			x.t.Errorf("%s: %v", failedLogsEnv, err)
			return
		}
	}
	x.t.Logf("seed %d: the workers' logs are in %s", x.seed, dir)
}

func (x *torture) allWorkers() []*workerProc {
	x.mu.Lock()
	defer x.mu.Unlock()
	return slices.Clone(x.workers)
}

// do carries out one operation of the schedule.
func (x *torture) do(ctx context.Context, o op) {
	switch o.what {
	case opBurst:
		x.burst(ctx, o)
	case opTrickle:
		x.trickle(ctx, o)
	case opLimit:
		x.changeLimits(ctx, o.kind, o.limit)
	case opClient:
		x.clientCall(ctx, o.call, o.pick)
	case opReplace:
		x.replaceWorker(ctx, o)
	}
}

// policyOn is the enqueue policy in force on kind, or nil.
func (x *torture) policyOn(kind string) *policyOp {
	if x.sched == nil || x.sched.policy == nil || x.sched.policy.kind != kind {
		return nil
	}
	return x.sched.policy
}

// setPolicy puts the seed's enqueue policy in force (nil: none).
func (x *torture) setPolicy(p *policyOp) {
	if p == nil {
		return
	}
	x.tally.ops["enqueue policy set: "+string(p.onConflict)]++
	if err := policy.NewStore(x.pool).Set(context.Background(), policy.Policy{Kind: p.kind, ByArgs: []string{"key"},
		MaxWaiting: p.maxWaiting, OnConflict: p.onConflict}); err != nil {
		x.t.Fatalf("enqueue policy: %v", err)
	}
}

// recordJobs records jobs inserted by res (args and max attempts in step)
// and committed at (the database's clock right after the insert returned).
// An insert the enqueue policy answered with a waiting job (River's
// duplicate answer) inserted nothing: a replace gave that job the new
// args, which the record then carries (the job's key, and so its line, is
// the same: the policy keys by the field the limits key by).
func (x *torture) recordJobs(res []*rivertype.JobInsertResult, jobs []plannedJob, at time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for i, r := range res {
		if r.UniqueSkippedAsDuplicate {
			waiting, ok := x.jobs[r.Job.ID]
			switch {
			case !ok:
				x.t.Errorf("the enqueue policy answered an insert with job %d, which the test never inserted", r.Job.ID)
			case x.policyOn(r.Job.Kind) == nil:
				x.t.Errorf("job %d of %s answered an insert as a duplicate, with no enqueue policy in force", r.Job.ID, r.Job.Kind)
			case x.policyOn(r.Job.Kind).onConflict == policy.Replace:
				x.tally.ops["enqueue policy: replaced"]++
				waiting.args = jobs[i].args
			default:
				x.tally.ops["enqueue policy: discarded"]++
			}
			continue
		}
		x.jobs[r.Job.ID] = &job{id: r.Job.ID, kind: r.Job.Kind, args: jobs[i].args, maxAttempts: jobs[i].maxAttempts,
			inserted: at}
	}
}

// insertOne inserts j in a transaction of its own.
func (x *torture) insertOne(ctx context.Context, j plannedJob) error {
	res, err := x.client.Insert(ctx, j.args, &river.InsertOpts{MaxAttempts: j.maxAttempts})
	if err != nil {
		return err
	}
	at, err := dbNow(ctx, x.pool)
	if err != nil {
		return err
	}
	x.recordJobs([]*rivertype.JobInsertResult{res}, []plannedJob{j}, at)
	return nil
}

// burst inserts o's jobs at once: in one InsertMany, or one insert each
// (separate transactions).
func (x *torture) burst(ctx context.Context, o op) {
	// Under an enqueue policy, one InsertMany may carry more jobs of a full
	// key than the key has waiting jobs to answer with (SLR02): its bursts
	// go in one by one.
	if o.oneByOne || x.policyOn(o.kind) != nil {
		x.tally.ops["insert one by one"]++
		for _, j := range o.jobs {
			if err := x.insertOne(ctx, j); err != nil {
				x.t.Errorf("insert: %v", err)
				return
			}
		}
		return
	}
	x.tally.ops["insert burst"]++
	params := make([]river.InsertManyParams, len(o.jobs))
	for i, j := range o.jobs {
		params[i] = river.InsertManyParams{Args: j.args, InsertOpts: &river.InsertOpts{MaxAttempts: j.maxAttempts}}
	}
	res, err := x.client.InsertMany(ctx, params)
	if err != nil {
		x.t.Errorf("insert: %v", err)
		return
	}
	at, err := dbNow(ctx, x.pool)
	if err != nil {
		x.t.Error(err)
		return
	}
	x.recordJobs(res, o.jobs, at)
}

// trickle inserts o's jobs a few ms apart.
func (x *torture) trickle(ctx context.Context, o op) {
	x.tally.ops["insert trickle"]++
	for i, j := range o.jobs {
		if err := x.insertOne(ctx, j); err != nil {
			x.t.Errorf("insert: %v", err)
			return
		}
		time.Sleep(o.gaps[i])
	}
}

// changeLimits changes a limit of kind.
func (x *torture) changeLimits(ctx context.Context, kind string, c limitOp) {
	x.tally.ops["limit: "+c.facet]++
	if err := x.setLimit(ctx, kind, c); err != nil && !errors.Is(err, limiter.ErrInvalidLimit) {
		x.t.Errorf("change limits of %s: %v", kind, err)
	}
}

// setLimit changes a limit of kind as c says.
func (x *torture) setLimit(ctx context.Context, kind string, c limitOp) error {
	var err error
	switch c.facet {
	case "per-kind", "breaker":
		err = x.lim.SetConcurrency(ctx, kind, c.n)
	case "per-key":
		err = x.lim.SetPerKey(ctx, kind, []string{"key"}, c.n)
	case "rate":
		var fields []string
		if c.rate.PerKey {
			fields = []string{"key"}
		}
		err = x.lim.SetRate(ctx, kind, c.rate, fields)
	case "clear per-kind":
		_, err = x.lim.ClearLimits(ctx, kind, limiter.Facets{Concurrency: true})
	case "clear per-key":
		_, err = x.lim.ClearLimits(ctx, kind, limiter.Facets{PerKey: true})
	case "clear rate":
		_, err = x.lim.ClearLimits(ctx, kind, limiter.Facets{Rate: true})
	default:
		_, err = x.lim.ClearLimits(ctx, kind, limiter.Facets{})
	}
	return err
}

// clientCall cancels, deletes or retries a waiting job through River's
// client: the one at pick of the torture jobs found waiting, in id order.
func (x *torture) clientCall(ctx context.Context, call string, pick float64) {
	states := []string{"pending", "available", "retryable", "scheduled"}
	if call == "cancel" {
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
	id := ids[min(int(pick*float64(len(ids))), len(ids)-1)]
	before, err := dbNow(ctx, x.pool)
	if err != nil {
		x.t.Error(err)
		return
	}
	var row *rivertype.JobRow
	switch call {
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
	x.tally.ops["River Job"+strings.ToUpper(call[:1])+call[1:]]++
	x.mu.Lock()
	defer x.mu.Unlock()
	x.ops = append(x.ops, clientOp{op: call, job: id, before: before, after: after, state: string(row.State)})
}

// replaceWorker starts a new worker, then stops (SIGTERM) or kills
// (SIGKILL) one of the others.
func (x *torture) replaceWorker(ctx context.Context, o op) {
	alive := x.alive()
	victim := alive[min(int(o.victim*float64(len(alive))), len(alive)-1)]
	x.addWorker(x.newWorkerID(), o.park)
	what := "stop"
	if o.kill {
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

// quiesce lifts the limits (clearAll, per kind a and b: clears them, or
// sets a generous one) so that every job can end, waits until every job
// has, and checks the limiter's books at rest.
func (x *torture) quiesce(ctx context.Context, clearAll [2]bool) {
	at, err := dbNow(ctx, x.pool)
	if err != nil {
		x.t.Fatal(err)
	}
	x.mu.Lock()
	x.drainFrom = at
	x.mu.Unlock()
	for i, k := range []string{"a", "b"} {
		kind := "torture." + k
		if clearAll[i] {
			if _, err := x.lim.ClearLimits(ctx, kind, limiter.Facets{}); err != nil {
				x.t.Errorf("clear %s: %v", kind, err)
			}
			continue
		}
		// The per-kind limit first: the kind never goes without a limit
		// between the two changes (which would let its line go, free, for
		// the limit to take back a moment later).
		if err := x.lim.SetConcurrency(ctx, kind, 20); err != nil {
			x.t.Errorf("limit %s: %v", kind, err)
		}
		if _, err := x.lim.ClearLimits(ctx, kind, limiter.Facets{PerKey: true, Rate: true}); err != nil {
			x.t.Errorf("clear %s: %v", kind, err)
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
	time.Sleep(restTime)
	x.checkBooks(ctx)
}

// restTime is how long after the last job ended the limiter's books must
// be at rest: every slot released, every lease given back.
const restTime = 1500 * time.Millisecond

// sampleAccounting samples, every sampleEvery while the schedule runs,
// the slots each torture kind's limit row counts (admitted: slot rows and
// leased slots) at the database's clock; the accounting check compares
// them with the executions the workers recorded. A sample that fails is a
// violation: the check must not go blind.
func (x *torture) sampleAccounting() (stop func()) {
	ctx := context.Background()
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(sampleEvery)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			s, err := readSample(ctx, x.pool)
			x.mu.Lock()
			if err != nil {
				x.vs.add("accounting", "a sample failed: %v", err)
			} else {
				x.samples = append(x.samples, s)
			}
			x.mu.Unlock()
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}
