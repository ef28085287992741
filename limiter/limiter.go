// Package limiter enforces sluice's limits across every worker: at most N
// running jobs of a kind (concurrency_limits.max_concurrency), at most N per
// key of args fields (key_max), at most N starts in any window (rate_max per
// rate_period), all at once. A job that cannot start waits in the kind's
// line: in its worker for a while, then parked in place (the same river_job
// row, pending).
//
// Who goes next is decided in two places, and every path asks them: in the
// database, the ledger (internal/ledger), through which every transaction
// that changes slots goes, under the kind's lock (or, under per-key limits
// alone, its keys' locks); and in each worker, one queue per kind
// (internal/local), its jobs in the line's order, each in exactly one state,
// which every slot given in memory (a leased slot, a slot handed over) asks
// for its front. This package is the public face: the middleware, River's
// driver wrapped to decide jobs at their fetch, the background services, and
// the administration of limits.
package limiter

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/limiter/internal/ledger"
	"github.com/sluice-dev/sluice/limiter/internal/local"
)

// ErrNoSlot is the error of a job that found no slot where parking is not
// an option (sluice run: its slot, reserved before the job started, was
// lost, for instance to a circuit breaker set meanwhile).
var ErrNoSlot = errors.New("no concurrency slot free, and this process does not park jobs")

// Concurrency-limit constants.
const (
	// DefaultParkAfter is how long a job of a limited kind waits in its
	// worker for a slot before it parks.
	DefaultParkAfter = time.Second
	// LimitCacheTTL is how long a worker trusts its copy of the limits
	// while its limits listener is not connected (connected, a change
	// expires it at once).
	LimitCacheTTL = time.Second
	// MaxResumeBatch caps how many parked jobs one transaction resumes when
	// the kind has no limit left.
	MaxResumeBatch = ledger.MaxResumeBatch
	// Lookahead is how many parked jobs of a kind a grant round keeps
	// resumed ahead of its free slots, under a concurrency limit and no
	// rate (per key the key's limit, at most Lookahead).
	Lookahead = ledger.Lookahead
	// ReservedSlotTTL is how long a slot granted to a resumed job waits for
	// the job to be fetched; concurrency_limit.resume then frees it (the
	// job, when fetched later, waits in the line again).
	ReservedSlotTTL = 30 * time.Second
	// StaleSlotGrace is how long a slot a worker holds for a job no longer
	// running stays after concurrency_limit.resume first finds it so: it
	// frees it at a later run, when it is still so (the worker may have
	// handed it over in memory to the next job of its line, and not yet
	// written the move).
	StaleSlotGrace = 500 * time.Millisecond
	// decideTimeout bounds a decision's or a release's wait for the ledger.
	decideTimeout = 30 * time.Second
)

// Limiter enforces the limits of concurrency_limits. It is the outermost
// worker middleware of every sluice client (a job of a kind without a
// limit passes through after an in-memory lookup), wraps River's driver so
// that the jobs of a fetch are decided together before River runs them,
// and runs the services that keep a worker's side of the limits: the
// listener (limits, grants and reservations whose job went), the grant watch, the lease keeper, the
// release batcher and the timers of rate windows and rechecks. Start starts
// them; Flush stops them.
type Limiter struct {
	river.MiddlewareDefaults

	// TestSignals let tests wait for background work (no-ops otherwise).
	TestSignals TestSignals

	pool         *pgxpool.Pool
	logger       *slog.Logger
	metrics      *Metrics
	workerID     string
	parkAfter    time.Duration
	ignoreLimits bool // every job runs without a slot (sluice run --ignore-limit)
	neverPark    bool // no leases, no waiting, no parking: a job without a slot fails (sluice run)

	q      *db.Queries
	ledger *ledger.Ledger
	// client inserts concurrency_limit.resume jobs (SetClient; nil: none).
	client atomic.Pointer[river.Client[pgx.Tx]]

	limits   *limitsCopy
	queues   queues
	strays   strays
	deciders deciders
	releaser batcher[releaseRequest]
	// unreleased are the releases that failed (releaseBatch's own).
	unreleased unreleased
	keeper     *keeper
	grants     *grantWatch
	wakes      rateWakes
	rechecks   rechecks
	went       goneReservations
	gate       fetchGate

	parkedTotal atomic.Int64 // parkings by this limiter, every kind

	mu      sync.Mutex
	started bool
	stopped bool
	stopCh  chan struct{} // closed by Flush: the background work stops
	cancel  context.CancelFunc
	bg      sync.WaitGroup
}

// Config configures a Limiter.
type Config struct {
	// Pool is the database pool.
	Pool *pgxpool.Pool
	// Logger receives the limiter's log lines.
	Logger *slog.Logger
	// Metrics counts parkings and resumes; nil: metrics on a private
	// registry.
	Metrics *Metrics
	// WorkerID names this process's leases, slots and waiting jobs (River's
	// client ID); empty: an id of its own.
	WorkerID string
	// IgnoreLimits lets every job run without a slot (sluice run
	// --ignore-limit).
	IgnoreLimits bool
	// NeverPark fails a job that finds no slot instead of letting it wait
	// or park, and takes no leases (sluice run, whose job reserved its slot
	// before it started).
	NeverPark bool
	// ParkAfter is how long a job of a limited kind waits in its worker for
	// a slot before it parks (default DefaultParkAfter), unless its line
	// there moves fast enough to start it within another ParkAfter
	// (local.Queue.StartsSoon): then it waits on.
	ParkAfter time.Duration
	// Keeper and Grants configure the lease keeper and the grant watch
	// (zero: their defaults).
	Keeper KeeperConfig
	Grants GrantWatchConfig
}

// New returns a Limiter on cfg, its services not started (Start).
func New(cfg Config) (*Limiter, error) {
	if cfg.Pool == nil {
		return nil, errors.New("limiter: a Limiter needs a pool")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		m, err := NewMetrics(nil)
		if err != nil {
			return nil, err
		}
		cfg.Metrics = m
	}
	if cfg.ParkAfter <= 0 {
		cfg.ParkAfter = DefaultParkAfter
	}
	workerID := cfg.WorkerID
	if workerID == "" {
		// Leases are per worker: a process without an id gets one of its own.
		var b [6]byte
		_, _ = rand.Read(b[:])
		workerID = "limiter-" + hex.EncodeToString(b[:])
	}
	l := &Limiter{pool: cfg.Pool, q: db.New(pgkit.CustomPlans(cfg.Pool)), logger: cfg.Logger, metrics: cfg.Metrics,
		workerID: workerID, parkAfter: cfg.ParkAfter, ignoreLimits: cfg.IgnoreLimits, neverPark: cfg.NeverPark,
		stopCh: make(chan struct{})}
	// Another worker's fetch in flight counts as holding jobs fetched at its
	// start once it could hold one fetched more than the line's fetch
	// tolerance before a job here that a fresh view lets go (a view is
	// fresh for TakeFresh).
	l.ledger = ledger.New(ledger.Config{Pool: cfg.Pool, WorkerID: workerID, Logger: cfg.Logger,
		FetchInFlight: local.LineFetchTolerance - local.TakeFresh})
	l.limits = newLimitsCopy(l)
	l.queues.all = map[string]*local.Queue{}
	l.deciders.l = l
	l.releaser.process, l.releaser.maxInFlight = l.releaseBatch, 1
	l.keeper = newKeeper(l, cfg.Keeper)
	l.grants = newGrantWatch(l, cfg.Grants)
	l.wakes.l = l
	l.rechecks.l = l
	l.went.l = l
	l.gate.l = l
	return l, nil
}

// Start starts the limiter's services, for a process that works jobs: the
// listener (limits and grants), the grant watch and the lease keeper. It
// is a no-op when started already, or stopped.
func (l *Limiter) Start(ctx context.Context) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.started || l.stopped {
		return
	}
	l.started = true
	ctx, l.cancel = context.WithCancel(context.WithoutCancel(ctx))
	for _, run := range []func(context.Context){l.listen, l.grants.run, l.keeper.run} {
		l.bg.Add(1)
		go func() {
			defer l.bg.Done()
			run(ctx)
		}()
	}
}

// SetClient gives the limiter a River client: a change of a kind's limits
// then schedules the safety net for the kind (concurrency_limit.resume,
// inserted in the change's transaction) while jobs of it still wait, so
// that a worker looks after them at once: the timers of rate windows live
// in the workers, not in the process that changed the limits.
func (l *Limiter) SetClient(client *river.Client[pgx.Tx]) { l.client.Store(client) }

// ParkedTotal is how many jobs this limiter has parked, of every kind.
func (l *Limiter) ParkedTotal() int64 { return l.parkedTotal.Load() }

// Flush stops the limiter's services: it gives back the worker's leased
// slots, stops the rate timers and the retries of failed releases, and
// waits until the slot releases of jobs that ended have been written (a
// release that failed is tried once more). Call it once the worker's jobs
// have ended.
func (l *Limiter) Flush() {
	l.mu.Lock()
	first := !l.stopped
	l.stopped = true
	if first {
		close(l.stopCh)
	}
	cancel := l.cancel
	l.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	l.bg.Wait() // the keeper gave back its leased slots
	l.strays.clear()
	l.wakes.stop()
	l.rechecks.stop()
	l.releaser.submitAsync(&releaseRequest{retry: true}) // a release that failed: one more try
	l.releaser.flush()
}

// isStopped reports whether Flush has run.
func (l *Limiter) isStopped() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stopped
}

// Forget frees the slot this limiter holds, or an unclaimed reservation,
// for job jobID of kind, at once (a job that will not run, or has run:
// sluice run cleans up with it).
func (l *Limiter) Forget(ctx context.Context, kind string, jobID int64) error {
	if _, err := l.ledger.Release(ctx, ledger.Release{Forgotten: []ledger.Held{{ID: jobID, Kind: kind}}},
		l.limits.guess(ctx, []string{kind})); err != nil {
		return fmt.Errorf("free the slot of job %d: %w", jobID, err)
	}
	return nil
}

// queues are the worker's local queues, one per limited kind.
type queues struct {
	mu  sync.Mutex
	all map[string]*local.Queue
}

// of returns kind's queue, made if missing.
func (qs *queues) of(kind string) *local.Queue {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	q := qs.all[kind]
	if q == nil {
		q = local.NewQueue(kind)
		qs.all[kind] = q
	}
	return q
}

// get returns kind's queue (nil: none).
func (qs *queues) get(kind string) *local.Queue {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	return qs.all[kind]
}

// each calls fn for every queue.
func (qs *queues) each(fn func(q *local.Queue)) {
	qs.mu.Lock()
	all := make([]*local.Queue, 0, len(qs.all))
	for _, q := range qs.all {
		all = append(all, q)
	}
	qs.mu.Unlock()
	for _, q := range all {
		fn(q)
	}
}

// waiting counts the jobs waiting in this worker (Queued or Lined), every
// kind.
func (qs *queues) waiting() int {
	n := 0
	qs.each(func(q *local.Queue) {
		queued, lined := q.Waiting()
		n += queued + lined
	})
	return n
}

// grant ends the wait of job id, Lined in this worker, with a grant
// (slot: what it holds; startClaimed: a start reserved with it is logged
// already); false when no queue has it Lined (one deciding takes it at its
// decision).
func (qs *queues) grant(id int64, slot local.Slot, startClaimed bool, heard uint64) bool {
	granted := false
	qs.each(func(q *local.Queue) {
		if q.Get(id) != nil && q.Grant(id, slot, startClaimed, heard) {
			granted = true
		}
	})
	return granted
}

// kindOf is the kind of job id, if a queue holds it ("": none).
func (qs *queues) kindOf(id int64) string {
	kind := ""
	qs.each(func(q *local.Queue) {
		if q.Get(id) != nil {
			kind = q.Kind()
		}
	})
	return kind
}

// jobGrant is a grant to a job waiting in this worker: what it holds.
type jobGrant struct {
	id   int64
	slot local.Slot
}

// grantJobs ends the waits of jobs Lined in this worker with their grants,
// and returns those it woke. The starts reserved with grants of kinds
// under a rate are logged first, in one statement for them all, so that
// the jobs granted together start together (each claiming its own before
// it began would queue them on the pool); a job decided meanwhile finds
// its start logged by its attempt, and one whose start went before the
// claim is decided again rather than woken. tags are the Tags of the limits each
// kind's grants were made under, when known: a job granted under the
// limits the worker's copy holds begins without being decided again for a
// change heard before its grant (limitCameAfter).
func (l *Limiter) grantJobs(gs []jobGrant, tags map[string]string) []int64 {
	ctx, cancel := context.WithTimeout(context.Background(), decideTimeout)
	defer cancel()
	rated := map[int64]bool{}
	heard := map[int64]uint64{}
	kindRated := map[string]bool{} // each kind's limits looked up once
	kindHeard := map[string]uint64{}
	for _, g := range gs {
		kind := l.queues.kindOf(g.id)
		if kind == "" {
			continue
		}
		r, ok := kindRated[kind]
		if !ok {
			lim, err := l.limits.of(ctx, kind)
			r = err == nil && lim.RateMax > 0
			kindRated[kind] = r
			if tag, ok := tags[kind]; ok {
				kindHeard[kind] = l.limits.heldAs(ctx, kind, tag)
			}
		}
		if r {
			rated[g.id] = true
		}
		heard[g.id] = kindHeard[kind]
	}
	claimed := false
	var got map[int64]bool // the jobs whose starts the claim found
	if len(rated) > 0 {
		ids := make([]int64, 0, len(rated))
		for _, g := range gs {
			if rated[g.id] {
				ids = append(ids, g.id)
			}
		}
		if ok, err := l.ledger.ClaimStarts(ctx, ids); err != nil {
			l.logger.Warn("concurrency limits: starts of granted jobs not logged; each logs its own", "error", err)
		} else {
			claimed, got = true, make(map[int64]bool, len(ok))
			for _, id := range ok {
				got[id] = true
			}
		}
	}
	var out []int64
	for _, g := range gs {
		if claimed && rated[g.id] && !got[g.id] {
			// Its start went before the claim (an older job of its line took
			// it as it was decided, or a change took it back): it waits in
			// the line again, and its worker decides it again.
			l.queues.redecide(g.id)
			l.trace("grant gone", "job_id", g.id)
			continue
		}
		ok := l.queues.grant(g.id, g.slot, claimed && rated[g.id], heard[g.id])
		if ok {
			out = append(out, g.id)
		}
		l.trace("granted", "job_id", g.id, "slot", int(g.slot), "woken", ok)
	}
	return out
}

// redecide sends job id, waiting in this worker, to be decided again.
func (qs *queues) redecide(id int64) {
	qs.each(func(q *local.Queue) {
		if q.Get(id) != nil {
			q.Redecide(id)
		}
	})
}

// trace logs a step of a job's way through the limiter at debug level
// (for diagnosis: the torture test's TORTURE_WORKER_LOGS with
// TORTURE_DEBUG).
func (l *Limiter) trace(msg string, args ...any) {
	if l.logger.Enabled(context.Background(), slog.LevelDebug) {
		l.logger.Debug("concurrency limits: "+msg, args...)
	}
}
