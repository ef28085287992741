package e2e_test

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/testdb"
)

// Sizes of TestKillDuringParkAndResume: short jobs through a limit of 2, so
// that most of them park (--park-after 20ms) and are resumed. A first batch,
// then a trickle of new jobs (which park behind the waiting ones) until the
// kill.
const (
	parkKillFirst   = 150
	parkKillTrickle = 4 // jobs every parkKillEvery
	parkKillEvery   = 20 * time.Millisecond
	parkKillMax     = 400 // jobs in all, at most
	parkKillMS      = 20
	parkKillLimit   = 2
)

// parkingSnapshot is the state of the limited jobs at one moment, in one
// statement.
type parkingSnapshot struct {
	completed, parked, resumedWaiting, victimRunning, victimResumed, victimParking int64
}

// TestKillDuringParkAndResume kills a worker with SIGKILL while jobs of a
// kind limited to 2 park and resume across two workers (short jobs, a
// --park-after of 20ms, new jobs arriving all the time): the kill comes
// when jobs are parked (pending), the victim is parking others (marked,
// their parking not completed yet) and runs or is about to run resumed ones
// (available with a reserved slot, or running after a parking). The other
// worker's reaper rescues the victim's jobs and slots. Every job is done
// exactly once (its row completed once, by the worker running its last
// attempt), none is lost or left parked, the limit held in every sample,
// and every sample shows concurrency_limits.admitted equal to the slot rows
// plus the leased slots. It logs how long the rescue took.
func TestKillDuringParkAndResume(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	h := newHarness(t, testdb.New(t))
	h.installAudit()
	h.ok("limits", "set", "demo.sleep", strconv.Itoa(parkKillLimit))
	args := append(append([]string{}, deadWorkerRescue.workerArgs...), "--park-after", "20ms")
	victim := h.worker("victim", args...)
	rescuer := h.worker("rescuer", args...)

	slots := h.sampleMax(slotsTakenSQL, 10*time.Millisecond)
	countsOff := h.sampleMax(slotCountsOffSQL, 10*time.Millisecond)
	const tag = "pk"
	h.insertTagged(tag, parkKillFirst, parkKillMS)
	// The trickle: new jobs keep arriving, and parking, until the kill.
	var inserted atomic.Int64
	inserted.Store(parkKillFirst)
	stopTrickle := make(chan struct{})
	trickled := make(chan struct{})
	go func() {
		defer close(trickled)
		for n := int64(parkKillFirst); n+parkKillTrickle <= parkKillMax; n += parkKillTrickle {
			select {
			case <-stopTrickle:
				return
			case <-time.After(parkKillEvery):
			}
			if err := h.insertTaggedFrom(tag, int(n), parkKillTrickle, parkKillMS); err != nil {
				t.Errorf("trickle: %v", err)
				return
			}
			inserted.Store(n + parkKillTrickle)
		}
	}()

	// The moment to kill: jobs parked, the victim parking some (running,
	// marked for parking: the parking not yet completed) and running
	// others after their resume, or resumed jobs waiting to be fetched.
	// That moment is rare: a resumed job is not parked again, and new jobs
	// park at their fetch behind the parked ones, so after the first batch
	// only jobs that waited out --park-after in a line park in place. After
	// a second, any moment with jobs parked and the victim at work will do
	// (the backlog drains within a few seconds on an idle machine).
	snapshot := func() parkingSnapshot {
		var s parkingSnapshot
		require.NoError(t, h.pool.QueryRow(ctx, `
			SELECT
			  (SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND state = 'completed'),
			  (SELECT count(*) FROM concurrency_parked_jobs p JOIN river_job j ON j.id = p.job_id WHERE j.state = 'pending'),
			  (SELECT count(*) FROM concurrency_executions e JOIN river_job j ON j.id = e.job_id WHERE e.reserved AND j.state = 'available'),
			  (SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND state = 'running' AND attempted_by[array_upper(attempted_by, 1)] = 'victim'),
			  (SELECT count(*) FROM river_job j WHERE j.kind = 'demo.sleep' AND j.state = 'running' AND j.attempted_by[array_upper(j.attempted_by, 1)] = 'victim'
			      AND EXISTS (SELECT 1 FROM test_audit a WHERE a.job_id = j.id AND a.old_state = 'pending' AND a.new_state = 'available')),
			  (SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND state = 'running' AND metadata ? 'sluice_park' AND attempted_by[array_upper(attempted_by, 1)] = 'victim')`).
			Scan(&s.completed, &s.parked, &s.resumedWaiting, &s.victimRunning, &s.victimResumed, &s.victimParking))
		return s
	}
	var at parkingSnapshot
	watching := time.Now()
	for {
		at = snapshot()
		ideal := at.completed >= parkKillFirst/5 && at.parked > 0 && at.victimParking > 0 && (at.victimResumed > 0 || at.resumedWaiting > 0)
		enough := time.Since(watching) > time.Second && at.completed >= parkKillFirst/5 && at.parked > 0 && at.victimRunning > 0
		if ideal || enough {
			break
		}
		require.Less(t, time.Since(watching), 2*time.Minute, "no moment with jobs parked and the victim at work: %+v", at)
		time.Sleep(2 * time.Millisecond)
	}
	victim.Kill(t)
	killed := time.Now()
	close(stopTrickle)
	<-trickled
	n := int(inserted.Load())
	// Whether the victim led River: its leader-only maintenance (the
	// scheduler that makes rescued jobs available) moves to the rescuer.
	ledRiver := h.count(`SELECT count(*) FROM river_leader WHERE leader_id = 'victim'`) == 1
	t.Logf("killed the victim %s after the first jobs, at: %d jobs completed, %d parked, %d resumed and waiting to be fetched, victim running %d (%d of them resumed, %d being parked); %d jobs in; victim River's leader: %v",
		killed.Sub(watching).Round(time.Millisecond), at.completed, at.parked, at.resumedWaiting, at.victimRunning, at.victimResumed, at.victimParking, n, ledRiver)

	h.eventually(time.Minute, func() bool {
		return h.count(`SELECT count(*) FROM sluice_workers WHERE id = 'victim'`) == 0
	}, "the rescuer did not reap the victim")
	reaped := time.Since(killed)
	h.eventually(3*time.Minute, func() bool {
		return h.count(`SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND state = 'completed'`) == int64(n)
	}, "the jobs were not all done after the kill")
	allDone := h.lastCompletion("demo.sleep").Sub(killed)

	require.False(t, rescuer.Exited(), "the rescuer exited:\n%s", rescuer.Log())
	// The worker's log is read from its output as it comes: the line may
	// trail the reap it tells of.
	require.Eventually(t, func() bool { return strings.Contains(rescuer.Log(), "reaped dead worker") },
		10*time.Second, 10*time.Millisecond, "the reap is logged")
	rep := h.exactlyOnce(tag, n)
	require.LessOrEqual(t, slots.Stop(), int64(parkKillLimit), "the limit held in every sample")
	require.Zero(t, countsOff.Stop(), "admitted equals the slot rows plus the leased slots in every sample")
	require.Positive(t, slots.samples.Load())
	require.Positive(t, countsOff.samples.Load())
	h.requireExactlyOnce(rep)
	require.Zero(t, h.count(`
		SELECT count(*) FROM test_audit
		WHERE by_worker = 'victim' AND seq > (SELECT seq FROM test_audit WHERE deleted_worker = 'victim')`),
		"nothing of the victim's changed a job after its reap")
	// A job rescued from the victim carries the one error "worker victim
	// lost" per rescue; parking leaves no trace (its attempt is undone).
	require.Zero(t, h.count(`
		SELECT count(*) FROM river_job j
		WHERE j.kind = 'demo.sleep'
		  AND (cardinality(j.errors) <> j.attempt - 1
		       OR EXISTS (SELECT 1 FROM unnest(j.errors) AS e WHERE e->>'error' <> 'worker victim lost'))`),
		"attempts and errors: one attempt, plus one per rescue")
	rescued := h.count(`SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND cardinality(errors) > 0`)
	h.requireNothingLeft()
	resumes := h.count(`SELECT count(*) FROM test_audit a JOIN river_job j ON j.id = a.job_id WHERE j.kind = 'demo.sleep' AND a.old_state = 'pending' AND a.new_state = 'available'`)

	t.Logf("kill -9 during park and resume: %s; %d jobs rescued from the victim, %d resumes in all; max slots taken %d (limit %d, %d samples)",
		rep, rescued, resumes, slots.max.Load(), parkKillLimit, slots.samples.Load())
	// No job is rescued when the victim held only jobs waiting for a slot
	// at the kill: the reap parks those (their attempts undone).
	var firstRescued *time.Time
	require.NoError(t, h.pool.QueryRow(ctx, `
		SELECT min(a.at) FROM test_audit a JOIN river_job j ON j.id = a.job_id
		WHERE a.new_state = 'completed' AND j.kind = 'demo.sleep' AND cardinality(j.errors) > 0`).Scan(&firstRescued))
	firstDone := "none rescued"
	if firstRescued != nil {
		firstDone = firstRescued.Sub(killed).Round(time.Millisecond).String() + " after it"
	}
	t.Logf("time to recover: victim reaped %s after the kill, first rescued job done: %s, every job done %s after it",
		reaped.Round(time.Millisecond), firstDone, allDone.Round(time.Millisecond))
}
