// Package limiter enforces sluice's limits across every worker: at most N
// running jobs of a kind (concurrency_limits.max_concurrency), at most N per
// key of args fields (key_max), at most N starts in any window (rate_max per
// rate_period), all at once. A job that cannot start waits in the kind's
// line: in its worker for a while, then parked in place (the same river_job
// row, pending). The line has one order, decided in one place: under the
// kind's limit row lock, in job-id order within a key and round-robin
// across keys, every free slot goes to the front of the line as a grant.
// The Limiter is the outermost worker middleware of every sluice client;
// ResumeWorker (concurrency_limit.resume) is its safety net.
package limiter

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/sluice-dev/sluice/db"
)

// ErrNoSlot is the error of a job that found no slot where parking is not
// an option (sluice run: its slot, reserved before the job started, was
// lost, for instance to a circuit breaker set meanwhile).
var ErrNoSlot = errors.New("no concurrency slot free, and this process does not park jobs")

// Concurrency-limit constants.
const (
	// LimitCacheTTL is how long a worker trusts its copy of the
	// concurrency_limits table: a new or removed limit takes effect within it.
	LimitCacheTTL = time.Second
	// MaxResumeBatch caps how many parked jobs one resume makes available
	// when the kind has no limit left.
	MaxResumeBatch = 5000
	// ReservedSlotTTL is how long a slot granted to a resumed job waits for
	// the job to be fetched; concurrency_limit.resume then frees it (the job,
	// when fetched later, waits in the line again).
	ReservedSlotTTL = 30 * time.Second
	// batchesInFlight is how many admission (and release) transactions a
	// worker runs at once. They all queue for the kind's row lock: one at a
	// time lets the next batch gather every request that arrived meanwhile,
	// fewer and larger transactions under the lock (P10: 2,100 jobs/s, 1,600
	// with two in flight).
	batchesInFlight = 1
	// lineChunk caps the jobs one admission transaction decides.
	lineChunk = 512
	// batchTimeout bounds one admission or release transaction.
	batchTimeout = 30 * time.Second
)

// parkRechecks are the delays after a parking at which the Limiter runs a
// grant round for the kind: a parked job can be resumed only once River's
// completer has written its parking (every 50 ms or sooner), so a slot
// freed in between would otherwise wait for the next release or for
// concurrency_limit.resume.
var parkRechecks = []time.Duration{75 * time.Millisecond, 250 * time.Millisecond, time.Second}

// admission is what the limiter decided for a job.
type admission int

const (
	admitRun    admission = iota // runs without a slot: no limit, or only a rate (its start is logged)
	admitSlot                    // runs, and holds a slot until it ends
	admitParked                  // parked in place: back to pending, not run
	admitWait                    // waits in its worker, in the line, for a grant
)

// Limiter enforces the limits of concurrency_limits. It is the worker
// middleware of every job (a job of a kind without a limit passes through
// after an in-memory lookup), and does the grants for the release path and
// concurrency_limit.resume.
//
// A kind with only a per-kind limit and an empty line runs on the worker's
// leased slots (leaser): slots held in bulk and handed from one job to the
// next in memory, no statement per job. Every other decision is the line's
// (line.go): group-committed admission transactions lock the kinds' limit
// rows, read each kind's line, admit what its limits and its order allow,
// and put the rest in the line, waiting in the worker (waiters.go) or
// parked. A slot that frees goes to the front of the line (grant.go):
// claimed at once by a job waiting in the worker that freed it, taken by a
// job waiting in another worker at its next poll, or reserved for a parked
// job, resumed. Under a per-kind limit alone, a job that ends hands its
// slot to the oldest job of its kind waiting in its worker in memory
// (handover.go), the move written with the next release batch. Parking marks the running job and records it, in the
// admission's transaction; River's own completion of the job then turns it
// into a pending job (trigger sluice_park_in_place), the same row with its
// attempt undone.
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

	q *db.Queries
	// pollQ runs the line poller's statements on cached generic plans: they
	// run every LinePoll and read small tables by their keys.
	pollQ  *db.Queries
	leases *leaser
	// client inserts concurrency_limit.resume jobs (SetClient; nil: none).
	client atomic.Pointer[river.Client[pgx.Tx]]

	// cache is the worker's copy of concurrency_limits, read without a lock
	// by every job; refreshMu lets one job refresh it at a time. The
	// limits listener expires it whenever a kind's limits change.
	cache     atomic.Pointer[limitCache]
	refreshMu sync.Mutex
	limits    limitListener
	// limitsGen counts the changes the listener heard: a copy read while
	// one came in is stored expired.
	limitsGen atomic.Uint64

	line     batcher[admitRequest]   // admissions (line.go)
	releaser batcher[releaseRequest] // releases and grant rounds (release.go)
	wakes    rateWakes               // grant rounds timed to the rate windows (rate_wake.go)
	waits    waitList                // jobs waiting in this worker for a grant (waiters.go)
	gate     fetchGate               // fetches no more than can start soon (fetch_gate.go)
	decided  decisions               // decisions made at fetches, for the middleware (fetch.go)
	// handStates are the line poller's readings for hand-overs (handover.go).
	handStates handOvers
	// seen are the kinds' limits as the last transactions read them, to
	// send their next reads ahead (prefetch.go).
	seen seenLimits

	parkedTotal atomic.Int64 // parkings by this limiter, every kind

	recheckMu sync.Mutex
	rechecks  map[string]time.Time // kinds with a recheck chain running: their latest parking
	stopped   bool
	stopCh    chan struct{} // closed by Flush: retries of failed releases stop
}

// admitRequest is a job to decide: fetched, waiting, or (sluice run) about
// to be.
type admitRequest struct {
	ctx  context.Context
	job  *rivertype.JobRow
	key  string // the job's partition key ('' : none; keys.go)
	done chan struct{}
	// deadline is how long it may wait in its worker before it parks.
	deadline time.Time
	// since is when it started to wait, once its wait was extended (zero:
	// its deadline less the park-after time).
	since time.Time
	// timedOut: its wait is over; it takes a grant it got, or parks.
	timedOut bool
	// reserve: decide for a job not fetched yet, and reserve what it would
	// take (ReserveSlot, sluice run); never wait, never park.
	reserve bool
	// cancelled: JobCancel cancelled the job while it waited: it parks,
	// and the parking cancels it (it never ran; its attempt is undone).
	cancelled bool
	// giveBack: it gives back what the line held for it (a grant, its
	// place): it was decided not to run, or runs without a limit now.
	giveBack bool
	// takenAhead: resumed ahead and taken by this worker without a line
	// transaction (fetch.go, takeAhead).
	takenAhead bool

	decision admission
	reason   string // what holds it, when it waits or parked
	err      error
}

// releaseRequest frees the slot of job (nil: none) and gives the free
// capacity of kind to its line.
type releaseRequest struct {
	ctx  context.Context
	job  *rivertype.JobRow
	kind string
	// forget: the job gave up waiting (its context ended): it leaves the
	// line, and a grant it got goes back.
	forget bool
	// to: the job's slot was handed over to this job, waiting in this
	// worker (handover.go): the move is written.
	to *rivertype.JobRow
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
	// a slot before it parks (default DefaultParkAfter). A job waiting only
	// for its key waits on, a ParkAfter at a time, while its key admitted a
	// job within the last ParkAfter or has room (kindCounts.keyMoving).
	ParkAfter time.Duration
}

// New returns a Limiter on cfg.
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
	l := &Limiter{pool: cfg.Pool, q: db.New(db.CustomPlans(cfg.Pool)), pollQ: db.New(cfg.Pool), logger: cfg.Logger, metrics: cfg.Metrics, workerID: workerID,
		parkAfter: cfg.ParkAfter, ignoreLimits: cfg.IgnoreLimits, neverPark: cfg.NeverPark, stopCh: make(chan struct{})}
	l.leases = newLeaser(l, cfg.ParkAfter)
	l.line.process, l.line.maxInFlight = l.lineBatch, batchesInFlight
	l.releaser.process, l.releaser.maxInFlight = l.releaseBatch, batchesInFlight
	l.wakes.l = l
	l.waits.l = l
	l.gate.l = l
	l.limits.l = l
	return l, nil
}

// Work admits the job, lets it wait or parks it, and releases its slot when
// it ends, whatever the outcome. A job of a kind with only a per-kind limit
// first tries the worker's leased slots (waiting up to its park-after time
// for one); any other job of a limited kind goes through the line. A parked
// job returns nil without running: River's completion of it is what moves
// it to pending.
func (l *Limiter) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	if job.Kind == ResumeKind || l.ignoreLimits {
		return doInner(ctx) // never limited itself; or limits ignored
	}
	if req := l.takeDecided(job.ID); req != nil {
		// Decided with the jobs fetched with it (fetch.go).
		req.ctx = ctx
		return l.run(ctx, job, req, doInner)
	}
	st, ok, err := l.stateOf(ctx, job.Kind)
	if err != nil {
		return err
	}
	if !ok || (st.limit == 0 && !st.keyed) {
		return doInner(ctx)
	}
	req := &admitRequest{ctx: ctx, job: job, deadline: time.Now().Add(l.parkAfter)}
	if st.limit > 0 && !l.neverPark && l.leases.acquire(ctx, st, job.ID) {
		defer l.leases.release(job.Kind)
		if since := req.deadline.Add(-l.parkAfter); time.Since(since) >= leaseWaitShown {
			ctx = withHeld(ctx, Held{Since: since, Reason: reasonLimit})
		}
		return doInner(ctx)
	}
	if errors.Is(context.Cause(ctx), rivertype.ErrJobCancelledRemotely) {
		req.cancelled = true
	}
	req.done = make(chan struct{})
	l.decided.inTransit(req)
	l.line.submit(req, req.done)
	return l.run(ctx, job, req, doInner)
}

// run follows the line's decision for job (req decided): it waits for a
// grant while the decision is to wait, then runs the job (releasing its
// slot when it ends), or returns at once when it parked.
func (l *Limiter) run(ctx context.Context, job *rivertype.JobRow, req *admitRequest, doInner func(context.Context) error) error {
	decision, err := l.follow(req)
	l.decided.arrived(job.ID) // a decision to wait taken at the fetch is done with
	if err != nil {
		return fmt.Errorf("concurrency limit of %s: %w", job.Kind, err)
	}
	switch decision {
	case admitParked:
		return nil
	case admitSlot:
		l.handStates.hold(job.Kind, 1)
		defer l.endSlot(ctx, job)
	}
	if req.reason != "" {
		ctx = withHeld(ctx, Held{Since: l.waitedSince(req), Reason: req.reason})
	}
	return doInner(ctx)
}

// waitedSince is when req started to wait in its worker.
func (l *Limiter) waitedSince(req *admitRequest) time.Time {
	if !req.since.IsZero() {
		return req.since
	}
	return req.deadline.Add(-l.parkAfter)
}

// limitState is what a worker knows of a limited kind.
type limitState struct {
	kind        string
	limit       int32
	hasParked   bool
	hasReserved bool
	keyed       bool // a per-key or rate limit: every job goes through the keyed admission
}

// fast reports whether jobs of the kind may take leased slots: a positive
// limit, no parked jobs to go first, no reserved slots to be claimed, no
// per-key or rate limit.
func (s limitState) fast() bool { return s.limit > 0 && !s.hasParked && !s.hasReserved && !s.keyed }

// stateOf returns the limit state of kind from a cache refreshed every
// LimitCacheTTL, and at once when the limits listener hears of a change
// (ok false: no row). The cache only decides the path a job takes;
// admission and leasing read the locked row. The first call starts the
// listener (a process that works no job never listens).
func (l *Limiter) stateOf(ctx context.Context, kind string) (limitState, bool, error) {
	if !l.isStopped() {
		l.limits.start()
	}
	c := l.cache.Load()
	if c == nil || time.Since(c.loaded) > LimitCacheTTL {
		fresh, err := l.refreshCache(ctx, c)
		if err != nil {
			return limitState{}, false, err
		}
		c = fresh
	}
	st, ok := c.states[kind]
	return st, ok, nil
}

// limitCache is a copy of concurrency_limits, never changed once stored.
type limitCache struct {
	states map[string]limitState
	loaded time.Time
}

// refreshCache reloads the cache; stale is the copy the caller found (nil:
// none yet). Jobs that find the copy expired while another job reloads it
// wait for that reload, never use the expired copy: a worker idle for a
// while holds a copy of any age, and a kind it says has no limit would
// otherwise run unlimited however long ago a limit was set. Only when the
// reload fails is the last copy used, with a warning.
func (l *Limiter) refreshCache(ctx context.Context, stale *limitCache) (*limitCache, error) {
	l.refreshMu.Lock()
	defer l.refreshMu.Unlock()
	if c := l.cache.Load(); c != nil && time.Since(c.loaded) <= LimitCacheTTL {
		return c, nil // refreshed meanwhile
	}
	// A change heard while the copy is read may not be in it: read again
	// (a few times at most; the copy is stored expired if changes keep
	// coming).
	var c *limitCache
	for range 3 {
		gen := l.limitsGen.Load()
		rows, err := l.q.LimitStates(ctx)
		if err != nil {
			if stale == nil {
				return nil, fmt.Errorf("read concurrency limits: %w", err)
			}
			l.logger.Warn("concurrency limits not refreshed; using the last copy", "error", err)
			c := &limitCache{states: stale.states, loaded: time.Now()}
			l.cache.Store(c)
			return c, nil
		}
		c = &limitCache{states: make(map[string]limitState, len(rows)), loaded: time.Now()}
		for _, r := range rows {
			c.states[r.Kind] = limitState{kind: r.Kind, limit: r.MaxConcurrency, hasParked: r.HasParked, hasReserved: r.HasReserved,
				keyed: r.Keyed}
		}
		if l.limitsGen.Load() == gen {
			break
		}
		c.loaded = time.Time{}
	}
	l.cache.Store(c)
	return c, nil
}

// release frees the job's slot, and gives the kind's free capacity to its
// line, in the background: the job's worker goroutine does not wait for
// it. A release lost to a crash leaves a stale slot row, which
// concurrency_limit.resume (and the reaper of dead workers) cleans up;
// Flush waits for the releases still in flight on a clean stop.
func (l *Limiter) release(ctx context.Context, job *rivertype.JobRow) {
	l.releaser.submitAsync(&releaseRequest{ctx: context.WithoutCancel(ctx), job: job, kind: job.Kind})
}

// endSlot hands the slot of job, which ended, to a job of its kind waiting
// in this worker (handover.go), or releases it.
func (l *Limiter) endSlot(ctx context.Context, job *rivertype.JobRow) {
	l.handStates.hold(job.Kind, -1)
	if to := l.handOver(job); to != nil {
		l.releaser.submitAsync(&releaseRequest{ctx: context.WithoutCancel(ctx), job: job, kind: job.Kind, to: to.job})
		return
	}
	l.release(ctx, job)
}

// forget takes a job that gave up waiting (its context ended) out of the
// line, in the background, and gives back a grant it got meanwhile.
func (l *Limiter) forget(r *admitRequest) {
	l.releaser.submitAsync(&releaseRequest{ctx: context.WithoutCancel(r.ctx), job: r.job, kind: r.job.Kind, forget: true})
}

// Forget frees the slot this limiter holds, or an unclaimed reservation, for
// job jobID of kind, at once (a job that will not run, or has run: sluice
// run cleans up with it).
func (l *Limiter) Forget(ctx context.Context, kind string, jobID int64) error {
	if _, err := retryDeadlock(func() ([]*db.ReleaseJobsRow, error) {
		return l.q.ReleaseJobs(ctx, db.ReleaseJobsParams{Kinds: []string{kind}, JobIds: []int64{}, ForgetIds: []int64{jobID},
			WorkerID: l.workerID})
	}); err != nil {
		return fmt.Errorf("free the slot of job %d: %w", jobID, err)
	}
	return nil
}

// SetClient gives the limiter a River client: a change of a kind's limits
// then schedules the safety net for the kind (concurrency_limit.resume,
// inserted in the change's transaction) while jobs of it still wait, so
// that a worker looks after them at once: the timers of rate windows live
// in the workers, not in the process that changed the limits.
func (l *Limiter) SetClient(client *river.Client[pgx.Tx]) { l.client.Store(client) }

// ParkedTotal is how many jobs this limiter has parked, of every kind.
func (l *Limiter) ParkedTotal() int64 { return l.parkedTotal.Load() }

// Flush gives back the worker's leased slots, stops the rechecks after
// parkings, the rate timers and the retries of failed releases, and waits
// until the slot releases of jobs that ended have been written. Call it
// once the worker's jobs have ended.
func (l *Limiter) Flush() {
	l.leases.close()
	l.recheckMu.Lock()
	if !l.stopped && l.stopCh != nil {
		close(l.stopCh)
	}
	l.stopped = true
	l.recheckMu.Unlock()
	l.wakes.stop()
	l.waits.stop()
	l.limits.stop()
	l.releaser.flush()
}

// isStopped reports whether Flush has run.
func (l *Limiter) isStopped() bool {
	l.recheckMu.Lock()
	defer l.recheckMu.Unlock()
	return l.stopped
}

// recheck runs a grant round for kinds at each of parkRechecks after
// their latest parking, one chain per kind at a time.
func (l *Limiter) recheck(kinds []string) {
	l.recheckMu.Lock()
	defer l.recheckMu.Unlock()
	if l.stopped {
		return
	}
	if l.rechecks == nil {
		l.rechecks = map[string]time.Time{}
	}
	now := time.Now()
	for _, kind := range kinds {
		_, running := l.rechecks[kind]
		l.rechecks[kind] = now
		if !running {
			go l.recheckChain(kind)
		}
	}
}

// recheckChain runs the grant rounds of kind's rechecks, starting over
// from its latest parking whenever the kind parks again meanwhile.
func (l *Limiter) recheckChain(kind string) {
	var from time.Time
	next := 0
	for {
		l.recheckMu.Lock()
		latest := l.rechecks[kind]
		if l.stopped || (latest.Equal(from) && next == len(parkRechecks)) {
			delete(l.rechecks, kind)
			l.recheckMu.Unlock()
			return
		}
		if !latest.Equal(from) {
			from, next = latest, 0
		}
		l.recheckMu.Unlock()
		time.Sleep(time.Until(from.Add(parkRechecks[next])))
		next++
		l.releaser.submitAsync(&releaseRequest{ctx: context.Background(), kind: kind})
	}
}

// kindCounts is the locked state of one limited kind within a transaction,
// and the changes it makes to it.
type kindCounts struct {
	limit, taken int32
	hasParked    bool // jobs of the line wait for the kind (not only for their keys)
	dAdmit       int32
	dirty        bool // dAdmit or hasParked changed

	// The kind's per-key and rate limits.
	fields     []string      // the partition: args fields of a job's key (nil: none)
	keyMax     int32         // running jobs per key (0: no per-key limit)
	rateMax    int32         // starts per ratePeriod (0: no rate limit)
	ratePeriod time.Duration // the rate window
	ratePerKey bool          // the rate holds per key
}

// keyed reports whether the kind has a per-key or rate limit: it never runs
// on leased slots, and its jobs start in job-id order within a key without
// exception.
func (c *kindCounts) keyed() bool { return c.fields != nil || c.rateMax > 0 }

// independentKeys reports whether only per-key limits hold the kind (no
// per-kind limit or rate): a key's room is its own, and its line is
// decided without the others.
func (c *kindCounts) independentKeys() bool {
	return c.fields != nil && c.limit == 0 && (c.rateMax == 0 || c.ratePerKey)
}

// slotted reports whether an admitted job of the kind takes a slot (a
// per-kind or per-key concurrency limit).
func (c *kindCounts) slotted() bool { return c.limit > 0 || c.keyMax > 0 }

// unlimited reports whether the kind's row holds no limit (its limits were
// cleared while jobs of it were held or waited).
func (c *kindCounts) unlimited() bool { return c.limit == 0 && !c.keyed() }

// kindFree is how many more jobs of the kind may hold a slot (-1: no
// per-kind limit).
func (c *kindCounts) kindFree() int32 {
	switch {
	case c.limit < 0:
		return 0
	case c.limit == 0:
		return -1
	}
	return max(c.limit-c.taken, 0)
}

// setHasParked records whether jobs of the line wait for the kind.
func (c *kindCounts) setHasParked(has bool) {
	if has != c.hasParked {
		c.hasParked, c.dirty = has, true
	}
}

// lockKinds locks the limit rows of kinds and returns their counts; kinds
// without a row are absent.
func lockKinds(ctx context.Context, q *db.Queries, kinds []string) (map[string]*kindCounts, error) {
	rows, err := q.LockConcurrencyLimits(ctx, kinds)
	if err != nil {
		return nil, fmt.Errorf("lock limits: %w", err)
	}
	out := make(map[string]*kindCounts, len(rows))
	for _, row := range rows {
		out[row.Kind] = newKindCounts(row.MaxConcurrency, row.Admitted, row.HasParked, row.PartitionFields,
			row.KeyMax, row.RateMax, row.RatePeriodMs, row.RatePerKey)
	}
	return out, nil
}

// newKindCounts is the kindCounts of a locked limit row's columns.
func newKindCounts(limit, admitted int32, hasParked bool, fields []string, keyMax, rateMax *int32, ratePeriodMs int64,
	ratePerKey bool) *kindCounts {
	c := &kindCounts{limit: limit, taken: admitted, hasParked: hasParked, fields: fields, ratePerKey: ratePerKey}
	if keyMax != nil {
		c.keyMax = *keyMax
	}
	if rateMax != nil && ratePeriodMs > 0 {
		c.rateMax, c.ratePeriod = *rateMax, time.Duration(ratePeriodMs)*time.Millisecond
	}
	return c
}

// insertSlots writes slot rows (p) and counts in counts the rows it added:
// a job that already had one (a stale row of an earlier attempt) keeps it,
// counted when it was added, so the kind's count stays equal to its rows.
func insertSlots(ctx context.Context, q *db.Queries, counts map[string]*kindCounts, p db.InsertConcurrencyExecutionsParams) error {
	rows, err := q.InsertConcurrencyExecutions(ctx, p)
	if err != nil {
		return err
	}
	for _, r := range rows {
		if c, ok := counts[r.Kind]; ok && r.Inserted {
			c.dAdmit++
		}
	}
	return nil
}

// saveCounts writes the changes of a transaction to the locked limit rows.
func saveCounts(ctx context.Context, q *db.Queries, counts map[string]*kindCounts) error {
	var p db.AddConcurrencyCountsParams
	for kind, c := range counts {
		if c.dirty || c.dAdmit != 0 {
			p.Kinds = append(p.Kinds, kind)
			p.Admitted = append(p.Admitted, c.dAdmit)
			p.HasParked = append(p.HasParked, c.hasParked)
		}
	}
	if len(p.Kinds) == 0 {
		return nil
	}
	if err := q.AddConcurrencyCounts(ctx, p); err != nil {
		return fmt.Errorf("update slot counts: %w", err)
	}
	for _, c := range counts {
		c.dAdmit, c.dirty = 0, false
	}
	return nil
}

// park parks the running jobs of batch in place, in the transaction of q:
// it marks them for parking (River's completion of each then makes it
// pending) and records when and why (r.reason). A crash before River's
// completion leaves the job running and marked: whoever rescues it (River's
// rescuer, the liveness reaper) parks it the same way. A job no longer
// running (rescued meanwhile) is not parked; the decision of its request
// stays admitParked, so its worker returns without running it. It returns
// the kinds that got parked jobs, whose flags it sets.
func (l *Limiter) park(ctx context.Context, q *db.Queries, batch []*admitRequest, counts map[string]*kindCounts) ([]string, error) {
	if len(batch) == 0 {
		return nil, nil
	}
	var mark db.MarkJobsParkingParams
	for _, r := range batch {
		mark.Ids = append(mark.Ids, r.job.ID)
		mark.Attempts = append(mark.Attempts, int32(r.job.Attempt))
	}
	marked, err := q.MarkJobsParking(ctx, mark)
	if err != nil {
		return nil, fmt.Errorf("mark jobs for parking: %w", err)
	}
	done := make(map[int64]bool, len(marked))
	for _, id := range marked {
		done[id] = true
	}
	var p db.InsertParkedJobsParams
	p.WorkerID = &l.workerID
	var kinds []string
	turns := map[string][]string{}
	for _, r := range batch {
		job := r.job
		if !done[job.ID] {
			l.logger.Warn("job to park is no longer running; not parked", "kind", job.Kind, "job_id", job.ID)
			continue
		}
		p.JobIds = append(p.JobIds, job.ID)
		p.Kinds = append(p.Kinds, job.Kind)
		p.Reasons = append(p.Reasons, r.reason)
		p.Keys = append(p.Keys, r.key)
		if c := counts[job.Kind]; c != nil && !keyReason(r.reason) {
			// New jobs of the kind wait behind it; a job that waits for its
			// key holds up only its key.
			c.setHasParked(true)
		}
		if c := counts[job.Kind]; c != nil && c.fields != nil && !slices.Contains(turns[job.Kind], r.key) {
			turns[job.Kind] = append(turns[job.Kind], r.key)
		}
		if !slices.Contains(kinds, job.Kind) {
			kinds = append(kinds, job.Kind)
		}
	}
	if len(p.JobIds) == 0 {
		return nil, nil
	}
	if err := q.InsertParkedJobs(ctx, p); err != nil {
		return nil, fmt.Errorf("record parked jobs: %w", err)
	}
	if err := q.DeleteWaiters(ctx, p.JobIds); err != nil {
		return nil, fmt.Errorf("take parked jobs out of the waiters: %w", err)
	}
	for kind, keys := range turns {
		if err := q.EnsureKeyTurns(ctx, db.EnsureKeyTurnsParams{Kind: kind, Keys: keys}); err != nil {
			return nil, fmt.Errorf("give waiting keys a turn: %w", err)
		}
	}
	return kinds, nil
}

// retryDeadlock runs fn again (up to 3 times) when Postgres aborted it to
// break a deadlock, which batches of several kinds can run into.
func retryDeadlock[T any](fn func() (T, error)) (T, error) {
	for attempt := 1; ; attempt++ {
		v, err := fn()
		var pgErr *pgconn.PgError
		if err == nil || attempt == 3 || !errors.As(err, &pgErr) || pgErr.Code != "40P01" {
			return v, err
		}
		time.Sleep(time.Duration(attempt) * 5 * time.Millisecond)
	}
}

// withBatchTx runs fn in a line or release transaction (retried after a
// deadlock) whose statements travel in as few round trips as they can
// (db.Pipeline: the writes go with the next read or the commit, and a read
// expected next may go ahead, prefetch.go): the transaction holds a kind's
// row lock from its first statement to its commit, and on a busy machine
// each round trip is 1-2 ms of it (P10).
func (l *Limiter) withBatchTx(parent context.Context, fn func(ctx context.Context, q *db.Queries) error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), batchTimeout)
	defer cancel()
	_, err := retryDeadlock(func() (struct{}, error) {
		return struct{}{}, db.PipelineFunc(ctx, l.pool, func(p *db.Pipeline) error { return fn(ctx, db.New(p)) })
	})
	return err
}

// distinctKinds returns the sorted distinct kinds of n items.
func distinctKinds(n int, kindOf func(int) string) []string {
	seen := map[string]bool{}
	kinds := make([]string, 0, 4)
	for i := range n {
		if k := kindOf(i); !seen[k] {
			seen[k] = true
			kinds = append(kinds, k)
		}
	}
	sort.Strings(kinds)
	return kinds
}
