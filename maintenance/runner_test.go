package maintenance_test

import (
	"context"
	"encoding/json"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/maintenance"
)

func TestRunMaintenance(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool := testdb.NewPool(t)
	deps, _ := jobtest.NewJobs(t, pool)
	q := db.New(pool)

	runs := func(t *testing.T, kind string) []*db.MaintenanceRun {
		t.Helper()
		rows, err := q.ListMaintenanceRuns(ctx, db.ListMaintenanceRunsParams{Kind: kind, MaxRows: 100})
		require.NoError(t, err)
		return rows
	}
	lockFree := func(t *testing.T, kind string) {
		t.Helper()
		lock, err := pgkit.TryLock(ctx, pool, kind)
		require.NoError(t, err)
		require.NotNil(t, lock, "the lock of %s must be free after the run", kind)
		require.NoError(t, lock.Release(ctx))
	}

	t.Run("succeeded run holds the lock and is recorded", func(t *testing.T) {
		t.Parallel()
		kind := "test.maint.ok"
		job := &rivertype.JobRow{ID: 101, Kind: kind}
		err := deps.Maintenance.Run(ctx, job, func(ctx context.Context) (maintenance.Result, error) {
			// While the run works, the kind's lock is taken.
			other, err := pgkit.TryLock(ctx, pool, kind)
			require.NoError(t, err)
			require.Nil(t, other)
			rows := runs(t, kind)
			require.Len(t, rows, 1)
			require.Equal(t, maintenance.RunRunning, rows[0].Status)
			return maintenance.Result{Affected: 7, Details: map[string]any{"dropped": 7}}, nil
		})
		require.NoError(t, err)
		rows := runs(t, kind)
		require.Len(t, rows, 1)
		require.Equal(t, maintenance.RunSucceeded, rows[0].Status)
		require.EqualValues(t, 7, rows[0].Affected)
		require.EqualValues(t, 101, *rows[0].JobID)
		require.NotNil(t, rows[0].FinishedAt)
		var details map[string]any
		require.NoError(t, json.Unmarshal(rows[0].Details, &details))
		require.EqualValues(t, 7, details["dropped"])
		require.Contains(t, details, "duration_ms")
		require.EqualValues(t, 1, testutil.ToFloat64(deps.Maintenance.Metrics().Runs.WithLabelValues(kind, maintenance.RunSucceeded)))
		lockFree(t, kind)
	})

	t.Run("lock held elsewhere is skipped_locked and does nothing", func(t *testing.T) {
		t.Parallel()
		kind := "test.maint.locked"
		conn, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		_, err = conn.Exec(ctx, "SELECT pg_advisory_lock(hashtextextended($1, 0))", kind)
		require.NoError(t, err)

		called := false
		err = deps.Maintenance.Run(ctx, &rivertype.JobRow{ID: 102, Kind: kind}, func(context.Context) (maintenance.Result, error) {
			called = true
			return maintenance.Result{}, nil
		})
		require.NoError(t, err, "a skipped run is not an error: the River job completes")
		require.False(t, called)
		rows := runs(t, kind)
		require.Len(t, rows, 1)
		require.Equal(t, maintenance.RunSkippedLocked, rows[0].Status)
		var details map[string]any
		require.NoError(t, json.Unmarshal(rows[0].Details, &details))
		var holder int32
		require.NoError(t, conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&holder))
		require.EqualValues(t, holder, details["holder_pid"])

		_, err = conn.Exec(ctx, "SELECT pg_advisory_unlock(hashtextextended($1, 0))", kind)
		require.NoError(t, err)
	})

	t.Run("failure is recorded and returned", func(t *testing.T) {
		t.Parallel()
		kind := "test.maint.fail"
		err := deps.Maintenance.Run(ctx, &rivertype.JobRow{ID: 103, Kind: kind}, func(context.Context) (maintenance.Result, error) {
			return maintenance.Result{Affected: 2}, errors.New("boom")
		})
		require.ErrorContains(t, err, "boom")
		rows := runs(t, kind)
		require.Len(t, rows, 1)
		require.Equal(t, maintenance.RunFailed, rows[0].Status)
		require.EqualValues(t, 2, rows[0].Affected, "work done before the failure is counted")
		require.Contains(t, string(rows[0].Details), "boom")
		lockFree(t, kind)
	})

	t.Run("panic is recorded, lock released, panic propagates", func(t *testing.T) {
		t.Parallel()
		kind := "test.maint.panic"
		require.Panics(t, func() {
			_ = deps.Maintenance.Run(ctx, &rivertype.JobRow{ID: 104, Kind: kind}, func(context.Context) (maintenance.Result, error) {
				panic("kaboom")
			})
		})
		rows := runs(t, kind)
		require.Len(t, rows, 1)
		require.Equal(t, maintenance.RunFailed, rows[0].Status)
		require.Contains(t, string(rows[0].Details), "kaboom")
		lockFree(t, kind)
	})

	t.Run("timeout ends the run, records it and frees the lock", func(t *testing.T) {
		t.Parallel()
		kind := "test.maint.timeout"
		runCtx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		err := deps.Maintenance.Run(runCtx, &rivertype.JobRow{ID: 105, Kind: kind}, func(ctx context.Context) (maintenance.Result, error) {
			// The job's deadline passes while the run works.
			cancel(context.DeadlineExceeded)
			<-ctx.Done()
			return maintenance.Result{}, context.Cause(ctx)
		})
		require.ErrorIs(t, err, context.DeadlineExceeded)
		rows := runs(t, kind)
		require.Len(t, rows, 1)
		require.Equal(t, maintenance.RunFailed, rows[0].Status)
		lockFree(t, kind)
	})

	t.Run("a run left running by a dead process is closed by the next", func(t *testing.T) {
		t.Parallel()
		kind := "test.maint.abandoned"
		stale, err := q.StartMaintenanceRun(ctx, db.StartMaintenanceRunParams{Kind: kind})
		require.NoError(t, err)
		require.NoError(t, deps.Maintenance.Run(ctx, &rivertype.JobRow{ID: 106, Kind: kind}, func(context.Context) (maintenance.Result, error) {
			return maintenance.Result{}, nil
		}))
		rows := runs(t, kind)
		require.Len(t, rows, 2)
		byID := map[int64]*db.MaintenanceRun{rows[0].ID: rows[0], rows[1].ID: rows[1]}
		require.Equal(t, maintenance.RunFailed, byID[stale.ID].Status)
		require.Contains(t, string(byID[stale.ID].Details), "abandoned")
	})

	t.Run("runs of one kind never overlap", func(t *testing.T) {
		t.Parallel()
		kind := "test.maint.overlap"
		const n = 8
		errs := make(chan error, n)
		for i := range n {
			go func() {
				errs <- deps.Maintenance.Run(ctx, &rivertype.JobRow{ID: int64(200 + i), Kind: kind}, func(context.Context) (maintenance.Result, error) {
					time.Sleep(50 * time.Millisecond)
					return maintenance.Result{Affected: 1}, nil
				})
			}()
		}
		for range n {
			require.NoError(t, <-errs)
		}
		rows := runs(t, kind)
		require.Len(t, rows, n)
		var succeeded []*db.MaintenanceRun
		for _, r := range rows {
			if r.Status == maintenance.RunSucceeded {
				succeeded = append(succeeded, r)
			} else {
				require.Equal(t, maintenance.RunSkippedLocked, r.Status)
			}
		}
		require.NotEmpty(t, succeeded)
		for i, a := range succeeded {
			for _, b := range succeeded[i+1:] {
				overlap := a.StartedAt.Before(*b.FinishedAt) && b.StartedAt.Before(*a.FinishedAt)
				require.False(t, overlap, "runs %d and %d overlap", a.ID, b.ID)
			}
		}
	})
}

// TestRunMaintenanceLockLost kills the connection that holds a run's lock:
// the run is stopped (its context cancelled) and recorded as failed, and
// another run of the kind can take the lock.
func TestRunMaintenanceLockLost(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool := testdb.NewPool(t)
	deps, _ := jobtest.NewJobsConfig(t, pool, app.JobsConfig{LockCheckInterval: 20 * time.Millisecond})
	kind := "test.maint.lock_lost"

	err := deps.Maintenance.Run(ctx, &rivertype.JobRow{ID: 1, Kind: kind}, func(ctx context.Context) (maintenance.Result, error) {
		// Not the run's context: the watch may cancel it as soon as the
		// backend is gone, before this statement returns.
		bg := context.Background()
		holders, err := db.New(pool).AdvisoryLockHolders(bg, kind)
		require.NoError(t, err)
		require.Len(t, holders, 1)
		_, err = pool.Exec(bg, "SELECT pg_terminate_backend($1)", *holders[0].Pid)
		require.NoError(t, err)
		select {
		case <-ctx.Done():
			return maintenance.Result{}, ctx.Err()
		case <-time.After(30 * time.Second):
			return maintenance.Result{}, errors.New("the run was not stopped")
		}
	})
	require.ErrorIs(t, err, maintenance.ErrLockLost)
	runs, err := db.New(pool).ListMaintenanceRuns(ctx, db.ListMaintenanceRunsParams{Kind: kind, MaxRows: 10})
	require.NoError(t, err)
	require.Len(t, runs, 1)
	require.Equal(t, maintenance.RunFailed, runs[0].Status)
	require.Contains(t, string(runs[0].Details), "advisory lock lost")

	lock, err := pgkit.TryLock(ctx, pool, kind)
	require.NoError(t, err)
	require.NotNil(t, lock)
	require.NoError(t, lock.Release(ctx))
}

// TestRunMaintenanceLockPingHangs: the connection holding a run's lock stops
// answering (its backend is stopped, as a half-open connection would leave
// it): the check's ping times out within the check interval and the run is
// stopped and recorded as failed, "advisory lock lost". Needs the right to
// signal the database's backends (a local server, run as root or postgres).
func TestRunMaintenanceLockPingHangs(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool := testdb.NewPool(t)
	deps, _ := jobtest.NewJobsConfig(t, pool, app.JobsConfig{LockCheckInterval: 100 * time.Millisecond})
	kind := "test.maint.ping_hangs"

	err := deps.Maintenance.Run(ctx, &rivertype.JobRow{ID: 1, Kind: kind}, func(ctx context.Context) (maintenance.Result, error) {
		holders, err := db.New(pool).AdvisoryLockHolders(context.Background(), kind)
		require.NoError(t, err)
		require.Len(t, holders, 1)
		pid := int(*holders[0].Pid)
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Skipf("cannot stop the lock's backend %d (%v): needs a local server and the right to signal it", pid, err)
		}
		t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
		select {
		case <-ctx.Done():
			return maintenance.Result{}, ctx.Err()
		case <-time.After(30 * time.Second):
			return maintenance.Result{}, errors.New("the run was not stopped")
		}
	})
	require.ErrorIs(t, err, maintenance.ErrLockLost)
	runs, err := db.New(pool).ListMaintenanceRuns(ctx, db.ListMaintenanceRunsParams{Kind: kind, MaxRows: 10})
	require.NoError(t, err)
	require.Len(t, runs, 1)
	require.Equal(t, maintenance.RunFailed, runs[0].Status)
	require.Contains(t, string(runs[0].Details), "advisory lock lost")
}
