package cli

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/pgcluster"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/proc"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/modules/demo"
)

// Short liveness settings so that the tests are quick: a worker is dead
// 1s after its last heartbeat.
var livenessArgs = []string{"--heartbeat-interval", "200ms", "--dead-after", "1s", "--fetch-poll-interval", "200ms"}

func livePool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgkit.Open(context.Background(), url, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func qInt(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// insertTagged inserts n demo.sleep jobs of ms milliseconds, each tagged
// with its own logical name (tag-0 …), which parking and resuming keep.
func insertTagged(t *testing.T, pool *pgxpool.Pool, tag string, n, ms int) {
	t.Helper()
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: pgkit.SchemasOf(pool).River})
	require.NoError(t, err)
	params := make([]river.InsertManyParams, n)
	for i := range params {
		params[i] = river.InsertManyParams{
			Args:       demo.SleepArgs{MS: int64(ms)},
			InsertOpts: &river.InsertOpts{Tags: []string{fmt.Sprintf("%s-%d", tag, i)}, MaxAttempts: 10},
		}
	}
	_, err = client.InsertMany(context.Background(), params)
	require.NoError(t, err)
}

// workedOnce reports whether every logical job tag-0 … tag-(n-1) has
// finished, each with exactly one completion that is not a parking (a
// parked job is completed and comes back as a new job with the same tag).
func workedOnce(t *testing.T, pool *pgxpool.Pool, tag string, n int) bool {
	t.Helper()
	unfinished := qInt(t, pool, `SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND finalized_at IS NULL`) +
		qInt(t, pool, `SELECT count(*) FROM concurrency_parked_jobs`)
	if unfinished > 0 {
		return false
	}
	completions := qInt(t, pool, `
		SELECT count(*) FROM (
			SELECT t.tag, count(*) FILTER (WHERE j.state = 'completed') AS worked
			FROM river_job j, unnest(j.tags) AS t(tag)
			WHERE j.kind = 'demo.sleep' AND t.tag LIKE $1 || '-%'
			GROUP BY t.tag) AS per_tag
		WHERE worked = 1`, tag)
	return completions == n
}

// requireSlotCountsConsistent checks that concurrency_limits' counts equal
// the rows they count, and that no kind with parked jobs is flagged as
// having none (the flag may lag the other way: a cancelled parked job's
// record goes without the limit row's lock).
func requireSlotCountsConsistent(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	require.Equal(t, 0, qInt(t, pool, `
		SELECT count(*) FROM concurrency_limits l
		WHERE l.admitted <> (SELECT count(*) FROM concurrency_executions e WHERE e.kind = l.kind)
		                   + (SELECT COALESCE(sum(cl.slots), 0) FROM concurrency_leases cl WHERE cl.kind = l.kind)
		   OR (NOT l.has_parked AND EXISTS (SELECT 1 FROM concurrency_parked_jobs p WHERE p.kind = l.kind))`))
}

// installAudit records, in test_audit, every change of a River job's state
// and every deletion of a worker row, with the worker of the session that
// made it (its sluice.worker_id) and the time.
func installAudit(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
		CREATE TABLE test_audit (
			seq bigserial PRIMARY KEY,
			at timestamptz NOT NULL DEFAULT clock_timestamp(),
			job_id bigint, old_state text, new_state text, attempt int, owner text,
			deleted_worker text,
			by_worker text DEFAULT current_setting('sluice.worker_id', true));
		CREATE FUNCTION test_audit_job() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO test_audit (job_id, old_state, new_state, attempt, owner)
			VALUES (NEW.id, OLD.state, NEW.state, NEW.attempt, NEW.attempted_by[array_upper(NEW.attempted_by, 1)]);
			RETURN NULL;
		END $$;
		CREATE TRIGGER test_audit_job AFTER UPDATE OF state ON river_job
			FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION test_audit_job();
		CREATE FUNCTION test_audit_worker() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO test_audit (deleted_worker) VALUES (OLD.id);
			RETURN NULL;
		END $$;
		CREATE TRIGGER test_audit_worker AFTER DELETE ON sluice_workers
			FOR EACH ROW EXECUTE FUNCTION test_audit_worker();`)
	require.NoError(t, err)
}

// requireNoOverlap checks, from test_audit, that no logical job (tag) was
// running twice at once: the running spans of its River jobs (from the
// change to running until the change away from it) do not overlap.
func requireNoOverlap(t *testing.T, pool *pgxpool.Pool, tag string) {
	t.Helper()
	overlaps := qInt(t, pool, `
		WITH spans AS (
			SELECT a.job_id, a.seq, a.at AS started,
			       (SELECT min(b.at) FROM test_audit b
			        WHERE b.job_id = a.job_id AND b.seq > a.seq AND b.old_state = 'running') AS ended
			FROM test_audit a WHERE a.new_state = 'running'
		), tagged AS (
			SELECT s.*, t.tag FROM spans s JOIN river_job j ON j.id = s.job_id, unnest(j.tags) AS t(tag)
			WHERE t.tag LIKE $1 || '-%'
		)
		SELECT count(*) FROM tagged x JOIN tagged y
		  ON x.tag = y.tag AND (x.job_id, x.seq) < (y.job_id, y.seq)
		 AND x.started < COALESCE(y.ended, 'infinity') AND y.started < COALESCE(x.ended, 'infinity')`, tag)
	require.Zero(t, overlaps, "a logical job ran twice at the same time")
}

// TestLivenessKill9: kill -9 a worker that runs concurrency-limited jobs
// (others parked) and a maintenance run (held on a row lock). Another
// worker's reaper declares it dead: its jobs are rescued with "worker <id>
// lost", its slots freed and the parked jobs resumed into them, its
// maintenance run failed, its backends (one still waiting on the row lock)
// terminated and the maintenance lock free; in the end every job completed
// exactly once and the maintenance kind runs again.
func TestLivenessKill9(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.New(t)
	pool := livePool(t, url)
	res := proc.Run(t, url, nil, "limits", "set", "demo.sleep", "2")
	require.Equal(t, 0, res.Code, res.Stderr)
	var build int64
	require.NoError(t, pool.QueryRow(ctx, `
		INSERT INTO ci_builds (project_id, status, created_at, updated_at)
		VALUES (1, 'canceling', now() - interval '2 hours', now() - interval '2 hours') RETURNING id`).Scan(&build))
	// Hold the build: the maintenance run blocks on it, holding its lock.
	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, `SELECT 1 FROM ci_builds WHERE id = $1 FOR UPDATE`, build)
	require.NoError(t, err)

	a := proc.StartWorker(t, url, "victim", livenessArgs...)
	const n = 6
	insertTagged(t, pool, "k9", n, 2000)
	res = proc.Run(t, url, nil, "enqueue", "ci.drop_canceling_builds")
	require.Equal(t, 0, res.Code, res.Stderr)
	require.Eventually(t, func() bool {
		return qInt(t, pool, `SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND state = 'running' AND attempted_by[1] = 'victim'`) == 2 &&
			qInt(t, pool, `SELECT count(*) FROM concurrency_parked_jobs`) == n-2 &&
			qInt(t, pool, `SELECT count(*) FROM maintenance_runs WHERE worker_id = 'victim' AND status = 'running'`) == 1 &&
			qInt(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'sluice worker victim' AND wait_event_type = 'Lock'`) == 1
	}, 60*time.Second, 20*time.Millisecond, "the victim runs 2 limited jobs and a blocked maintenance run")
	lockHeld := func() bool {
		return qInt(t, pool, `
			SELECT count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND granted AND objsubid = 1
			  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			  AND ((classid::bigint << 32) | objid::bigint) = hashtextextended('ci.drop_canceling_builds', 0)`) > 0
	}
	require.True(t, lockHeld())

	b := proc.StartWorker(t, url, "rescuer", livenessArgs...)
	a.Kill(t)
	killed := time.Now()
	require.Eventually(t, func() bool {
		return qInt(t, pool, `SELECT count(*) FROM sluice_workers WHERE id = 'victim'`) == 0
	}, 60*time.Second, 10*time.Millisecond, "the rescuer reaps the victim")
	t.Logf("victim reaped %s after kill -9 (dead-after 1s, heartbeat 200ms)", time.Since(killed).Round(time.Millisecond))

	// Right after the reap: jobs rescued, slots free (parked jobs resumed
	// into them), maintenance run failed, backends gone, lock free.
	require.Equal(t, 3, qInt(t, pool, `
		SELECT count(*) FROM river_job
		WHERE attempted_by[1] = 'victim' AND errors[array_upper(errors, 1)]->>'error' = 'worker victim lost'
		  AND state IN ('retryable', 'available', 'running', 'completed')`), "2 limited jobs and the maintenance job")
	require.Equal(t, 0, qInt(t, pool, `SELECT count(*) FROM concurrency_executions WHERE worker_id = 'victim'`))
	require.Equal(t, 0, qInt(t, pool, `SELECT count(*) FROM concurrency_leases WHERE worker_id = 'victim'`))
	// Failed by the reaper ("worker victim lost") or, if a run of the kind
	// (say its hourly schedule) took the freed lock first, by that run
	// ("abandoned").
	require.Equal(t, 1, qInt(t, pool, `
		SELECT count(*) FROM maintenance_runs WHERE worker_id = 'victim' AND status = 'failed'
		  AND (details->>'error' = 'worker victim lost' OR details->>'error' LIKE 'abandoned%')`))
	// The backend the reaper terminated is gone; idle ones of the killed
	// process go when they notice their client's end (at once, or a moment
	// later on a loaded machine).
	require.Eventually(t, func() bool {
		return qInt(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'sluice worker victim'`) == 0
	}, 10*time.Second, 10*time.Millisecond, "the victim's backends are gone")
	// The victim's lock is gone with its backends; the rescued maintenance
	// job may already run again on the rescuer, holding the lock anew.
	rows, err := pool.Query(ctx, `
		SELECT format('pid %s, application_name %L, backend_start %s, state %s, query %L', a.pid, a.application_name,
		              a.backend_start, a.state, left(a.query, 200))
		FROM pg_locks l JOIN pg_stat_activity a USING (pid)
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
		  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND ((l.classid::bigint << 32) | l.objid::bigint) = hashtextextended('ci.drop_canceling_builds', 0)
		  AND a.application_name <> 'sluice worker rescuer'`)
	require.NoError(t, err)
	holders, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Empty(t, holders, "the victim's maintenance lock is free (its holders other than the rescuer)")
	require.LessOrEqual(t, qInt(t, pool, `SELECT (SELECT count(*) FROM concurrency_executions WHERE kind = 'demo.sleep') + (SELECT COALESCE(sum(slots), 0) FROM concurrency_leases WHERE kind = 'demo.sleep')`), 2)
	requireSlotCountsConsistent(t, pool)
	require.Eventually(t, func() bool {
		return qInt(t, pool, `SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND state = 'running' AND attempted_by[1] = 'rescuer'`) > 0
	}, 60*time.Second, 20*time.Millisecond, "parked jobs proceed on the rescuer")
	// The worker's log is read from its output as it comes: the line may
	// trail the reap it tells of.
	require.Eventually(t, func() bool { return strings.Contains(b.Log(), "reaped dead worker") },
		10*time.Second, 10*time.Millisecond, "the reap is logged")

	require.NoError(t, holder.Rollback(ctx))
	require.Eventually(t, func() bool {
		require.LessOrEqual(t, qInt(t, pool, `SELECT (SELECT count(*) FROM concurrency_executions WHERE kind = 'demo.sleep') + (SELECT COALESCE(sum(slots), 0) FROM concurrency_leases WHERE kind = 'demo.sleep')`), 2)
		return workedOnce(t, pool, "k9", n)
	}, 120*time.Second, 50*time.Millisecond, "every job completes exactly once")
	require.Eventually(t, func() bool {
		return qInt(t, pool, `SELECT count(*) FROM maintenance_runs WHERE worker_id = 'rescuer' AND status = 'succeeded' AND affected = 1`) == 1
	}, 120*time.Second, 50*time.Millisecond, "the rescued maintenance job runs again and drops the build")
	requireSlotCountsConsistent(t, pool)
	require.Eventually(t, func() bool {
		return qInt(t, pool, `SELECT admitted + (SELECT count(*) FROM concurrency_parked_jobs)::int FROM concurrency_limits WHERE kind = 'demo.sleep'`) == 0
	}, 10*time.Second, 20*time.Millisecond, "idle leased slots go back, nothing parked")
}

// TestLivenessSIGSTOP: a worker paused past dead-after is reaped (health
// reports it dead until then); its jobs run again on another worker; when
// it is resumed it finds itself reaped and exits 3, and nothing it does
// afterwards reaches the database: no River job changes state by its
// sessions after its reap, no logical job runs twice at once, every job
// completes exactly once, and the jobs rescued from it are completed by the
// worker that re-ran them.
func TestLivenessSIGSTOP(t *testing.T) {
	t.Parallel()
	url := testdb.New(t)
	pool := livePool(t, url)
	installAudit(t, pool)
	res := proc.Run(t, url, nil, "limits", "set", "demo.sleep", "3")
	require.Equal(t, 0, res.Code, res.Stderr)

	a := proc.StartWorker(t, url, "sleeper", livenessArgs...)
	const n = 5
	insertTagged(t, pool, "ss", n, 5000)
	require.Eventually(t, func() bool {
		return qInt(t, pool, `SELECT count(*) FROM river_job WHERE state = 'running' AND attempted_by[1] = 'sleeper'`) == 3 &&
			qInt(t, pool, `SELECT count(*) FROM concurrency_parked_jobs`) == n-3
	}, 60*time.Second, 20*time.Millisecond)

	a.Signal(t, syscall.SIGSTOP)
	require.Eventually(t, func() bool {
		return qInt(t, pool, `SELECT count(*) FROM sluice_worker_status WHERE id = 'sleeper' AND dead AND status = 'dead' AND running_jobs = 3`) == 1
	}, 60*time.Second, 20*time.Millisecond)
	health := proc.Run(t, url, nil, "health")
	require.Equal(t, 2, health.Code, "no live worker: CRITICAL\n%s", health.Stdout)
	require.Regexp(t, `(?m)^dead_workers\s+WARNING\s+1 dead, not reaped yet`, health.Stdout)
	require.Regexp(t, `(?m)^worker sleeper dead: heartbeat \S+s ago \(dead after 1s\), 3 running jobs`, health.Stdout)

	b := proc.StartWorker(t, url, "other", livenessArgs...)
	require.Eventually(t, func() bool {
		return qInt(t, pool, `SELECT count(*) FROM sluice_workers WHERE id = 'sleeper'`) == 0
	}, 60*time.Second, 10*time.Millisecond)
	require.Equal(t, 3, qInt(t, pool, `SELECT count(*) FROM river_job WHERE errors[1]->>'error' = 'worker sleeper lost'`))
	// Resume it while the rescued jobs run again on the other worker.
	require.Eventually(t, func() bool {
		return qInt(t, pool, `SELECT count(*) FROM river_job WHERE state = 'running' AND attempted_by = '{sleeper,other}'`) > 0
	}, 90*time.Second, 20*time.Millisecond, "a rescued job runs its second attempt on the other worker")
	a.Signal(t, syscall.SIGCONT)
	require.Equal(t, app.ExitReaped, a.Wait(t, 60*time.Second), "a reaped worker exits 3")
	require.Contains(t, a.Log(), "worker reaped: another worker declared it dead")

	require.Eventually(t, func() bool { return workedOnce(t, pool, "ss", n) }, 120*time.Second, 50*time.Millisecond,
		"every job completes exactly once")
	require.Zero(t, qInt(t, pool, `
		SELECT count(*) FROM test_audit
		WHERE by_worker = 'sleeper'
		  AND seq > (SELECT seq FROM test_audit WHERE deleted_worker = 'sleeper')`),
		"nothing the resumed worker did changed a job")
	require.Zero(t, qInt(t, pool, `
		SELECT count(*) FROM river_job
		WHERE attempted_by[1] = 'sleeper' AND errors[1]->>'error' = 'worker sleeper lost'
		  AND NOT (state = 'completed' AND attempted_by[array_upper(attempted_by, 1)] = 'other')`),
		"each rescued job was finished by the worker that re-ran it")
	requireNoOverlap(t, pool, "ss")
	requireSlotCountsConsistent(t, pool)
	require.False(t, b.Exited())
	// The worker's log is read from its output as it comes: the line may
	// trail the reap it tells of.
	require.Eventually(t, func() bool { return strings.Contains(b.Log(), "reaped dead worker") },
		10*time.Second, 10*time.Millisecond, "the reap is logged")
}

// TestLivenessCleanShutdown: a worker stopped with SIGTERM finishes its
// jobs and deletes its row: nothing is left to rescue, and the other
// worker's reaper does nothing.
func TestLivenessCleanShutdown(t *testing.T) {
	t.Parallel()
	url := testdb.New(t)
	pool := livePool(t, url)
	a := proc.StartWorker(t, url, "leaving", livenessArgs...)
	insertTagged(t, pool, "cs", 4, 1500)
	require.Eventually(t, func() bool {
		return qInt(t, pool, `SELECT count(*) FROM river_job WHERE state = 'running' AND attempted_by[1] = 'leaving'`) > 0
	}, 60*time.Second, 20*time.Millisecond)
	// The other worker starts once the leaving one has jobs in hand.
	b := proc.StartWorker(t, url, "staying", livenessArgs...)
	a.Signal(t, syscall.SIGTERM)
	require.Equal(t, 0, a.Wait(t, 60*time.Second))
	require.Equal(t, 0, qInt(t, pool, `SELECT count(*) FROM sluice_workers WHERE id = 'leaving'`))
	require.Equal(t, 0, qInt(t, pool, `SELECT count(*) FROM river_job WHERE state = 'running' AND attempted_by[1] = 'leaving'`))
	time.Sleep(2 * time.Second) // several dead-afters' worth of reaper passes
	require.Eventually(t, func() bool { return workedOnce(t, pool, "cs", 4) }, 60*time.Second, 50*time.Millisecond)
	require.Equal(t, 0, qInt(t, pool, `SELECT count(*) FROM river_job WHERE cardinality(errors) > 0`))
	require.NotContains(t, b.Log(), "reaped dead worker")
	health := proc.Run(t, url, nil, "health")
	require.Regexp(t, `(?m)^dead_workers\s+OK\s+none`, health.Stdout)
	require.Regexp(t, `(?m)^worker staying live: `, health.Stdout)
}

// TestLivenessPostgresRestart: a Postgres outage longer than dead-after
// does not make the workers reap each other: every heartbeat is stale when
// the server comes back, but a reaper acts only after its own worker has
// heartbeated for dead-after again, by which time the others have too.
func TestLivenessPostgresRestart(t *testing.T) {
	t.Parallel()
	cluster := pgcluster.New(t)
	url := cluster.URL("postgres")
	res := proc.Run(t, url, nil, "migrate", "up")
	require.Equal(t, 0, res.Code, res.Stderr)
	a := proc.StartWorker(t, url, "one", livenessArgs...)
	b := proc.StartWorker(t, url, "two", livenessArgs...)
	// check has the workers run 4 new jobs at once and returns how many
	// worker rows there are.
	check := func() (rows int) {
		pool := livePool(t, url)
		tag := fmt.Sprintf("pg%d", time.Now().UnixNano())
		insertTagged(t, pool, tag, 4, 3000)
		require.Eventually(t, func() bool {
			return qInt(t, pool, `SELECT count(*) FROM river_job WHERE state = 'running' AND tags[1] LIKE $1 || '-%'`, tag) == 4
		}, 60*time.Second, 20*time.Millisecond)
		return qInt(t, pool, `SELECT count(*) FROM sluice_workers`)
	}
	require.Equal(t, 2, check())
	time.Sleep(1500 * time.Millisecond) // both reapers armed (heartbeating for > dead-after)

	require.NoError(t, cluster.Stop("fast"))
	time.Sleep(3 * time.Second) // longer than dead-after: every heartbeat is stale
	require.NoError(t, cluster.Start())
	pool := livePool(t, url)
	require.Eventually(t, func() bool {
		return qInt(t, pool, `SELECT count(*) FROM sluice_worker_status WHERE status = 'live'`) == 2
	}, 60*time.Second, 50*time.Millisecond, "both workers heartbeat again")
	time.Sleep(3 * time.Second) // several dead-afters of reaper passes
	for _, w := range []*proc.Worker{a, b} {
		require.False(t, w.Exited(), "worker %s exited:\n%s", w.ID, w.Log())
		require.NotContains(t, w.Log(), "reaped dead worker")
		require.NotContains(t, w.Log(), "worker reaped")
	}
	require.Equal(t, 2, qInt(t, pool, `SELECT count(*) FROM sluice_workers`))
	require.Zero(t, qInt(t, pool, `SELECT count(*) FROM river_job WHERE errors::text LIKE '%lost%'`))
	require.Equal(t, 2, check(), "the workers go on working")
}

// TestWorkerBadDeadAfter: --dead-after must be a duration of at least
// three heartbeat intervals; anything else is a usage error (exit 2) and
// the worker does not start.
func TestWorkerBadDeadAfter(t *testing.T) {
	t.Parallel()
	url := testdb.New(t)
	for _, tc := range []struct {
		args []string
		env  []string
		want string
	}{
		{args: []string{"--dead-after", "10s"}, want: "--dead-after (10s) must be at least 3 heartbeat intervals (15s)"},
		{args: []string{"--heartbeat-interval", "1s", "--dead-after", "2999ms"}, want: "must be at least 3 heartbeat intervals (3s)"},
		{args: []string{"--dead-after", "0"}, want: "--dead-after (0s) must be at least"},
		{args: []string{"--dead-after", "-1m"}, want: "--dead-after (-1m0s) must be at least"},
		{args: []string{"--dead-after", "soon"}, want: `invalid argument "soon" for "--dead-after"`},
		{env: []string{"SLUICE_DEAD_AFTER=1s"}, want: "--dead-after (1s) must be at least 3 heartbeat intervals"},
		{env: []string{"SLUICE_DEAD_AFTER=never"}, want: "invalid $SLUICE_DEAD_AFTER"},
	} {
		args := append([]string{"worker", "--http-addr", ""}, tc.args...)
		res := proc.Run(t, url, tc.env, args...)
		require.Equal(t, 2, res.Code, "%v %v: %s", tc.args, tc.env, res.Stderr)
		require.Contains(t, res.Stderr, tc.want, "%v %v", tc.args, tc.env)
		require.Equal(t, 1, strings.Count(res.Stderr, "sluice: "), res.Stderr)
	}
	pool := livePool(t, url)
	require.Zero(t, qInt(t, pool, `SELECT count(*) FROM sluice_workers`), "no worker started")
}

// TestSlotCountsHoldThroughKill9: while two workers admit and release jobs
// of a limited kind (leases, per-job admission, parking and resumes), and
// one of them is killed with kill -9 in the middle, every snapshot of the
// database shows each kind's count of slots taken equal to its slot rows
// and leased slots; once all is done, nothing is left taken.
func TestSlotCountsHoldThroughKill9(t *testing.T) {
	t.Parallel()
	url := testdb.New(t)
	pool := livePool(t, url)
	res := proc.Run(t, url, nil, "limits", "set", "demo.sleep", "3")
	require.Equal(t, 0, res.Code, res.Stderr)
	a := proc.StartWorker(t, url, "a", append(livenessArgs, "--park-after", "20ms")...)
	proc.StartWorker(t, url, "b", append(livenessArgs, "--park-after", "20ms")...)
	const n = 200
	insertTagged(t, pool, "counts", n, 20)

	// Sample the invariant (one statement: one snapshot) until the end.
	stop := make(chan struct{})
	samples := make(chan int, 1)
	go func() {
		taken := 0
		for {
			select {
			case <-stop:
				samples <- taken
				return
			default:
			}
			var off int
			if err := pool.QueryRow(context.Background(), `
				SELECT count(*) FROM concurrency_limits l
				WHERE l.admitted <> (SELECT count(*) FROM concurrency_executions e WHERE e.kind = l.kind)
				                   + (SELECT COALESCE(sum(cl.slots), 0) FROM concurrency_leases cl WHERE cl.kind = l.kind)`).Scan(&off); err == nil {
				taken++
				if off > 0 {
					t.Errorf("slot count differs from the slots in a snapshot (sample %d)", taken)
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	require.Eventually(t, func() bool {
		return qInt(t, pool, `SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND state = 'completed'`) >= n/4
	}, time.Minute, 10*time.Millisecond)
	a.Kill(t)
	require.Eventually(t, func() bool {
		return qInt(t, pool, `SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND state = 'completed'`) == n
	}, 2*time.Minute, 20*time.Millisecond, "every job completed after the kill")
	close(stop)
	require.Positive(t, <-samples)
	requireSlotCountsConsistent(t, pool)
	require.Eventually(t, func() bool {
		return qInt(t, pool, `SELECT count(*) FROM concurrency_executions`) == 0 &&
			qInt(t, pool, `SELECT admitted FROM concurrency_limits WHERE kind = 'demo.sleep'`) ==
				qInt(t, pool, `SELECT COALESCE(sum(slots), 0)::int FROM concurrency_leases WHERE kind = 'demo.sleep'`)
	}, time.Minute, 20*time.Millisecond, "nothing left taken but the live worker's leases")
}
