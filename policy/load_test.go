package policy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/policy"
)

// The load: inserters on hot keys of two kinds, one under replace, one
// under debounce, each with max_waiting 1 per key.
const (
	loadInserters = 32
	loadKeys      = 10
	loadRollback  = 0.10
	loadDebounce  = 20 * time.Millisecond
	loadMaxDelay  = 150 * time.Millisecond
	// loadTolerance is how late past first-waiting + max delay a debounced
	// job may start: the workers' fetch poll (100ms) and the load on two
	// shared cores.
	loadTolerance = time.Second
)

// enqueue is one committed enqueue: its key, sequence number, and when it
// held its key's lock (a database clock read in its transaction after the
// insert: the order of the key's commits).
type enqueue struct {
	kind, key string
	seq       int64
	at        time.Time
	river     bool
	// answered: the insert did not add a job (River's duplicate answer, or
	// INSERT 0 0).
	answered bool
}

// TestPropertyUnderLoad inserts from 32 goroutines on 10 hot keys of a
// replace kind and a debounce kind, through River's client and plain SQL,
// rolling 10% of the transactions back, while two worker processes work
// the 2 ms jobs and one of them is killed with SIGKILL midway. Then it
// checks: waiting per key never above the cap (sampled all along); the
// outcomes add up to the calls committed; the last job to run for a key
// carries the last enqueue's args and no run carries a rolled-back
// enqueue's; no enqueue runs twice; no job's args change while it runs; no
// debounced job starts later than first-waiting + max delay + tolerance.
// POLICY_LOAD_DURATION (a Go duration) sets how long it inserts (default
// 8s).
func TestPropertyUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("load test")
	}
	duration := 8 * time.Second
	if s := os.Getenv("POLICY_LOAD_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		require.NoError(t, err)
		duration = d
	}
	ctx := context.Background()
	url := testdb.New(t)
	pool, err := pgkit.Open(ctx, withConns(url, 16), 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store := policy.NewStore(pool)
	require.NoError(t, store.Set(ctx, policy.Policy{Kind: "policy.load.replace", ByArgs: []string{"key"}, MaxWaiting: 1, OnConflict: policy.Replace}))
	require.NoError(t, store.Set(ctx, policy.Policy{Kind: "policy.load.debounce", ByArgs: []string{"key"}, MaxWaiting: 1,
		OnConflict: policy.Debounce, Debounce: loadDebounce, MaxDelay: loadMaxDelay}))
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	require.NoError(t, err)

	runs := t.TempDir()
	w1 := startLoadWorker(t, url, runs, "load-1")
	w2 := startLoadWorker(t, url, runs, "load-2")
	t.Cleanup(func() { w1.kill(); w2.kill() })

	// Sample the waiting jobs per key all along.
	var maxFresh, maxAll atomic.Int64
	sampleCtx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for sampleCtx.Err() == nil {
			var fresh, all int64
			err := pool.QueryRow(sampleCtx, `
				SELECT COALESCE(max(fresh), 0), COALESCE(max(n), 0) FROM (
					SELECT count(*) FILTER (WHERE attempt = 0) AS fresh, count(*) AS n FROM river_job
					WHERE kind LIKE 'policy.load.%' AND state IN ('available', 'scheduled', 'retryable', 'pending')
					GROUP BY kind, args->>'key') s`).Scan(&fresh, &all)
			if err == nil {
				maxFresh.Store(max(maxFresh.Load(), fresh))
				maxAll.Store(max(maxAll.Load(), all))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()

	var (
		seq       atomic.Int64
		mu        sync.Mutex
		committed []enqueue
		rolled    = map[int64]bool{}
		calls     atomic.Int64
	)
	deadline := time.Now().Add(duration)
	killAt := time.Now().Add(duration / 2)
	var killed atomic.Bool
	var wg sync.WaitGroup
	for g := range loadInserters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 37))
			for time.Now().Before(deadline) {
				if g == 0 && time.Now().After(killAt) && killed.CompareAndSwap(false, true) {
					w1.kill()
				}
				e := enqueue{kind: "replace", key: fmt.Sprintf("k%d", rng.IntN(loadKeys)), seq: seq.Add(1), river: rng.IntN(2) == 0}
				if rng.IntN(2) == 0 {
					e.kind = "debounce"
				}
				rollback := rng.Float64() < loadRollback
				if err := enqueueOnce(ctx, pool, client, &e, rollback); err != nil {
					t.Errorf("enqueue %d: %v", e.seq, err)
					return
				}
				calls.Add(1)
				mu.Lock()
				if rollback {
					rolled[e.seq] = true
				} else {
					committed = append(committed, e)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	require.True(t, killed.Load())

	// Every job ends.
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind LIKE 'policy.load.%' AND finalized_at IS NULL`).Scan(&n))
		return n == 0
	}, 60*time.Second, 100*time.Millisecond, "jobs left unfinished")
	stopSampling()
	<-sampled
	w2.stop(t)

	lines := readLoadRuns(t, runs)
	t.Logf("%d enqueue calls (%d committed, %d rolled back) in %s; %d executions; waiting per key at most %d (never-run jobs) / %d (with jobs back from a killed worker)",
		calls.Load(), len(committed), len(rolled), duration, len(lines), maxFresh.Load(), maxAll.Load())

	// 1. The cap: waiting jobs per key never above 1 (a job back from its
	// killed worker's run is the README's stated exception).
	require.LessOrEqual(t, maxFresh.Load(), int64(1), "waiting per key above max_waiting")

	// 2. The outcomes add up to the calls committed.
	var inserted, replacedN, debouncedN, jobs int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT COALESCE(sum(inserted), 0), COALESCE(sum(replaced), 0), COALESCE(sum(debounced), 0)
		FROM enqueue_policy_counts WHERE kind LIKE 'policy.load.%'`).Scan(&inserted, &replacedN, &debouncedN))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind LIKE 'policy.load.%'`).Scan(&jobs))
	var answered int64
	for _, e := range committed {
		if e.answered {
			answered++
		}
	}
	require.Equal(t, int64(len(committed)), inserted+replacedN+debouncedN, "outcomes counted vs calls committed")
	require.Equal(t, jobs, inserted, "jobs in river_job vs inserts counted")
	require.Equal(t, answered, replacedN+debouncedN, "answered calls vs replaces and debounces counted")

	// Runs by job, and the final rows.
	type runRec struct {
		start, end loadLine
		ended      bool
	}
	byRun := map[string]*runRec{}
	for _, l := range lines {
		id := fmt.Sprintf("%s/%d", l.Worker, l.Run)
		r := byRun[id]
		if r == nil {
			r = &runRec{}
			byRun[id] = r
		}
		if l.End {
			r.end, r.ended = l, true
		} else {
			r.start = l
		}
	}
	runsOfSeq := map[int64]int{}     // completed runs on the worker left alive
	killedRuns := map[int64]int{}    // completed runs on the killed worker
	lastRun := map[string]loadLine{} // by kind/key: the latest start
	for id, r := range byRun {
		require.NotZero(t, r.start.Job, "run %s has an end and no start", id)
		if r.ended {
			// 4. No job's args change while it runs.
			require.Equal(t, r.start.Hash, r.end.Hash, "job %d's args changed while it ran", r.start.Job)
			if r.start.Worker == "load-1" {
				killedRuns[r.start.Seq]++
			} else {
				runsOfSeq[r.start.Seq]++
			}
		}
		// 3b. No run carries a rolled-back enqueue's args.
		require.False(t, rolled[r.start.Seq], "job %d ran with the args of rolled-back enqueue %d", r.start.Job, r.start.Seq)
	}
	// The enqueues the killed worker ran (ended or cut short): rescued,
	// their jobs may run them again late, on the other worker. A rescued
	// job that waits again (retryable) takes later enqueues' args by
	// replace, and its run with those counts.
	onKilled := map[int64]bool{}
	for _, r := range byRun {
		if r.start.Worker == "load-1" {
			onKilled[r.start.Seq] = true
		}
	}
	for _, r := range byRun {
		k := r.start.Kind + "/" + r.start.Key
		if r.start.Worker != "load-1" && !onKilled[r.start.Seq] && r.start.At > lastRun[k].At {
			lastRun[k] = r.start
		}
	}
	// 3c. No enqueue runs twice to completion, but for River's
	// at-least-once: a run the killed worker finished but had not recorded
	// as completed is rescued and runs again on the other.
	again := 0
	for s, n := range runsOfSeq {
		require.LessOrEqual(t, n, 1, "enqueue %d ran %d times", s, n)
		require.LessOrEqual(t, killedRuns[s], 1, "enqueue %d ran %d times on the killed worker", s, killedRuns[s])
		if n+killedRuns[s] > 1 {
			again++
		}
	}
	t.Logf("%d enqueues ran again after their run on the killed worker (finished, not yet recorded as completed)", again)
	// 3a. The last job to run for a key carries the last enqueue's args
	// (the enqueues go on after the kill: the last job of a key never ran
	// on the killed worker).
	last := map[string]enqueue{}
	for _, e := range committed {
		k := "policy.load." + e.kind + "/" + e.key
		if e.at.After(last[k].at) {
			last[k] = e
		}
	}
	for k, e := range last {
		require.Equal(t, e.seq, lastRun[k].Seq, "%s: the last run carries enqueue %d, the last committed is %d", k, lastRun[k].Seq, e.seq)
	}

	// 5. No debounced job starts later than first-waiting + max delay +
	// tolerance (but a job the killed worker fetched: it waits for the
	// rescue, whether it ran there or not).
	rows, err := pool.Query(ctx, `SELECT id, (metadata->'sluice_policy'->>'first_waiting_at')::timestamptz FROM river_job
		WHERE kind = 'policy.load.debounce' AND NOT COALESCE('load-1' = ANY(attempted_by), false)`)
	require.NoError(t, err)
	firstWaiting := map[int64]time.Time{}
	for rows.Next() {
		var id int64
		var at time.Time
		require.NoError(t, rows.Scan(&id, &at))
		firstWaiting[id] = at
	}
	require.NoError(t, rows.Err())
	var worst time.Duration
	starts := map[int64]int64{}
	for _, r := range byRun {
		if r.start.Kind != "policy.load.debounce" {
			continue
		}
		if prev, ok := starts[r.start.Job]; !ok || r.start.At < prev {
			starts[r.start.Job] = r.start.At
		}
	}
	for id, at := range starts {
		first, ok := firstWaiting[id]
		if !ok {
			continue // fetched by the killed worker
		}
		late := time.Unix(0, at).Sub(first.Add(loadMaxDelay))
		worst = max(worst, late)
		require.LessOrEqual(t, late, loadTolerance, "debounced job %d started %s past first-waiting + max delay", id, late)
	}
	t.Logf("debounced jobs: %d; the latest started %s past first-waiting + max delay (tolerance %s)", len(starts), worst, loadTolerance)
}

// enqueueOnce inserts e in a transaction, through River's client or plain
// SQL, reads the database clock while the key's lock is held, and commits
// or rolls back.
func enqueueOnce(ctx context.Context, pool *pgxpool.Pool, client *river.Client[pgx.Tx], e *enqueue, rollback bool) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	args := loadArgs{K: e.kind, Key: e.key, Seq: e.seq}
	if e.river {
		res, err := client.InsertTx(ctx, tx, args, nil)
		if err != nil {
			return err
		}
		e.answered = res.UniqueSkippedAsDuplicate
	} else {
		b, _ := json.Marshal(args)
		tag, err := tx.Exec(ctx, `INSERT INTO river_job (kind, args, max_attempts) VALUES ($1, $2, 25)`, args.Kind(), b)
		if err != nil {
			return err
		}
		e.answered = tag.RowsAffected() == 0
	}
	if err := tx.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&e.at); err != nil {
		return err
	}
	if rollback {
		return tx.Rollback(ctx)
	}
	return tx.Commit(ctx)
}

// loadWorker is a load worker process.
type loadWorker struct {
	cmd  *exec.Cmd
	done chan struct{}
	out  strings.Builder
	mu   sync.Mutex
	once sync.Once
}

func startLoadWorker(t *testing.T, url, runs, id string) *loadWorker {
	t.Helper()
	w := &loadWorker{done: make(chan struct{})}
	w.cmd = exec.Command(os.Args[0], "-test.run=^$")
	w.cmd.Env = append(os.Environ(), loadWorkerEnv+"="+id, "DATABASE_URL="+withConns(url, 8),
		loadRunLogEnv+"="+filepath.Join(runs, id+".runs"))
	w.cmd.Stderr = &lockedBuilder{mu: &w.mu, b: &w.out}
	stdout, err := w.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, w.cmd.Start())
	started := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.Contains(sc.Text(), loadStartedMsg) {
				w.once.Do(func() { close(started) })
			}
		}
	}()
	go func() { _ = w.cmd.Wait(); close(w.done) }()
	select {
	case <-started:
	case <-w.done:
		t.Fatalf("load worker %s exited at start:\n%s", id, w.output())
	case <-time.After(30 * time.Second):
		_ = w.cmd.Process.Kill()
		t.Fatalf("load worker %s did not start:\n%s", id, w.output())
	}
	return w
}

func (w *loadWorker) output() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.out.String()
}

// kill kills the worker with SIGKILL and waits until it is gone.
func (w *loadWorker) kill() {
	_ = w.cmd.Process.Kill()
	<-w.done
}

// stop stops the worker with SIGTERM and waits for it.
func (w *loadWorker) stop(t *testing.T) {
	_ = w.cmd.Process.Signal(os.Interrupt)
	select {
	case <-w.done:
	case <-time.After(20 * time.Second):
		w.kill()
		t.Errorf("load worker did not stop:\n%s", w.output())
	}
}

type lockedBuilder struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func readLoadRuns(t *testing.T, dir string) []loadLine {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.runs"))
	require.NoError(t, err)
	sort.Strings(files)
	var out []loadLine
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if line == "" {
				continue
			}
			var l loadLine
			if err := json.Unmarshal([]byte(line), &l); err != nil {
				continue // a line cut by SIGKILL
			}
			out = append(out, l)
		}
	}
	return out
}

func withConns(url string, n int) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return fmt.Sprintf("%s%spool_max_conns=%d", url, sep, n)
}
