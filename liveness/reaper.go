package liveness

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river/rivertype"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/kinds"
	"github.com/sluice-dev/sluice/limiter"
)

// Reaper constants.
const (
	// terminateWaitMs is how long the reaper waits for each backend of a
	// dead worker it terminates to exit.
	terminateWaitMs = 5000
	// reapTimeout bounds the reap of one dead worker.
	reapTimeout = 30 * time.Second
)

// errReaperBusy: another worker's reaper holds the reaper lock.
var errReaperBusy = errors.New("another reaper is at work")

// reaper rescues the running jobs and concurrency slots of dead workers. It
// runs on every worker, every heartbeat interval; its rules:
//
//   - a worker is dead when its heartbeat is older than its own dead-after
//     (declared in its row, at least three of its heartbeat intervals), by
//     the database's clock;
//   - a reaper never reaps its own worker, and acts only while its own row
//     is alive;
//   - a reaper reaps a worker only after its own worker has been
//     heartbeating successfully, without a gap, for at least that worker's
//     dead-after: during a database outage every heartbeat goes stale, and
//     afterwards each worker has had dead-after to heartbeat again before
//     anyone may judge it;
//   - one reaper at a time (the transaction-level advisory lock
//     sluice.reaper), one dead worker per transaction.
//
// Reaping a worker, in one transaction: lock its row and check there that
// it is still dead (a worker that heartbeated since is left alone); only
// then terminate its backends (frees the session advisory locks, row locks
// and reaper lock a stopped process still holds, and cuts a paused process
// off); take the reaper lock; lock the limit rows of its kinds, rescue its running jobs as River's rescuer would
// (RescueWorkerJobs), free their concurrency slots and every slot
// recorded for it, resume parked jobs into the freed slots, mark its running
// maintenance runs failed, resign its River leadership (if it led: River's
// leader-only maintenance, the scheduler that makes the rescued jobs
// available among it, would otherwise wait for the dead leader's term to
// expire), and delete its row.
type reaper struct {
	pool     *pgxpool.Pool
	limiter  *limiter.Limiter
	registry *kinds.Registry
	live     *liveness
	logger   *slog.Logger
	metrics  *reaperMetrics
}

// deadWorker is a worker row to reap.
type deadWorker struct {
	ID, Incarnation, Host string
	Pid                   int32
	BackendName           *string
	HeartbeatAge          time.Duration
}

// reapResult is what reaping one worker did.
type reapResult struct {
	Rescued         []RescuedJob
	Slots           limiter.SlotReleaseResult
	MaintenanceRuns []int64
	Terminated      int
	// ResignedLeader: the dead worker was River's leader, and resigned.
	ResignedLeader bool
}

// run reaps every heartbeat interval until ctx is done.
func (r *reaper) run(ctx context.Context) {
	ticker := time.NewTicker(r.live.interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.live.Reaped():
			return
		case <-ticker.C:
			if _, err := r.pass(ctx); err != nil && ctx.Err() == nil {
				r.metrics.errors.Inc()
				r.logger.Warn("reaper pass failed", "error", err)
			}
		}
	}
}

// pass reaps the workers that are dead now, under the rules above, and
// returns how many it reaped.
func (r *reaper) pass(ctx context.Context) (int, error) {
	streak := r.live.streak(time.Now())
	if streak <= 0 || r.live.isReaped() {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(ctx, reapTimeout)
	defer cancel()
	q := db.New(r.pool)
	rows, err := q.DeadWorkers(ctx, db.DeadWorkersParams{
		Streak: interval(streak), Me: r.live.id, Incarnation: r.live.incarnation,
	})
	if err != nil {
		return 0, fmt.Errorf("find dead workers: %w", err)
	}
	reaped := 0
	for _, row := range rows {
		d := deadWorker{ID: row.ID, Incarnation: row.Incarnation, Host: row.Host, Pid: row.Pid,
			BackendName: row.BackendName, HeartbeatAge: time.Duration(row.HeartbeatAgeSeconds * float64(time.Second))}
		ok, err := r.reap(ctx, d)
		if errors.Is(err, errReaperBusy) {
			return reaped, nil
		}
		if err != nil {
			return reaped, err
		}
		if ok {
			reaped++
		}
	}
	return reaped, nil
}

// reap reaps the dead worker d; false when there was nothing to reap (it
// came back, or another reaper took it).
func (r *reaper) reap(ctx context.Context, d deadWorker) (bool, error) {
	logger := r.logger.With("dead_worker_id", d.ID, "dead_worker_host", d.Host, "dead_worker_pid", d.Pid)
	var res *reapResult
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		var err error
		res, err = r.reapTx(ctx, tx, d, false)
		return err
	})
	if err != nil {
		return false, err
	}
	if res == nil {
		return false, nil
	}
	r.record(logger, d, res)
	return true, nil
}

// reapTx is the transaction of a reap. It returns nil when the row is no
// longer there to reap. unfenced clears the session's worker id for the
// transaction (for a process taking over its own id, whose new incarnation
// is not registered yet).
func (r *reaper) reapTx(ctx context.Context, tx pgx.Tx, d deadWorker, unfenced bool) (*reapResult, error) {
	q := db.New(tx)
	if unfenced {
		if err := q.ClearWorkerSetting(ctx); err != nil {
			return nil, fmt.Errorf("clear worker setting: %w", err)
		}
	}
	// First the dead worker's row, locked and checked dead inside this
	// transaction: a worker that heartbeated since is not touched. Its
	// heartbeat now waits for this transaction and finds its row gone.
	row, err := q.LockDeadWorker(ctx, db.LockDeadWorkerParams{ID: d.ID, Incarnation: d.Incarnation})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("lock dead worker %s: %w", d.ID, err)
	}
	res := &reapResult{}
	if row.BackendName != nil {
		// Only now, the worker known dead: its backends go, with the locks
		// a stopped process still holds (session advisory locks of
		// maintenance runs, row locks of an open transaction, the reaper
		// lock of a reaper that stopped mid-reap). What it reconnects
		// meanwhile waits for this transaction (afterConnect) and is
		// refused after it.
		n, err := q.TerminateBackends(ctx, db.TerminateBackendsParams{AppName: *row.BackendName, WaitMs: terminateWaitMs})
		if err != nil {
			return nil, fmt.Errorf("terminate backends of %s: %w", d.ID, err)
		}
		res.Terminated = int(n)
	}
	acquired, err := q.TryReaperLock(ctx)
	if err != nil {
		return nil, fmt.Errorf("reaper lock: %w", err)
	}
	if !acquired {
		return nil, errReaperBusy
	}
	jobKinds, err := q.WorkerJobKinds(ctx, d.ID)
	if err != nil {
		return nil, fmt.Errorf("kinds of %s's jobs: %w", d.ID, err)
	}
	slots, err := r.limiter.LockSlotsOf(ctx, tx, d.ID, jobKinds)
	if err != nil {
		return nil, err
	}
	res.Rescued, err = RescueWorkerJobs(ctx, tx, r.registry, d.ID, time.Now())
	if err != nil {
		return nil, err
	}
	ids := make([]int64, len(res.Rescued))
	for i, job := range res.Rescued {
		ids[i] = job.ID
	}
	res.Slots, err = slots.Release(ctx, ids)
	if err != nil {
		return nil, err
	}
	runs, err := q.FailWorkerMaintenanceRuns(ctx, db.FailWorkerMaintenanceRunsParams{
		WorkerID: d.ID, Reason: WorkerLostError(d.ID),
	})
	if err != nil {
		return nil, fmt.Errorf("fail maintenance runs of %s: %w", d.ID, err)
	}
	for _, run := range runs {
		res.MaintenanceRuns = append(res.MaintenanceRuns, run.ID)
	}
	resigned, err := q.ResignWorkerLeadership(ctx, d.ID)
	if err != nil {
		return nil, fmt.Errorf("resign River leadership of %s: %w", d.ID, err)
	}
	res.ResignedLeader = len(resigned) > 0
	if _, err := q.DeleteDeadWorker(ctx, db.DeleteDeadWorkerParams{ID: d.ID, Incarnation: d.Incarnation}); err != nil {
		return nil, fmt.Errorf("delete worker row %s: %w", d.ID, err)
	}
	return res, nil
}

// record logs and counts a reap.
func (r *reaper) record(logger *slog.Logger, d deadWorker, res *reapResult) {
	byState := map[rivertype.JobState][]int64{}
	for _, job := range res.Rescued {
		byState[job.State] = append(byState[job.State], job.ID)
		r.metrics.jobs.WithLabelValues(job.Kind, string(job.State)).Inc()
	}
	released := 0
	for kind, n := range res.Slots.Released {
		released += n
		r.metrics.slots.WithLabelValues(kind).Add(float64(n))
	}
	resumed := 0
	for _, n := range res.Slots.Resumed {
		resumed += n
	}
	r.metrics.workers.Inc()
	r.metrics.backends.Add(float64(res.Terminated))
	logger.Warn("reaped dead worker: its jobs and concurrency slots are rescued",
		"heartbeat_age", d.HeartbeatAge.Round(time.Millisecond).String(),
		"jobs_retryable", byState[rivertype.JobStateRetryable],
		"jobs_discarded", byState[rivertype.JobStateDiscarded],
		"jobs_cancelled", byState[rivertype.JobStateCancelled],
		"jobs_parked", byState[rivertype.JobStatePending],
		"slots_released", released,
		"parked_resumed", resumed,
		"maintenance_runs_failed", res.MaintenanceRuns,
		"river_leader_resigned", res.ResignedLeader,
		"backends_terminated", res.Terminated)
}

// reaperMetrics are the Prometheus metrics of a worker's liveness: its
// heartbeat and its reaper.
type reaperMetrics struct {
	heartbeat prometheus.Gauge
	workers   prometheus.Counter
	jobs      *prometheus.CounterVec
	slots     *prometheus.CounterVec
	backends  prometheus.Counter
	errors    prometheus.Counter
}

// init creates a kind's series at 0: its rescues in every new state and its
// released slots.
func (m *reaperMetrics) init(kind string) {
	for _, state := range []rivertype.JobState{rivertype.JobStateRetryable, rivertype.JobStateDiscarded, rivertype.JobStateCancelled} {
		m.jobs.WithLabelValues(kind, string(state))
	}
	m.slots.WithLabelValues(kind)
}

func newReaperMetrics(reg prometheus.Registerer) (*reaperMetrics, error) {
	m := &reaperMetrics{
		heartbeat: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_worker_heartbeat_timestamp_seconds",
			Help: "When this worker's last successful heartbeat was written (Unix time).",
		}),
		workers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_reaper_workers_reaped_total",
			Help: "Dead workers this worker's reaper reaped.",
		}),
		jobs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_reaper_jobs_rescued_total",
			Help: "Running jobs of dead workers rescued by this worker's reaper, by kind and new state (retryable, discarded, cancelled).",
		}, []string{"kind", "state"}),
		slots: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_reaper_slots_released_total",
			Help: "Concurrency slots of dead workers released by this worker's reaper, by kind.",
		}, []string{"kind"}),
		backends: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_reaper_backends_terminated_total",
			Help: "Database backends of dead workers terminated by this worker's reaper.",
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_reaper_errors_total",
			Help: "Reaper passes of this worker that failed (retried at the next heartbeat interval).",
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.heartbeat, m.workers, m.jobs, m.slots, m.backends, m.errors} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register reaper metrics: %w", err)
		}
	}
	return m, nil
}
