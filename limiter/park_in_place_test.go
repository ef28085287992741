package limiter_test

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/limiter"
	"github.com/sluice-dev/sluice/maintenance"
	"github.com/sluice-dev/sluice/modules/demo"
)

// TestParkInPlaceRiverVersion pins the River version that park in place was
// checked against. Parking leaves a job in River's `pending` state, which
// River documents as "made available by some external update"; reading
// River v0.51.1 shows that none of its own services touches such a row
// (v0.51.2 changes only JobListParams.Where's merge of named arguments and
// its CLI's SQLite URLs: the diff of the two modules, riverdriver and
// riverpgxv5 included, touches none of the code below):
//
//   - the rescuer (internal/maintenance/job_rescuer.go, JobGetStuck and
//     JobRescueMany) selects and updates only `state = 'running'`;
//   - the job scheduler (job_scheduler.go, JobSchedule) moves only
//     `state IN ('retryable', 'scheduled')` to available;
//   - the cleaner (job_cleaner.go, JobDeleteBefore) deletes only cancelled,
//     completed and discarded rows;
//   - the reindexer and queue cleaner touch indexes and river_queue only;
//   - the producer fetches only `state = 'available'` (JobGetAvailable);
//   - the completer's JobSetStateIfRunningMany updates only rows still
//     `running` (or merges metadata), and its event mapping
//     (internal/jobcompleter/job_completer.go,
//     completerJobUpdatedFromStateAndReason) emits no event for a row it
//     returns as `pending` — which is how a parked job's completion comes
//     back from the trigger sluice_park_in_place, and a job's that steps
//     back (sluice_step_back makes it available after River's statement;
//     a row returned as `available` would be EventKindJobFailed).
//
// An upgrade of River must re-check these and then move the pin.
func TestParkInPlaceRiverVersion(t *testing.T) {
	t.Parallel()
	gomod, err := os.ReadFile("../go.mod")
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^\s*github\.com/riverqueue/river (v\S+)`).FindSubmatch(gomod)
	require.NotNil(t, m, "River in go.mod")
	require.Equal(t, "v0.51.2", string(m[1]),
		"River changed: re-check that no River service touches pending rows and that the completer ignores them (see this test's comment), then update the pin")
}

// TestParkInPlaceRiverClient parks jobs behind a circuit breaker and works
// River's own client calls on them, as the app that inserted them would.
func TestParkInPlaceRiverClient(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	pool := openPool(t, url)
	const kind = "riverapi"
	const fullKind = "test.probe." + kind
	jobtest.SetLimit(t, pool, fullKind, -1)
	tracker := newProbeTracker()
	client := startProbeWorker(t, url, "w", kind, tracker, 0, nil)

	// Seven jobs with every attribute set, to see that none changes.
	opts := &river.InsertOpts{
		MaxAttempts: 7,
		Metadata:    []byte(`{"app": "mine"}`),
		Priority:    3,
		Tags:        []string{"tag-one", "tag-two"},
	}
	ids := make([]int64, 7)
	for i := range ids {
		res, err := client.Insert(ctx, probeArgs{Seq: i, K: kind}, opts)
		require.NoError(t, err)
		ids[i] = res.Job.ID
	}
	// Unique by args while waiting or running (not once completed).
	uniqueOpts := &river.InsertOpts{UniqueOpts: river.UniqueOpts{
		ByArgs:  true,
		ByState: []rivertype.JobState{rivertype.JobStateAvailable, rivertype.JobStatePending, rivertype.JobStateRunning, rivertype.JobStateScheduled},
	}}
	unique, err := client.Insert(ctx, probeArgs{Seq: 100, K: kind}, uniqueOpts)
	require.NoError(t, err)
	waitParked(t, pool, append(ids, unique.Job.ID)...)

	for _, id := range ids {
		job, err := client.JobGet(ctx, id)
		require.NoError(t, err)
		require.Equal(t, rivertype.JobStatePending, job.State)
		require.Equal(t, 0, job.Attempt)
		require.Equal(t, 7, job.MaxAttempts)
		require.Equal(t, 3, job.Priority)
		require.Equal(t, []string{"tag-one", "tag-two"}, job.Tags)
		parking := parkingRecord(t, job.Metadata)
		require.Equal(t, map[string]any{"attempt": 0.0, "parks": 1.0, "reason": "breaker"},
			map[string]any{"attempt": parking["attempt"], "parks": parking["parks"], "reason": parking["reason"]},
			"the job's metadata records its parking")
		require.JSONEq(t, `{"app": "mine"}`, withoutParking(t, job.Metadata))
		require.Equal(t, river.QueueDefault, job.Queue)
		require.Empty(t, job.Errors)
	}

	// JobList lists parked jobs as pending.
	list, err := client.JobList(ctx, river.NewJobListParams().Kinds(fullKind).States(rivertype.JobStatePending).First(100))
	require.NoError(t, err)
	require.Len(t, list.Jobs, len(ids)+1)

	// A parked unique job blocks its duplicate.
	dup, err := client.Insert(ctx, probeArgs{Seq: 100, K: kind}, uniqueOpts)
	require.NoError(t, err)
	require.True(t, dup.UniqueSkippedAsDuplicate)
	require.Equal(t, unique.Job.ID, dup.Job.ID)

	// JobCancel: cancelled, its parking record gone.
	cancelled, err := client.JobCancel(ctx, ids[0])
	require.NoError(t, err)
	require.Equal(t, rivertype.JobStateCancelled, cancelled.State)
	// JobDelete and JobDeleteMany: gone, with their records.
	_, err = client.JobDelete(ctx, ids[1])
	require.NoError(t, err)
	deleted, err := client.JobDeleteMany(ctx, river.NewJobDeleteManyParams().IDs(ids[2]))
	require.NoError(t, err)
	require.Len(t, deleted.Jobs, 1)
	for _, id := range ids[:3] {
		require.Zero(t, count(t, pool, "SELECT count(*) FROM concurrency_parked_jobs WHERE job_id = $1", id))
	}
	// JobRetry: available at once; fetched, it parks again (the breaker is
	// still on) — never a second copy.
	retried, err := client.JobRetry(ctx, ids[3])
	require.NoError(t, err)
	require.Equal(t, rivertype.JobStateAvailable, retried.State)
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT count(*) FROM concurrency_parked_jobs WHERE job_id = $1", ids[3]) == 1 &&
			jobState(t, pool, ids[3]) == "pending"
	}, 30*time.Second, 10*time.Millisecond)

	// Lift the breaker: every job left runs exactly once, on its own row;
	// the cancelled and deleted ones never run.
	jobtest.SetLimit(t, pool, fullKind, 2)
	client.InsertAndWait(t, limiter.ResumeArgs{JobKind: fullKind}, nil)
	left := append([]int64{unique.Job.ID}, ids[3:]...)
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT count(*) FROM river_job WHERE id = ANY($1) AND state = 'completed'", left) == len(left)
	}, time.Minute, 20*time.Millisecond)
	_, worked := tracker.snapshot()
	require.Equal(t, map[int]int{3: 1, 4: 1, 5: 1, 6: 1, 100: 1}, worked)
	require.Equal(t, "cancelled", jobState(t, pool, ids[0]))
	require.Empty(t, jobState(t, pool, ids[1]))
	require.Empty(t, jobState(t, pool, ids[2]))
	for _, id := range left {
		job, err := client.JobGet(ctx, id)
		require.NoError(t, err)
		require.Equal(t, 1, job.Attempt, "parking is not an attempt")
		require.Len(t, job.AttemptedBy, 1)
		require.NotNil(t, job.FinalizedAt)
		require.False(t, job.FinalizedAt.Before(*job.AttemptedAt))
	}
	require.Equal(t, len(ids)+1-2, count(t, pool, "SELECT count(*) FROM river_job WHERE kind = $1", fullKind),
		"no copies: the 8 rows less the 2 deleted")
}

// TestParkInPlaceAlwaysFailing: a kind that always fails, under a limit that
// parks it over and over, is discarded after max_attempts real executions,
// with every error kept.
func TestParkInPlaceAlwaysFailing(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	pool := openPool(t, url)
	jobtest.SetLimit(t, pool, "demo.sleep", 1)
	logParkings(t, pool)
	deps, _ := jobtest.NewJobsConfig(t, pool, app.JobsConfig{ParkAfter: time.Millisecond})
	client := jobtest.Start(t, pool, deps, jobtest.Config{Configure: func(c *river.Config) {
		c.RetryPolicy = &immediateRetry{}
	}})

	const n, maxAttempts = 6, 3
	params := make([]river.InsertManyParams, n)
	for i := range params {
		params[i] = river.InsertManyParams{Args: demo.SleepArgs{MS: 20, Fail: true}, InsertOpts: &river.InsertOpts{MaxAttempts: maxAttempts}}
	}
	res, err := client.InsertMany(ctx, params)
	require.NoError(t, err)
	ids := make([]int64, n)
	for i, r := range res {
		ids[i] = r.Job.ID
	}
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT count(*) FROM river_job WHERE id = ANY($1) AND state = 'discarded'", ids) == n
	}, time.Minute, 20*time.Millisecond)
	for _, id := range ids {
		job, err := client.JobGet(ctx, id)
		require.NoError(t, err)
		require.Equal(t, maxAttempts, job.Attempt)
		require.Len(t, job.Errors, maxAttempts, "every failure kept")
		for i, e := range job.Errors {
			require.Equal(t, i+1, e.Attempt)
			require.Contains(t, e.Error, "failed as asked")
		}
	}
	require.Positive(t, parkings(t, pool, "demo.sleep"), "six jobs through one slot parked")
	require.Zero(t, count(t, pool, "SELECT count(*) FROM concurrency_parked_jobs"))
}

// TestParkInPlaceCompleterRace runs many 0 ms jobs through a small limit on
// two workers, so that jobs park, resume and run again while River's
// completer still holds the completions of earlier runs in its batches. A
// stale completion landing on a later run would show as a job finalized
// before its attempt started, a lost run, or a second attempt.
func TestParkInPlaceCompleterRace(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	const kind = "race"
	const fullKind = "test.probe." + kind
	pool, tracker, a := limitedProbes(t, kind, 2, time.Millisecond)

	const n = 600
	insertProbes(t, a, kind, 0, n, 0)
	waitAllDone(t, pool, tracker, fullKind, n, 3*time.Minute)

	require.LessOrEqual(t, tracker.max.Load(), int32(2), "the limit held")
	_, worked := tracker.snapshot()
	for seq := range n {
		require.Equal(t, 1, worked[seq], "job %d worked %d times", seq, worked[seq])
	}
	var bad int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = $1
		AND NOT (state = 'completed' AND attempt = 1 AND cardinality(attempted_by) = 1
		         AND finalized_at >= attempted_at AND cardinality(errors) = 0)`, fullKind).Scan(&bad))
	require.Zero(t, bad, "every job completed once, on its own run")
	require.Equal(t, n, count(t, pool, "SELECT count(*) FROM river_job WHERE kind = $1", fullKind), "no copies")
	require.Positive(t, parkings(t, pool, fullKind), "jobs parked along the way")
	t.Logf("%d parkings for %d jobs", parkings(t, pool, fullKind), n)
}

// TestParkInPlaceReservedSlotReleased: a slot reserved for a resumed job is
// freed when the job is cancelled, or when it is not fetched in time.
func TestParkInPlaceReservedSlotReleased(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool := testdb.NewPool(t)
	jobtest.SetLimit(t, pool, "demo.sleep", 1)
	deps, _ := jobtest.NewJobs(t, pool)
	// A client that works only the maintenance queue: the demo.sleep jobs
	// in queue "elsewhere" are never fetched.
	client := jobtest.Start(t, pool, deps, jobtest.Config{Queues: map[string]river.QueueConfig{
		maintenance.Queue: {MaxWorkers: 2},
	}})
	insert := func() *rivertype.JobRow {
		res, err := client.Insert(ctx, demo.SleepArgs{MS: 1}, &river.InsertOpts{Queue: "elsewhere"})
		require.NoError(t, err)
		return res.Job
	}
	slots := func() int { return count(t, pool, "SELECT count(*) FROM concurrency_executions") }
	admitted := func() int { return count(t, pool, "SELECT admitted FROM concurrency_limits WHERE kind = 'demo.sleep'") }

	// Cancelled before it started: the next resume run frees its slot.
	first := insert()
	res, err := deps.Limiter.ReserveSlot(ctx, first)
	require.NoError(t, err)
	require.True(t, res.Reserved)
	second := insert()
	res, err = deps.Limiter.ReserveSlot(ctx, second)
	require.NoError(t, err)
	require.False(t, res.Reserved, "the one slot is reserved")
	require.Equal(t, int32(1), res.Limit)
	require.Equal(t, int32(1), res.Taken)
	_, err = client.JobCancel(ctx, first.ID)
	require.NoError(t, err)
	// The cron's kindless run finds the kind by its reserved slot.
	client.InsertAndWait(t, limiter.ResumeArgs{}, nil)
	require.Eventually(t, func() bool { return slots() == 0 }, 10*time.Second, 10*time.Millisecond)
	require.Zero(t, admitted())

	// Not fetched within ReservedSlotTTL: freed too.
	res, err = deps.Limiter.ReserveSlot(ctx, second)
	require.NoError(t, err)
	require.True(t, res.Reserved)
	client.InsertAndWait(t, limiter.ResumeArgs{JobKind: "demo.sleep"}, nil)
	require.Equal(t, 1, slots(), "still within its time")
	_, err = pool.Exec(ctx, "UPDATE concurrency_executions SET admitted_at = now() - $1::interval", limiter.ReservedSlotTTL.String())
	require.NoError(t, err)
	client.InsertAndWait(t, limiter.ResumeArgs{JobKind: "demo.sleep"}, nil)
	require.Zero(t, slots())
	require.Zero(t, admitted())
	require.Equal(t, "available", jobState(t, pool, second.ID), "the job itself waits on, to be admitted when fetched")
}

// TestParkInPlaceRescuedWhileParking: a job marked for parking whose worker
// dies before River's completion lands is parked, not retried, when it is
// rescued: it never ran.
func TestParkInPlaceRescuedWhileParking(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool := testdb.NewPool(t)
	id := jobtest.InsertRunning(t, pool, "demo.sleep", `{"ms": 1}`, 2, 5, []string{"w1", "dead"}, `{"sluice_park": true, "app": 1}`, "running")
	_, err := pool.Exec(ctx, `INSERT INTO concurrency_parked_jobs (job_id, kind, reason, worker_id) VALUES ($1, 'demo.sleep', 'limit', 'dead')`, id)
	require.NoError(t, err)
	var errs json.RawMessage
	require.NoError(t, pool.QueryRow(ctx, `SELECT COALESCE(to_jsonb(errors), 'null') FROM river_job WHERE id = $1`, id).Scan(&errs))

	// River's rescuer (JobRescueMany) makes it retryable with an error.
	_, err = pool.Exec(ctx, `UPDATE river_job SET state = 'retryable', scheduled_at = now(),
		errors = array_append(errors, '{"error": "stuck"}'::jsonb) WHERE id = $1`, id)
	require.NoError(t, err)
	var state, metadata string
	var attempt int
	var attemptedBy []string
	var after json.RawMessage
	require.NoError(t, pool.QueryRow(ctx, `SELECT state::text, attempt, attempted_by, metadata::text, COALESCE(to_jsonb(errors), 'null') FROM river_job WHERE id = $1`, id).
		Scan(&state, &attempt, &attemptedBy, &metadata, &after))
	require.Equal(t, "pending", state)
	require.Equal(t, 1, attempt, "the parking attempt undone")
	require.Equal(t, []string{"w1"}, attemptedBy)
	require.Equal(t, 1.0, parkingRecord(t, []byte(metadata))["attempt"], "the parking recorded at the attempt undone")
	require.JSONEq(t, `{"app": 1}`, withoutParking(t, []byte(metadata)))
	require.JSONEq(t, string(errs), string(after), "no error for an attempt that never ran")
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM concurrency_parked_jobs WHERE job_id = $1", id))

	// Cancelled while parking: cancelled, never run, record gone.
	id2 := jobtest.InsertRunning(t, pool, "demo.sleep", `{"ms": 1}`, 1, 5, []string{"w1"}, `{"sluice_park": true, "cancel_attempted_at": "2026-01-01T00:00:00Z"}`, "running")
	_, err = pool.Exec(ctx, `INSERT INTO concurrency_parked_jobs (job_id, kind, reason) VALUES ($1, 'demo.sleep', 'limit')`, id2)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE river_job SET state = 'completed', finalized_at = now() WHERE id = $1`, id2)
	require.NoError(t, err)
	require.Equal(t, "cancelled", jobState(t, pool, id2))
	require.Zero(t, count(t, pool, "SELECT count(*) FROM concurrency_parked_jobs WHERE job_id = $1", id2))
	require.Zero(t, count(t, pool, "SELECT attempt FROM river_job WHERE id = $1", id2))
}

// TestAdmitLostReservation: a resumed job whose grant is freed while its
// admission waits for the kind's lock (the reservation expired) is not
// admitted on it: the admission reads the line under the lock, and decides
// the job as a new one (here: a slot is free), the kind's count equal to
// its slot rows.
func TestAdmitLostReservation(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool := testdb.NewPool(t)
	jobtest.SetLimit(t, pool, "demo.sleep", 1)
	id := jobtest.InsertRunning(t, pool, "demo.sleep", `{"ms": 1}`, 1, 5, []string{"w1"}, `{}`, "running")
	_, err := pool.Exec(ctx, `INSERT INTO concurrency_executions (job_id, kind, reserved) VALUES ($1, 'demo.sleep', true)`, id)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE concurrency_limits SET admitted = 1, has_parked = true WHERE kind = 'demo.sleep'`)
	require.NoError(t, err)

	// Another transaction holds the kind's lock and frees the reservation.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	for _, sql := range []string{
		`SELECT pg_advisory_xact_lock(hashtextextended('sluice.limit_row:demo.sleep', 0)) WHERE $1::bigint > 0`,
		`DELETE FROM concurrency_executions WHERE job_id = $1`,
		`UPDATE concurrency_limits SET admitted = 0, has_parked = false WHERE kind = 'demo.sleep' AND $1::bigint > 0`,
	} {
		_, err = tx.Exec(ctx, sql, id)
		require.NoError(t, err)
	}

	lim, err := limiter.New(limiter.Config{Pool: pool, WorkerID: "w1"})
	require.NoError(t, err)
	job := &rivertype.JobRow{ID: id, Kind: "demo.sleep", Attempt: 1, EncodedArgs: []byte(`{"ms": 1}`)}
	ran := make(chan int, 1)
	done := make(chan error, 1)
	go func() {
		done <- lim.Work(ctx, job, func(context.Context) error {
			ran <- count(t, pool, "SELECT count(*) FROM concurrency_executions WHERE job_id = $1 AND NOT reserved", id)
			return nil
		})
	}()
	// The decision waits for the kind's ledger lock (LedgerLockKinds, sent
	// with the reading of the line).
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%LedgerLockKinds%'") >= 1
	}, 10*time.Second, 5*time.Millisecond, "the decision waits for the lock")
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-done)
	require.Equal(t, 1, <-ran, "admitted as a new job, on a slot of its own")
	lim.Flush()
	require.Zero(t, count(t, pool, "SELECT count(*) FROM concurrency_executions"))
	require.Zero(t, count(t, pool, "SELECT admitted FROM concurrency_limits WHERE kind = 'demo.sleep'"))
}

// parkingRecord is metadata.sluice_parking (migration 00014), which must be
// there.
func parkingRecord(t *testing.T, metadata []byte) map[string]any {
	t.Helper()
	var md map[string]any
	require.NoError(t, json.Unmarshal(metadata, &md))
	rec, ok := md["sluice_parking"].(map[string]any)
	require.True(t, ok, "no sluice_parking in %s", metadata)
	for _, k := range []string{"first_at", "parked_at"} {
		_, err := time.Parse(time.RFC3339Nano, rec[k].(string))
		require.NoError(t, err, "sluice_parking.%s", k)
	}
	return rec
}

// withoutParking is metadata without its sluice_parking record.
func withoutParking(t *testing.T, metadata []byte) string {
	t.Helper()
	var md map[string]any
	require.NoError(t, json.Unmarshal(metadata, &md))
	delete(md, "sluice_parking")
	out, err := json.Marshal(md)
	require.NoError(t, err)
	return string(out)
}

// stepBackArgs is the job of TestStepBackEmitsNoRiverEvent.
type stepBackArgs struct{}

func (stepBackArgs) Kind() string { return "test.step_back" }

// TestStepBackEmitsNoRiverEvent: a job that steps back after River's
// executors got it (ledger.StepBack of a dispatched job: it is marked
// sluice_park "ahead", its middleware returns nil and River's completer
// completes it; trigger sluice_park_in_place makes it available again, its
// attempt undone) did not fail, and a River client subscribed to its
// events must not hear that it did: River maps a row its completer
// returns as `available` after a completion to EventKindJobFailed. Run
// through River's own client, completer and subscription: the first run
// marks its own row as the ledger does and returns nil; the second
// completes.
func TestStepBackEmitsNoRiverEvent(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	pool := openPool(t, url)
	runs := make(chan int, 10)
	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(func(ctx context.Context, job *river.Job[stepBackArgs]) error {
		runs <- job.Attempt
		if job.Attempt == 1 && !metadataHas(job.Metadata, "stepped") {
			_, err := pool.Exec(ctx, `UPDATE river_job SET metadata = metadata || '{"sluice_park": "ahead", "stepped": true}' WHERE id = $1`, job.ID)
			return err
		}
		return nil
	}))
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 2}},
		Schema:            pgkit.SchemasOf(pool).River,
		FetchCooldown:     5 * time.Millisecond,
		FetchPollInterval: 20 * time.Millisecond,
		TestOnly:          true,
		Workers:           workers,
	})
	require.NoError(t, err)
	events, cancel := client.Subscribe(river.EventKindJobCompleted, river.EventKindJobFailed,
		river.EventKindJobSnoozed, river.EventKindJobCancelled)
	defer cancel()
	require.NoError(t, client.Start(ctx))
	t.Cleanup(func() { _ = client.Stop(context.Background()) })

	res, err := client.Insert(ctx, stepBackArgs{}, nil)
	require.NoError(t, err)
	select {
	case ev := <-events:
		require.Equal(t, river.EventKindJobCompleted, ev.Kind, "the step back is no event; the job's one real run completes it")
		require.Equal(t, res.Job.ID, ev.Job.ID)
		require.Equal(t, 1, ev.Job.Attempt, "the step back undid its attempt")
		require.Empty(t, ev.Job.Errors)
	case <-time.After(30 * time.Second):
		t.Fatal("the job did not complete")
	}
	require.Equal(t, []int{1, 1}, []int{<-runs, <-runs}, "run twice, the first attempt undone")
	select {
	case ev := <-events:
		t.Fatalf("a second event: %s", ev.Kind)
	case <-time.After(100 * time.Millisecond):
	}
}

func metadataHas(metadata []byte, key string) bool {
	var m map[string]any
	return json.Unmarshal(metadata, &m) == nil && m[key] != nil
}
