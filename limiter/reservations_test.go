package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/jobtest"
)

// TestAReservationWhoseJobWentIsFreedAtOnce: a job resumed with a slot
// reserved for it (available, not fetched yet) is deleted or cancelled
// through River's client. Its slot goes back to the line at once, by the
// trigger's notification (sluice_reservations) and the worker's clean-up,
// not when the safety net comes by: the worker signals the clean-up, the
// reservation is gone, and the next job of the line runs; River's answer
// and the job's own row are River's.
func TestAReservationWhoseJobWentIsFreedAtOnce(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"delete", "cancel"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			name := "gone" + how
			kind := "test.probe." + name
			url, pool, tracker := probeKind(t, name, 1)
			client, lim := startProbeWorkerSignals(t, url, name+"-a", name, tracker, 10*time.Millisecond, nil)

			holder, ids := parkedBehindAHolder(t, client, pool, tracker, name)
			// The oldest parked job will be resumed into a queue no worker
			// works: its reservation waits there, unclaimed.
			_, err := pool.Exec(ctx, "UPDATE river_job SET queue = 'nowhere' WHERE id = $1", ids[0])
			require.NoError(t, err)

			_, err = client.JobCancel(ctx, holder)
			require.NoError(t, err)
			require.Eventually(t, func() bool {
				return jobState(t, pool, ids[0]) == "available" &&
					count(t, pool, "SELECT count(*) FROM concurrency_executions WHERE job_id = $1 AND reserved", ids[0]) == 1
			}, 30*time.Second, 5*time.Millisecond, "the oldest parked job is resumed with the kind's one slot")

			switch how {
			case "delete":
				deleted, err := client.JobDelete(ctx, ids[0])
				require.NoError(t, err)
				require.Equal(t, ids[0], deleted.ID)
				require.Empty(t, jobState(t, pool, ids[0]))
			case "cancel":
				cancelled, err := client.JobCancel(ctx, ids[0])
				require.NoError(t, err)
				require.Equal(t, "cancelled", string(cancelled.State))
			}
			require.Equal(t, kind, lim.TestSignals.ReservationFreed.WaitOrTimeout())
			require.Zero(t, count(t, pool, "SELECT count(*) FROM concurrency_executions WHERE job_id = $1", ids[0]),
				"the reservation of the job that went is freed")
			client.WaitFinished(t, 30*time.Second, ids[1])
			require.Equal(t, int32(1), tracker.max.Load(), "the limit holds")
			_, worked := tracker.snapshot()
			require.Zero(t, worked[1], "the job that went never ran")
			require.Equal(t, 1, worked[2])
		})
	}
}

// The trigger notifies only for a job that held a reservation: deleting
// or cancelling a parked job (no reservation) or a finalized one wakes no
// worker.
func TestNoNotificationForAJobWithoutAReservation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const name = "goneplain"
	url, pool, tracker := probeKind(t, name, 1)
	client, lim := startProbeWorkerSignals(t, url, name+"-a", name, tracker, 10*time.Millisecond, nil)

	holder, ids := parkedBehindAHolder(t, client, pool, tracker, name)
	_, err := client.JobDelete(ctx, ids[0])
	require.NoError(t, err)
	_, err = client.JobCancel(ctx, ids[1])
	require.NoError(t, err)
	_, err = client.JobCancel(ctx, holder)
	require.NoError(t, err)
	client.WaitFinished(t, 30*time.Second, holder)
	done := insertProbes(t, client, name, 3, 1, 0)
	client.WaitFinished(t, 30*time.Second, done...)
	select {
	case kind := <-lim.TestSignals.ReservationFreed.WaitC():
		t.Fatalf("a clean-up of %s ran, but no job with a reservation went", kind)
	default:
	}
}

// parkedBehindAHolder starts a long job of probe kind name (limited to 1:
// the holder of its one slot) and parks two more behind it (seqs 1 and 2).
func parkedBehindAHolder(t *testing.T, client *jobtest.Client, pool *pgxpool.Pool, tracker *probeTracker, name string) (holder int64, ids []int64) {
	t.Helper()
	holder = insertProbes(t, client, name, 0, 1, 60_000)[0]
	require.Eventually(t, func() bool { return tracker.running.Load() == 1 }, 30*time.Second, 5*time.Millisecond)
	ids = insertProbes(t, client, name, 1, 2, 0)
	waitParked(t, pool, ids...)
	return holder, ids
}
