package cibuilds_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/maintenance"
	"github.com/sluice-dev/sluice/modules/cibuilds"
	"github.com/sluice-dev/sluice/settings"
)

// TestStuckBuildsGitLabScenarios runs GitLab's spec scenarios of the four
// Ci::StuckBuilds::Drop*Service through a real River client: outdated builds
// are dropped, fresh ones and builds old on only some of the required
// columns are not, builds in every other status are never touched, and a
// second run changes nothing.
func TestStuckBuildsGitLabScenarios(t *testing.T) {
	t.Parallel()

	type scenario struct {
		name    string
		spec    buildSpec
		dropped bool
	}
	h := time.Hour
	scenarios := map[string][]scenario{
		"canceling": {
			{"outdated", buildSpec{created: 2 * h, updated: 2 * h}, true},
			{"outdated, finished_at already set", buildSpec{created: 2 * h, updated: 2 * h, finished: true}, true},
			{"outdated, lock_version moved before", buildSpec{created: 2 * h, updated: 2 * h, lockVer: 41}, true},
			{"fresh", buildSpec{created: 30 * time.Minute, updated: 30 * time.Minute}, false},
			{"created outdated but updated fresh", buildSpec{created: 2 * h, updated: 30 * time.Minute}, false},
			{"created fresh but updated outdated", buildSpec{created: 30 * time.Minute, updated: 2 * h}, false},
		},
		"running": {
			{"updated outdated", buildSpec{created: 3 * h, updated: 2 * h}, true},
			{"updated outdated, created fresh: only updated_at counts", buildSpec{created: 30 * time.Minute, updated: 2 * h}, true},
			{"created outdated but updated fresh", buildSpec{created: 3 * h, updated: 30 * time.Minute}, false},
			{"fresh", buildSpec{created: 10 * time.Minute, updated: 5 * time.Minute}, false},
		},
		"scheduled": {
			{"scheduled_at outdated", buildSpec{created: 3 * h, updated: 3 * h, scheduled: ago(2 * h)}, true},
			{"scheduled_at outdated, created and updated fresh: only scheduled_at counts",
				buildSpec{created: 5 * time.Minute, updated: 5 * time.Minute, scheduled: ago(2 * h)}, true},
			{"scheduled_at fresh", buildSpec{created: 3 * h, updated: 3 * h, scheduled: ago(30 * time.Minute)}, false},
			{"scheduled_at in the future", buildSpec{created: 3 * h, updated: 3 * h, scheduled: ago(-h)}, false},
			{"no scheduled_at", buildSpec{created: 3 * h, updated: 3 * h}, false},
		},
		"pending": {
			{"outdated (older than a day)", buildSpec{created: 2 * 24 * h, updated: 2 * 24 * h}, true},
			{"two hours old: not outdated for pending", buildSpec{created: 2 * h, updated: 2 * h}, false},
			{"created outdated but updated fresh", buildSpec{created: 2 * 24 * h, updated: 2 * h}, false},
			{"created fresh but updated outdated", buildSpec{created: 2 * h, updated: 2 * 24 * h}, false},
		},
	}

	for _, sw := range stuckSweeps() {
		t.Run(sw.kind, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testdb.NewPool(t)
			logs := &logBuffer{}
			deps, reg := jobtest.NewJobsConfig(t, pool, app.JobsConfig{Logger: slog.New(slog.NewJSONHandler(logs, nil))})
			client := jobtest.Start(t, pool, deps, jobtest.Config{})

			type built struct {
				scenario
				before *db.CiBuild
			}
			var builds []built
			for _, sc := range scenarios[sw.status] {
				sc.spec.status = sw.status
				id := insertBuild(t, pool, sc.spec)
				builds = append(builds, built{sc, getBuild(t, pool, id)})
			}
			// Every other status, old on every column: never touched.
			for _, status := range buildStatuses() {
				if status == sw.status {
					continue
				}
				spec := buildSpec{status: status, created: 72 * h, updated: 72 * h, scheduled: ago(72 * h)}
				id := insertBuild(t, pool, spec)
				builds = append(builds, built{scenario{name: "status " + status, spec: spec}, getBuild(t, pool, id)})
			}

			job := client.InsertAndWait(t, kindArgs(t, sw.kind), nil)
			require.Equal(t, rivertype.JobStateCompleted, job.State)
			require.Equal(t, maintenance.Queue, job.Queue)
			run, err := db.New(pool).GetMaintenanceRunByJob(ctx, &job.ID)
			require.NoError(t, err)
			require.Equal(t, maintenance.RunSucceeded, run.Status)

			var wantDropped []int64
			for _, b := range builds {
				after := getBuild(t, pool, b.before.ID)
				if !b.dropped {
					require.Equal(t, b.before, after, "%s: must be untouched", b.name)
					continue
				}
				wantDropped = append(wantDropped, b.before.ID)
				require.Equal(t, "failed", after.Status, b.name)
				require.Equal(t, sw.reason, *after.FailureReason, b.name)
				require.Equal(t, b.before.LockVersion+1, after.LockVersion, b.name)
				require.True(t, after.UpdatedAt.After(b.before.UpdatedAt), b.name)
				require.NotNil(t, after.FinishedAt, b.name)
				if b.before.FinishedAt != nil {
					require.Equal(t, *b.before.FinishedAt, *after.FinishedAt, "%s: finished_at is kept", b.name)
				}
				// Nothing else changes.
				require.Equal(t, b.before.Name, after.Name)
				require.Equal(t, b.before.RunnerID, after.RunnerID)
				require.Equal(t, b.before.CreatedAt, after.CreatedAt)
				require.Equal(t, b.before.ScheduledAt, after.ScheduledAt)
			}
			require.EqualValues(t, len(wantDropped), run.Affected)
			require.JSONEq(t, fmt.Sprint(len(wantDropped)), jsonField(t, run.Details, "dropped"))
			require.JSONEq(t, "0", jsonField(t, run.Details, "doomed"))
			require.EqualValues(t, len(wantDropped), jobtest.MetricValue(t, reg, "sluice_ci_builds_dropped_total",
				map[string]string{"kind": sw.kind, "failure_reason": sw.reason}))
			require.EqualValues(t, 0, jobtest.MetricValue(t, reg, "sluice_ci_builds_doomed_total", map[string]string{"kind": sw.kind}))

			// The logs: the start line, then one line per dropped build.
			require.Len(t, logs.entries(t, sw.message), 1)
			var logged []int64
			for _, e := range logs.entries(t, "Dropping outdated build") {
				logged = append(logged, int64(e["build_id"].(float64)))
				require.EqualValues(t, 700, e["runner_id"])
				require.Equal(t, sw.status, e["status"])
				require.Equal(t, sw.reason, e["failure_reason"])
				require.Equal(t, sw.kind, e["kind"])
			}
			require.ElementsMatch(t, wantDropped, logged)

			// Idempotent: the next run finds nothing and changes nothing.
			sum := testdb.Checksum(t, pool, "ci_builds")
			job = client.InsertAndWait(t, kindArgs(t, sw.kind), nil)
			require.Equal(t, rivertype.JobStateCompleted, job.State)
			run, err = db.New(pool).GetMaintenanceRunByJob(ctx, &job.ID)
			require.NoError(t, err)
			require.EqualValues(t, 0, run.Affected)
			require.Equal(t, sum, testdb.Checksum(t, pool, "ci_builds"))
		})
	}
}

func kindArgs(tb testing.TB, kind string) river.JobArgs {
	tb.Helper()
	args, err := jobtest.Registry(tb).Decode(kind, nil)
	require.NoError(tb, err)
	return args
}

func jsonField(tb testing.TB, raw []byte, field string) string {
	tb.Helper()
	var m map[string]any
	require.NoError(tb, json.Unmarshal(raw, &m))
	v, ok := m[field]
	require.True(tb, ok, "field %s in %s", field, raw)
	return fmt.Sprint(v)
}

// TestStuckBuildsManyBatches: more stuck builds than one batch holds are all
// dropped, batch after batch, and the fresh ones among them are not.
func TestStuckBuildsManyBatches(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool := testdb.NewPool(t)
	deps := newSweepEnv(t, pool)
	stuck := insertStuck(t, pool, "canceling", 250)
	fresh := make([]int64, 0, 20)
	for range 20 {
		fresh = append(fresh, insertBuild(t, pool, buildSpec{status: "canceling", created: time.Minute, updated: time.Minute}))
	}

	run, details, err := sweepOnce(t, ctx, deps, "ci.drop_canceling_builds")
	require.NoError(t, err)
	require.Equal(t, maintenance.RunSucceeded, run.Status)
	require.EqualValues(t, 250, run.Affected)
	require.EqualValues(t, 250, details["dropped"])
	require.EqualValues(t, 250, details["selected"])
	require.EqualValues(t, 3, details["batches"])
	var left int
	require.NoError(t, pool.QueryRow(ctx,
		"SELECT count(*) FROM ci_builds WHERE id = ANY($1) AND status <> 'failed'", stuck).Scan(&left))
	require.Zero(t, left)
	require.NoError(t, pool.QueryRow(ctx,
		"SELECT count(*) FROM ci_builds WHERE id = ANY($1) AND status = 'canceling' AND lock_version = 0", fresh).Scan(&left))
	require.Equal(t, len(fresh), left)
}

// TestStuckBuildsDoom: when the database rejects the drop of one build, that
// build is doomed (data_integrity_failure), the error is logged with its
// ids and counted, and every other build is still dropped.
func TestStuckBuildsDoom(t *testing.T) {
	t.Parallel()

	// setup inserts 150 stuck builds (two batches), returns them and the
	// bad one (in the first batch), after running install with its id.
	setup := func(t *testing.T, install func(pool *pgxpool.Pool, bad int64)) (*pgxpool.Pool, *sweepEnv, *logBuffer, []int64, int64) {
		pool := testdb.NewPool(t)
		deps := newSweepEnv(t, pool)
		logs := &logBuffer{}
		deps.Logger = slog.New(slog.NewJSONHandler(logs, nil))
		ids := insertStuck(t, pool, "canceling", 150)
		bad := ids[42]
		install(pool, bad)
		return pool, deps, logs, ids, bad
	}
	exec := func(t *testing.T, pool *pgxpool.Pool, sql string) {
		_, err := pool.Exec(context.Background(), sql)
		require.NoError(t, err)
	}
	rejectTrigger := func(t *testing.T, pool *pgxpool.Pool, bad int64, condition string) {
		exec(t, pool, fmt.Sprintf(`
			CREATE FUNCTION test_reject_build() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN
				IF NEW.id = %d AND %s THEN
					RAISE EXCEPTION 'build %% is broken', NEW.id;
				END IF;
				RETURN NEW;
			END $$;
			CREATE TRIGGER test_reject_build BEFORE UPDATE ON ci_builds
				FOR EACH ROW EXECUTE FUNCTION test_reject_build();`, bad, condition))
	}
	othersDropped := func(t *testing.T, pool *pgxpool.Pool, ids []int64, bad int64) {
		var n int
		require.NoError(t, pool.QueryRow(context.Background(), `
			SELECT count(*) FROM ci_builds
			WHERE id = ANY($1) AND id <> $2 AND status = 'failed'
			  AND failure_reason = 'stuck_or_timeout_failure' AND lock_version = 1`, ids, bad).Scan(&n))
		require.Equal(t, len(ids)-1, n)
	}
	doomed := func(t *testing.T, pool *pgxpool.Pool, deps *sweepEnv, logs *logBuffer, bad int64, errText string) {
		b := getBuild(t, pool, bad)
		require.Equal(t, "failed", b.Status)
		require.Equal(t, "data_integrity_failure", *b.FailureReason)
		require.NotNil(t, b.FinishedAt)
		require.EqualValues(t, 1, testutil.ToFloat64(deps.Metrics.Doomed.WithLabelValues("ci.drop_canceling_builds")))
		entries := logs.entries(t, "Dropping build failed; dooming it")
		require.Len(t, entries, 1)
		require.EqualValues(t, bad, entries[0]["build_id"])
		require.EqualValues(t, b.ProjectID, entries[0]["project_id"])
		require.EqualValues(t, *b.PipelineID, entries[0]["pipeline_id"])
		require.Contains(t, entries[0]["error"], errText)
		require.Len(t, logs.entries(t, "Build doomed"), 1)
	}

	t.Run("trigger rejects the drop", func(t *testing.T) {
		t.Parallel()
		pool, deps, logs, ids, bad := setup(t, func(pool *pgxpool.Pool, bad int64) {
			rejectTrigger(t, pool, bad, "NEW.failure_reason = 'stuck_or_timeout_failure'")
		})
		run, details, err := sweepOnce(t, context.Background(), deps, "ci.drop_canceling_builds")
		require.NoError(t, err)
		require.Equal(t, maintenance.RunSucceeded, run.Status)
		require.EqualValues(t, 149, details["dropped"])
		require.EqualValues(t, 1, details["doomed"])
		require.EqualValues(t, 150, run.Affected)
		othersDropped(t, pool, ids, bad)
		doomed(t, pool, deps, logs, bad, "is broken")
	})

	t.Run("lock_version at its maximum: the drop overflows", func(t *testing.T) {
		t.Parallel()
		pool, deps, logs, ids, bad := setup(t, func(pool *pgxpool.Pool, bad int64) {
			exec(t, pool, fmt.Sprintf("UPDATE ci_builds SET lock_version = 2147483647 WHERE id = %d", bad))
		})
		_, details, err := sweepOnce(t, context.Background(), deps, "ci.drop_canceling_builds")
		require.NoError(t, err)
		require.EqualValues(t, 149, details["dropped"])
		require.EqualValues(t, 1, details["doomed"])
		othersDropped(t, pool, ids, bad)
		doomed(t, pool, deps, logs, bad, "out of range")
		require.EqualValues(t, 0, getBuild(t, pool, bad).LockVersion, "the doom wraps lock_version")
	})

	t.Run("trigger rejects every update of the build", func(t *testing.T) {
		t.Parallel()
		pool, deps, logs, ids, bad := setup(t, func(pool *pgxpool.Pool, bad int64) {
			rejectTrigger(t, pool, bad, "true")
		})
		var superuser bool
		require.NoError(t, pool.QueryRow(context.Background(),
			"SELECT rolsuper FROM pg_roles WHERE rolname = current_user").Scan(&superuser))
		_, details, err := sweepOnce(t, context.Background(), deps, "ci.drop_canceling_builds")
		require.NoError(t, err)
		othersDropped(t, pool, ids, bad)
		if !superuser {
			// Triggers cannot be bypassed: the build is left as it is.
			require.EqualValues(t, 1, details["doom_failed"])
			require.Equal(t, "canceling", getBuild(t, pool, bad).Status)
			return
		}
		// A superuser's doom runs with triggers disabled.
		require.EqualValues(t, 1, details["doomed"])
		doomed(t, pool, deps, logs, bad, "is broken")
	})

	t.Run("doom rejected too: counted, left alone, the sweep goes on", func(t *testing.T) {
		t.Parallel()
		pool, deps, logs, ids, bad := setup(t, func(pool *pgxpool.Pool, bad int64) {
			rejectTrigger(t, pool, bad, "true")
			// ENABLE ALWAYS: fires even with session_replication_role = replica.
			exec(t, pool, "ALTER TABLE ci_builds ENABLE ALWAYS TRIGGER test_reject_build")
		})
		before := getBuild(t, pool, bad)
		for range 2 { // and again at the next run: no spinning, same outcome
			run, details, err := sweepOnce(t, context.Background(), deps, "ci.drop_canceling_builds")
			require.NoError(t, err)
			require.Equal(t, maintenance.RunSucceeded, run.Status)
			require.EqualValues(t, 1, details["doom_failed"])
			require.EqualValues(t, 0, details["doomed"])
		}
		othersDropped(t, pool, ids, bad)
		require.Equal(t, before, getBuild(t, pool, bad))
		require.Len(t, logs.entries(t, "Dooming build failed; left as it is"), 2)
		require.EqualValues(t, 0, testutil.ToFloat64(deps.Metrics.Doomed.WithLabelValues("ci.drop_canceling_builds")))
	})
}

// TestStuckBuildsConcurrentUpdate: builds changed by somebody else between
// the sweep's select and its update are reloaded: still stuck → dropped
// with the other writer's change kept (no lost update); completed or no
// longer stuck → left alone; changed on every attempt → given up after 3
// retries and left for the next run.
func TestStuckBuildsConcurrentUpdate(t *testing.T) {
	t.Parallel()

	const kind = "ci.drop_canceling_builds"
	type call struct {
		ids     []int64
		attempt int
	}

	t.Run("changed between select and update", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		pool := testdb.NewPool(t)
		deps := newSweepEnv(t, pool)
		ids := insertStuck(t, pool, "canceling", 4)
		renamed, completed, refreshed, untouched := ids[0], ids[1], ids[2], ids[3]

		var calls []call
		hook := func(ctx context.Context, batch []int64, attempt int) {
			calls = append(calls, call{batch, attempt})
			if len(calls) > 1 {
				return
			}
			// Another writer, on another connection, between the select and
			// the update; each bumps lock_version as every writer must.
			_, err := pool.Exec(ctx, `
				UPDATE ci_builds SET name = 'renamed by a runner', lock_version = lock_version + 1 WHERE id = $1;`, renamed)
			require.NoError(t, err)
			_, err = pool.Exec(ctx, `
				UPDATE ci_builds SET status = 'canceled', finished_at = now(), updated_at = now(),
				       lock_version = lock_version + 1 WHERE id = $1`, completed)
			require.NoError(t, err)
			_, err = pool.Exec(ctx, `
				UPDATE ci_builds SET updated_at = now(), lock_version = lock_version + 1 WHERE id = $1`, refreshed)
			require.NoError(t, err)
		}
		run, details, err := sweepOnceHook(t, ctx, deps, kind, hook)
		require.NoError(t, err)
		require.Equal(t, maintenance.RunSucceeded, run.Status)
		require.EqualValues(t, 2, details["dropped"])
		require.EqualValues(t, 2, details["left_alone"])
		require.EqualValues(t, 0, details["conflicts"])

		b := getBuild(t, pool, renamed)
		require.Equal(t, "failed", b.Status)
		require.Equal(t, "renamed by a runner", b.Name, "the other writer's update is not lost")
		require.EqualValues(t, 2, b.LockVersion)
		b = getBuild(t, pool, completed)
		require.Equal(t, "canceled", b.Status)
		require.Nil(t, b.FailureReason)
		require.EqualValues(t, 1, b.LockVersion)
		b = getBuild(t, pool, refreshed)
		require.Equal(t, "canceling", b.Status)
		require.EqualValues(t, 1, b.LockVersion)
		b = getBuild(t, pool, untouched)
		require.Equal(t, "failed", b.Status)
		require.EqualValues(t, 1, b.LockVersion)

		// The batch statement, then one retry of the renamed build (the other
		// two were reloaded and left alone without an update attempt).
		require.Equal(t, []call{{ids, 0}, {[]int64{renamed}, 1}}, calls)
	})

	t.Run("changed on every attempt: 3 retries, then left for the next run", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		pool := testdb.NewPool(t)
		deps := newSweepEnv(t, pool)
		ids := insertStuck(t, pool, "canceling", 2)
		busy := ids[0]
		var attempts []int
		hook := func(ctx context.Context, batch []int64, attempt int) {
			attempts = append(attempts, attempt)
			_, err := pool.Exec(ctx, "UPDATE ci_builds SET lock_version = lock_version + 1 WHERE id = $1", busy)
			require.NoError(t, err)
		}
		_, details, err := sweepOnceHook(t, ctx, deps, kind, hook)
		require.NoError(t, err)
		require.Equal(t, []int{0, 1, 2, 3}, attempts)
		require.EqualValues(t, 1, details["conflicts"])
		require.EqualValues(t, 0, details["doomed"])
		b := getBuild(t, pool, busy)
		require.Equal(t, "canceling", b.Status, "never doomed: the other writer's changes win")
		require.EqualValues(t, 4, b.LockVersion)
		require.Equal(t, "failed", getBuild(t, pool, ids[1]).Status)

		// The next run, undisturbed, drops it.
		_, details, err = sweepOnce(t, ctx, deps, kind)
		require.NoError(t, err)
		require.EqualValues(t, 1, details["dropped"])
		require.EqualValues(t, 5, getBuild(t, pool, busy).LockVersion)
	})

	t.Run("row locked by an open transaction that then commits a change", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		pool := testdb.NewPool(t)
		deps := newSweepEnv(t, pool)
		ids := insertStuck(t, pool, "canceling", 3)
		held := ids[1]
		committed := make(chan error, 1)
		hook := func(ctx context.Context, batch []int64, attempt int) {
			if attempt != 0 {
				return
			}
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, "UPDATE ci_builds SET stage = 'deploy', lock_version = lock_version + 1 WHERE id = $1", held)
			require.NoError(t, err)
			// The batch update waits for this row lock; commit a little
			// later (the outcome is the same if it commits first).
			go func() {
				time.Sleep(300 * time.Millisecond)
				committed <- tx.Commit(context.Background())
			}()
		}
		_, details, err := sweepOnceHook(t, ctx, deps, kind, hook)
		require.NoError(t, err)
		require.NoError(t, <-committed)
		require.EqualValues(t, 3, details["dropped"])
		b := getBuild(t, pool, held)
		require.Equal(t, "failed", b.Status)
		require.Equal(t, "deploy", b.Stage, "the concurrent transaction's update is not lost")
		require.EqualValues(t, 2, b.LockVersion)
	})

	t.Run("two sweeps at once without the advisory lock drop each build once", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		pool := testdb.NewPool(t)
		deps := newSweepEnv(t, pool)
		ids := insertStuck(t, pool, "canceling", 400)
		var wg sync.WaitGroup
		results := make([]maintenance.Result, 2)
		errs := make([]error, 2)
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i], errs[i] = deps.sweeper(t, nil).Sweep(ctx, cibuilds.SweepOf(kind))
			}()
		}
		wg.Wait()
		require.NoError(t, errs[0])
		require.NoError(t, errs[1])
		require.EqualValues(t, len(ids), results[0].Affected+results[1].Affected,
			"every build dropped by exactly one sweep")
		var n int
		require.NoError(t, pool.QueryRow(ctx,
			"SELECT count(*) FROM ci_builds WHERE status = 'failed' AND lock_version = 1").Scan(&n))
		require.Equal(t, len(ids), n)
		require.EqualValues(t, len(ids),
			testutil.ToFloat64(deps.Metrics.Dropped.WithLabelValues(kind, "stuck_or_timeout_failure")))
	})
}

// TestStuckBuildsLockedElsewhere: while another session holds the kind's
// advisory lock, a run is recorded as skipped_locked and changes nothing.
func TestStuckBuildsLockedElsewhere(t *testing.T) {
	t.Parallel()

	for _, sw := range stuckSweeps() {
		t.Run(sw.kind, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testdb.NewPool(t)
			deps := newSweepEnv(t, pool)
			insertStuck(t, pool, sw.status, 5)
			conn, err := pool.Acquire(ctx)
			require.NoError(t, err)
			defer conn.Release()
			_, err = conn.Exec(ctx, "SELECT pg_advisory_lock(hashtextextended($1, 0))", sw.kind)
			require.NoError(t, err)

			sum := testdb.Checksum(t, pool, "ci_builds")
			run, _, err := sweepOnce(t, ctx, deps, sw.kind)
			require.NoError(t, err)
			require.Equal(t, maintenance.RunSkippedLocked, run.Status)
			require.Equal(t, sum, testdb.Checksum(t, pool, "ci_builds"))

			_, err = conn.Exec(ctx, "SELECT pg_advisory_unlock(hashtextextended($1, 0))", sw.kind)
			require.NoError(t, err)
			run, _, err = sweepOnce(t, ctx, deps, sw.kind)
			require.NoError(t, err)
			require.Equal(t, maintenance.RunSucceeded, run.Status)
			require.EqualValues(t, 5, run.Affected)
		})
	}
}

// TestStuckBuildsTimeoutSetting: the timeout is read at every run, so a
// changed setting takes effect at the next run; a bad value fails the run
// with an error naming the setting and changes nothing.
func TestStuckBuildsTimeoutSetting(t *testing.T) {
	t.Parallel()

	for _, sw := range stuckSweeps() {
		t.Run(sw.kind, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testdb.NewPool(t)
			deps := newSweepEnv(t, pool)
			// Five hours old on every column: stuck for every default.
			id := insertBuild(t, pool, buildSpec{status: sw.status, created: 5 * time.Hour, updated: 5 * time.Hour, scheduled: ago(5 * time.Hour)})
			if sw.status == "pending" {
				// Not stuck for pending's default of a day.
				_, details, err := sweepOnce(t, ctx, deps, sw.kind)
				require.NoError(t, err)
				require.EqualValues(t, 0, details["dropped"])
				require.Equal(t, "24h", details["timeout"])
			}

			sum := testdb.Checksum(t, pool, "ci_builds")
			for _, bad := range []string{`"soon"`, `"0s"`, `"-1h"`, `3600`} {
				_, err := pool.Exec(ctx, "UPDATE settings SET value = $1 WHERE key = $2", bad, sw.setting)
				require.NoError(t, err)
				run, _, err := sweepOnce(t, ctx, deps, sw.kind)
				require.Error(t, err, bad)
				require.Contains(t, err.Error(), sw.setting, bad)
				require.Equal(t, maintenance.RunFailed, run.Status)
				require.Contains(t, string(run.Details), sw.setting)
			}
			require.Equal(t, sum, testdb.Checksum(t, pool, "ci_builds"))

			require.NoError(t, deps.Settings.Set(ctx, sw.setting, "6h"))
			_, details, err := sweepOnce(t, ctx, deps, sw.kind)
			require.NoError(t, err)
			require.EqualValues(t, 0, details["dropped"])
			require.Equal(t, "6h", details["timeout"])
			require.Equal(t, sum, testdb.Checksum(t, pool, "ci_builds"))

			require.NoError(t, deps.Settings.Set(ctx, sw.setting, "4h30m"))
			_, details, err = sweepOnce(t, ctx, deps, sw.kind)
			require.NoError(t, err)
			require.EqualValues(t, 1, details["dropped"])
			require.Equal(t, "4h30m", details["timeout"])
			require.Equal(t, "failed", getBuild(t, pool, id).Status)
		})
	}
}

// TestStuckBuildsDefaults: the migration's settings rows equal the code's
// defaults, and it schedules every sweep with the cron of DESIGN.md.
func TestStuckBuildsDefaults(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool := testdb.NewPool(t)
	settings := settings.New(pool)
	registry := jobtest.Registry(t)
	crons := map[string]string{
		"ci.drop_canceling_builds": "45 * * * *",
		"ci.drop_running_builds":   "0 * * * *",
		"ci.drop_scheduled_builds": "15 * * * *",
		"ci.drop_pending_builds":   "20 * * * *",
	}
	for _, sw := range stuckSweeps() {
		require.Equal(t, sw.kind+".timeout", sw.setting)
		var raw string
		require.NoError(t, pool.QueryRow(ctx, "SELECT value::text FROM settings WHERE key = $1 AND description <> ''", sw.setting).Scan(&raw))
		got, err := settings.Duration(ctx, sw.setting, -1)
		require.NoError(t, err)
		require.Equal(t, sw.timeout, got, "%s: migration default %s", sw.setting, raw)

		var cron, kind, args string
		var nextRun *time.Time
		require.NoError(t, pool.QueryRow(ctx,
			"SELECT cron, kind, args::text, next_run_at FROM schedules WHERE name = $1", sw.kind).Scan(&cron, &kind, &args, &nextRun))
		require.Equal(t, crons[sw.kind], cron)
		require.Equal(t, sw.kind, kind)
		require.Equal(t, "{}", args)
		require.Nil(t, nextRun)

		decoded, err := registry.Decode(sw.kind, nil)
		require.NoError(t, err)
		withOpts, ok := decoded.(river.JobArgsWithInsertOpts)
		require.True(t, ok)
		require.Equal(t, maintenance.Queue, withOpts.InsertOpts().Queue, "a maintenance kind")
		_, err = registry.Decode(sw.kind, []byte(`{"timeout": "1h"}`))
		require.ErrorContains(t, err, `unknown field "timeout"`)
	}
	require.Equal(t, time.Hour, cibuilds.Canceling.DefaultTimeout, "the seed's TIMEOUT = 1.hour")
	require.Equal(t, 24*time.Hour, cibuilds.Pending.DefaultTimeout)
}

// TestStuckBuildsSelectUsesIndex: every batch select of every sweep is an
// index scan of its status's partial index, in the custom plan and in the
// generic plan of the prepared statement, on a table where most builds are
// finished.
func TestStuckBuildsSelectUsesIndex(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	pool, queries := tracedPool(t, url, "-- name: SelectStuck")
	deps := newSweepEnv(t, pool)
	_, err := pool.Exec(ctx, `
		INSERT INTO ci_builds (project_id, status, created_at, updated_at, scheduled_at)
		SELECT g % 500,
		       CASE g % 50 WHEN 1 THEN 'canceling' WHEN 2 THEN 'running' WHEN 3 THEN 'scheduled'
		                   WHEN 4 THEN 'pending' ELSE 'success' END,
		       now() - interval '3 days', now() - interval '3 days', now() - interval '3 days'
		FROM generate_series(1, 30000) AS g;
		ANALYZE ci_builds`)
	require.NoError(t, err)

	for _, sw := range stuckSweeps() {
		_, details, err := sweepOnce(t, ctx, deps, sw.kind)
		require.NoError(t, err)
		require.EqualValues(t, 600, details["dropped"])
		selects := queries.take()
		require.Len(t, selects, 7, "6 batches and the empty select that ends the run")
		for _, q := range []tracedQuery{selects[0], selects[3]} {
			custom, generic := explain(t, pool, q)
			idx := "Index Scan using ci_builds_" + sw.status + "_sweep_idx on ci_builds"
			require.Contains(t, custom, idx, custom)
			require.Contains(t, generic, idx, generic)
			require.NotContains(t, custom+generic, "Seq Scan")
			require.NotContains(t, custom+generic, "Sort", "the index gives the order")
		}
	}
}

// TestStuckBuildsInterruptedMidRun: a run whose context ends in the middle
// (River's job timeout, a cancelled job, SIGINT of `sluice run`) fails
// without losing or doubling anything: the batches done stay done, the
// batch in flight is not applied, and the next run drops the rest.
func TestStuckBuildsInterruptedMidRun(t *testing.T) {
	t.Parallel()

	const kind = "ci.drop_canceling_builds"
	ctx := context.Background()
	pool := testdb.NewPool(t)
	deps := newSweepEnv(t, pool)
	ids := insertStuck(t, pool, "canceling", 250)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	batches := 0
	hook := func(_ context.Context, batch []int64, attempt int) {
		if attempt == 0 && len(batch) > 1 {
			if batches++; batches == 2 {
				cancel()
			}
		}
	}
	run, details, err := sweepOnceHook(t, runCtx, deps, kind, hook)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, maintenance.RunFailed, run.Status)
	require.EqualValues(t, 100, run.Affected, "the work done before the interruption is recorded")
	require.EqualValues(t, 100, details["dropped"])

	var dropped int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM ci_builds WHERE status = 'failed'").Scan(&dropped))
	require.Equal(t, 100, dropped, "the first batch stays dropped, the second was not applied")

	run, details, err = sweepOnce(t, ctx, deps, kind)
	require.NoError(t, err)
	require.Equal(t, maintenance.RunSucceeded, run.Status, "the lock was released")
	require.EqualValues(t, 150, details["dropped"])
	var n int
	require.NoError(t, pool.QueryRow(ctx,
		"SELECT count(*) FROM ci_builds WHERE id = ANY($1) AND status = 'failed' AND lock_version = 1", ids).Scan(&n))
	require.Equal(t, len(ids), n, "each build dropped exactly once")
}

// TestStuckBuildsRestoresConnection: the run's own connection goes back to
// the pool with synchronous_commit as it was.
func TestStuckBuildsRestoresConnection(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	cfg, err := testdb.PoolConfig(testdb.New(t))
	require.NoError(t, err)
	cfg.MaxConns = 2 // the advisory lock's and the sweep's
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	deps := newSweepEnv(t, pool)
	insertStuck(t, pool, "canceling", 150)

	_, details, err := sweepOnce(t, ctx, deps, "ci.drop_canceling_builds")
	require.NoError(t, err)
	require.EqualValues(t, 150, details["dropped"])
	for range 2 {
		conn, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		var sc string
		require.NoError(t, conn.QueryRow(ctx, "SHOW synchronous_commit").Scan(&sc))
		require.Equal(t, "on", sc)
	}
}
