// Package limiter enforces sluice's concurrency limits: at most N running
// jobs of a kind across every worker (concurrency_limits), with the jobs
// that find no slot parked in place (the same river_job row, pending) and
// resumed in job-id order as slots free. The Limiter is the outermost
// worker middleware of every sluice client; ResumeWorker
// (concurrency_limit.resume) is its safety net.
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
	// when the kind has no limit (0 or no row).
	MaxResumeBatch = 5000
	// ReservedSlotTTL is how long a slot reserved for a resumed job waits for
	// the job to be fetched; concurrency_limit.resume then frees it (the job,
	// when fetched later, is admitted like any other).
	ReservedSlotTTL = 30 * time.Second
	// batchesInFlight is how many admission (and release) statements a
	// worker runs at once: while one waits for the kind's row lock, the next
	// is on its way.
	batchesInFlight = 2
	// parkChunk caps the jobs parked by one transaction.
	parkChunk = 128
	// batchTimeout bounds one admission or release transaction.
	batchTimeout = 30 * time.Second
)

// parkRechecks are the delays after a parking at which the Limiter checks
// the kind for free slots again: a parked job becomes resumable (pending)
// only once River's completer has written its completion (every 50 ms or
// sooner), so a slot freed in between would otherwise wait for the next
// release or for concurrency_limit.resume.
var parkRechecks = []time.Duration{75 * time.Millisecond, 250 * time.Millisecond, time.Second}

type admission int

const (
	admitRun    admission = iota // not limited: run without a slot
	admitSlot                    // admitted: holds a slot until it ends
	admitParked                  // parked in place: back to pending, not run
)

// Limiter enforces the global per-kind concurrency limits of
// concurrency_limits. It is the worker middleware of every job (a job of a
// kind without a limit passes through after an in-memory lookup) and does the
// resuming for the release path and concurrency_limit.resume.
//
// Its fast path is the worker's leased slots (leaser): slots of a kind held
// in bulk and handed from one job to the next in memory. A job that gets no
// leased slot in time, and every job of a kind with parked jobs or reserved
// slots, goes through per-job admission.
//
// Per-job admission and release are group-committed: concurrent jobs of a process
// share one transaction, which locks the limit rows of their kinds (so
// admission is serialized per kind across processes), counts the slots taken,
// admits, and parks the rest in place. Parking marks the running job and
// records it, in that same transaction; River's own completion of the job
// then turns it into a pending job (trigger sluice_park_in_place), the same
// row with its attempt undone. A resume makes the oldest pending jobs of a
// kind available again, with a slot reserved for each.
type Limiter struct {
	river.MiddlewareDefaults

	// TestSignals let tests wait for background work (no-ops otherwise).
	TestSignals TestSignals

	pool         *pgxpool.Pool
	logger       *slog.Logger
	metrics      *Metrics
	workerID     string
	ignoreLimits bool // every job runs without a slot (sluice run --ignore-limit)
	neverPark    bool // no leases, no parking: a job without a slot fails (sluice run)

	q      *db.Queries
	leases *leaser

	// cache is the worker's copy of concurrency_limits, read without a lock
	// by every job; refreshMu lets one job refresh it at a time.
	cache     atomic.Pointer[limitCache]
	refreshMu sync.Mutex

	admitter batcher[admitRequest]
	keyed    batcher[admitRequest]   // admissions of kinds with per-key or rate limits (keyed.go)
	handoffs batcher[releaseRequest] // slots handed to jobs waiting for their key (key_wait.go)
	releaser batcher[releaseRequest]
	wakes    rateWakes // resumes timed to the rate windows (rate_wake.go)
	waits    keyWaits  // jobs waiting in the worker for a slot of their key (key_wait.go)

	parkedTotal atomic.Int64 // parkings by this limiter, every kind

	recheckMu sync.Mutex
	rechecks  map[string]bool // kinds with a recheck chain running
	stopped   bool
	stopCh    chan struct{} // closed by Flush: retries of failed releases stop
}

type admitRequest struct {
	ctx      context.Context
	job      *rivertype.JobRow
	key      string // the job's partition key ('' : none; keyed.go)
	done     chan struct{}
	decision admission
	err      error
	// wait: the keyed admission decided the job waits in the worker for a
	// slot of its key, until waitUntil at the latest, then parks.
	wait      bool
	waitUntil time.Time
	handoffs  int // the slot it is handed passed this many times in a row (key_wait.go)
}

// releaseRequest frees the slot of job (nil: none) and resumes parked jobs
// of kind into free slots.
type releaseRequest struct {
	ctx  context.Context
	job  *rivertype.JobRow
	kind string
	// handTo, if set, is a job waiting in this worker for a slot of the
	// same key, which the job's slot goes to (key_wait.go).
	handTo *admitRequest
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
	// WorkerID names this process's leases (River's client ID); empty: an
	// id of its own.
	WorkerID string
	// IgnoreLimits lets every job run without a slot (sluice run
	// --ignore-limit).
	IgnoreLimits bool
	// NeverPark fails a job that finds no slot instead of parking it, and
	// takes no leases (sluice run, whose job reserved its slot before it
	// started).
	NeverPark bool
	// ParkAfter is how long a job of a limited kind waits in its worker for
	// a slot before it parks (default DefaultParkAfter).
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
	l := &Limiter{pool: cfg.Pool, q: db.New(cfg.Pool), logger: cfg.Logger, metrics: cfg.Metrics, workerID: workerID,
		ignoreLimits: cfg.IgnoreLimits, neverPark: cfg.NeverPark, stopCh: make(chan struct{})}
	l.leases = newLeaser(l, cfg.ParkAfter)
	l.admitter.process, l.admitter.maxInFlight = l.admitBatch, batchesInFlight
	l.keyed.process, l.keyed.maxInFlight = l.keyedBatch, batchesInFlight
	l.handoffs.process, l.handoffs.maxInFlight = l.handOffBatch, batchesInFlight
	l.wakes.l = l
	l.releaser.process, l.releaser.maxInFlight = l.releaseBatch, batchesInFlight
	return l, nil
}

// Work admits, parks or passes through the job, and releases its slot when
// it ends, whatever the outcome. A job of a limited kind first tries the
// worker's leased slots (waiting up to its park-after time for one), then
// per-job admission, which admits or parks it. A parked job returns nil
// without running: River's completion of it is what moves it to pending.
func (l *Limiter) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	if job.Kind == ResumeKind || l.ignoreLimits {
		return doInner(ctx) // never limited itself; or limits ignored
	}
	st, ok, err := l.stateOf(ctx, job.Kind)
	if err != nil {
		return err
	}
	if !ok || (st.limit == 0 && !st.keyed) {
		return doInner(ctx)
	}
	if st.limit > 0 && !l.neverPark && l.leases.acquire(ctx, st, job.ID) {
		defer l.leases.release(job.Kind)
		return doInner(ctx)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("waiting for a %s slot: %w", job.Kind, context.Cause(ctx))
	}

	req := &admitRequest{ctx: ctx, job: job, done: make(chan struct{})}
	if st.keyed {
		l.keyed.submit(req, req.done)
	} else {
		l.admitter.submit(req, req.done)
	}
	if req.err != nil {
		return fmt.Errorf("concurrency limit of %s: %w", job.Kind, req.err)
	}
	switch req.decision {
	case admitParked:
		return nil
	case admitSlot:
		defer l.release(ctx, job)
	}
	return doInner(ctx)
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
// LimitCacheTTL (ok false: no row). The cache only decides the path a job
// takes; admission and leasing read the locked row.
func (l *Limiter) stateOf(ctx context.Context, kind string) (limitState, bool, error) {
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

// refreshCache reloads the cache, stale is the copy the caller found (nil:
// none yet). While another job refreshes it, a stale copy is used as it is:
// no job waits for the query but the first ones.
func (l *Limiter) refreshCache(ctx context.Context, stale *limitCache) (*limitCache, error) {
	if stale != nil {
		if !l.refreshMu.TryLock() {
			return stale, nil
		}
	} else {
		l.refreshMu.Lock()
	}
	defer l.refreshMu.Unlock()
	if c := l.cache.Load(); c != nil && time.Since(c.loaded) <= LimitCacheTTL {
		return c, nil // refreshed meanwhile
	}
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
	c := &limitCache{states: make(map[string]limitState, len(rows)), loaded: time.Now()}
	for _, r := range rows {
		c.states[r.Kind] = limitState{kind: r.Kind, limit: r.MaxConcurrency, hasParked: r.HasParked, hasReserved: r.HasReserved,
			keyed: r.Keyed}
	}
	l.cache.Store(c)
	return c, nil
}

// release frees the job's slot, and resumes parked jobs of its kind into
// the freed slots, in the background: the job's worker goroutine does not
// wait for it. A release lost to a crash leaves a stale slot row, which
// concurrency_limit.resume (and the reaper of dead workers) cleans up;
// Flush waits for the releases still in flight on a clean stop.
func (l *Limiter) release(ctx context.Context, job *rivertype.JobRow) {
	r := &releaseRequest{ctx: context.WithoutCancel(ctx), job: job, kind: job.Kind, handTo: l.nextWaiter(job.ID)}
	if r.handTo != nil {
		// Handed over without the kind's lock: never behind a release
		// that waits for it.
		l.handoffs.submitAsync(r)
		return
	}
	l.releaser.submitAsync(r)
}

// Forget frees the slot this limiter holds, or an unclaimed reservation, for
// job jobID of kind, at once (a job that will not run, or has run: sluice
// run cleans up with it).
func (l *Limiter) Forget(ctx context.Context, kind string, jobID int64) error {
	if _, err := retryDeadlock(func() ([]*db.ReleaseJobsRow, error) {
		return l.q.ReleaseJobs(ctx, db.ReleaseJobsParams{Kinds: []string{kind}, JobIds: []int64{jobID},
			WorkerID: l.workerID, IncludeUnclaimed: true})
	}); err != nil {
		return fmt.Errorf("free the slot of job %d: %w", jobID, err)
	}
	return nil
}

// ParkedTotal is how many jobs this limiter has parked, of every kind.
func (l *Limiter) ParkedTotal() int64 { return l.parkedTotal.Load() }

// Flush gives back the worker's leased slots, stops the rechecks after
// parkings and the retries of failed releases, and waits until the slot
// releases of jobs that ended have been written. Call it once the worker's
// jobs have ended.
func (l *Limiter) Flush() {
	l.leases.close()
	l.recheckMu.Lock()
	if !l.stopped && l.stopCh != nil {
		close(l.stopCh)
	}
	l.stopped = true
	l.recheckMu.Unlock()
	l.wakes.stop()
	l.handoffs.flush()
	l.releaser.flush()
}

// recheck checks kinds for free slots (and resumes parked jobs into them)
// at each of parkRechecks after a parking, one chain per kind at a time.
func (l *Limiter) recheck(kinds []string) {
	l.recheckMu.Lock()
	defer l.recheckMu.Unlock()
	if l.stopped {
		return
	}
	if l.rechecks == nil {
		l.rechecks = map[string]bool{}
	}
	for _, kind := range kinds {
		if l.rechecks[kind] {
			continue
		}
		l.rechecks[kind] = true
		go l.recheckChain(kind)
	}
}

func (l *Limiter) recheckChain(kind string) {
	defer func() {
		l.recheckMu.Lock()
		delete(l.rechecks, kind)
		l.recheckMu.Unlock()
	}()
	prev := time.Duration(0)
	for _, at := range parkRechecks {
		time.Sleep(at - prev)
		prev = at
		l.recheckMu.Lock()
		stopped := l.stopped
		l.recheckMu.Unlock()
		if stopped {
			return
		}
		l.releaser.submitAsync(&releaseRequest{ctx: context.Background(), kind: kind})
	}
}

// kindCounts is the locked state of one limited kind within a batch, and the
// changes the batch makes to it.
type kindCounts struct {
	limit, taken       int32
	hasParked          bool // jobs wait for the kind (not only for their keys)
	dAdmit             int32
	dirty              bool // dAdmit or hasParked changed
	parkedAheadInBatch bool

	// The kind's per-key and rate limits (keyed.go).
	fields     []string      // the partition: args fields of a job's key (nil: none)
	keyMax     int32         // running jobs per key (0: no per-key limit)
	rateMax    int32         // starts per ratePeriod (0: no rate limit)
	ratePeriod time.Duration // the rate window
	ratePerKey bool          // the rate holds per key
}

// keyed reports whether the kind has a per-key or rate limit.
func (c *kindCounts) keyed() bool { return c.fields != nil || c.rateMax > 0 }

// slotted reports whether an admitted job of the kind takes a slot (a
// per-kind or per-key concurrency limit).
func (c *kindCounts) slotted() bool { return c.limit > 0 || c.keyMax > 0 }

// lockKinds locks the limit rows of kinds and returns their counts; kinds
// without a row are absent.
func lockKinds(ctx context.Context, q *db.Queries, kinds []string) (map[string]*kindCounts, error) {
	rows, err := q.LockConcurrencyLimits(ctx, kinds)
	if err != nil {
		return nil, fmt.Errorf("lock limits: %w", err)
	}
	out := make(map[string]*kindCounts, len(rows))
	for _, row := range rows {
		c := &kindCounts{limit: row.MaxConcurrency, taken: row.Admitted, hasParked: row.HasParked,
			fields: row.PartitionFields, ratePerKey: row.RatePerKey}
		if row.KeyMax != nil {
			c.keyMax = *row.KeyMax
		}
		if row.RateMax != nil && row.RatePeriodMs > 0 {
			c.rateMax, c.ratePeriod = *row.RateMax, time.Duration(row.RatePeriodMs)*time.Millisecond
		}
		out[row.Kind] = c
	}
	return out, nil
}

// saveCounts writes the changes of a batch to the locked limit rows.
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
	return nil
}

// admitBatch decides a batch of admissions. The fast path is one statement
// (AdmitJobs) that admits what fits and says which jobs must be parked;
// those are decided again and parked in transactions of at most parkChunk
// jobs (a slot may have freed meanwhile), so a large parking neither delays
// the jobs that may run nor holds the kind's lock against releases for long.
func (l *Limiter) admitBatch(batch []*admitRequest) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(batch[0].ctx), batchTimeout)
	defer cancel()
	p := db.AdmitJobsParams{WorkerID: &l.workerID}
	for _, r := range batch {
		p.JobIds = append(p.JobIds, r.job.ID)
		p.Kinds = append(p.Kinds, r.job.Kind)
	}
	rows, err := retryDeadlock(func() ([]*db.AdmitJobsRow, error) { return db.New(l.pool).AdmitJobs(ctx, p) })
	if err == nil && len(rows) != len(batch) {
		err = fmt.Errorf("admission decided %d of %d jobs", len(rows), len(batch))
	}
	var toPark, keyed []*admitRequest
	for i, r := range batch {
		switch {
		case err != nil:
			r.decision, r.err = admitRun, err
		case rows[i].Decision == "keyed":
			// The kind got a per-key or rate limit since this worker's
			// cache said otherwise.
			keyed = append(keyed, r)
			continue
		case rows[i].Decision == "admit":
			r.decision = admitSlot
		case rows[i].Decision == "park" && l.neverPark:
			r.decision, r.err = admitRun, ErrNoSlot
		case rows[i].Decision == "park":
			toPark = append(toPark, r)
			continue // answered once parked (or admitted after all)
		default:
			r.decision = admitRun
		}
		close(r.done)
	}
	for len(toPark) > 0 {
		n := min(len(toPark), parkChunk)
		l.parkBatch(toPark[:n])
		toPark = toPark[n:]
	}
	if len(keyed) > 0 {
		l.keyedBatch(keyed)
	}
}

// parkBatch decides again, under the limit rows' lock, the jobs the fast
// path found no slot for, admits those that now fit (FIFO permitting) and
// parks the others in place, then answers them all.
func (l *Limiter) parkBatch(batch []*admitRequest) {
	var parkedKinds []string
	err := l.withBatchTx(batch[0].ctx, func(ctx context.Context, tx pgx.Tx) error {
		q := db.New(tx)
		kinds := distinctKinds(len(batch), func(i int) string { return batch[i].job.Kind })
		counts, err := lockKinds(ctx, q, kinds)
		if err != nil {
			return err
		}
		var admitIDs []int64
		var admitKinds []string
		var toPark []*admitRequest
		var reasons []string
		for _, r := range batch {
			c, ok := counts[r.job.Kind]
			switch {
			case !ok || c.limit == 0:
				r.decision = admitRun
			case c.limit < 0 || c.hasParked || c.parkedAheadInBatch || c.taken >= c.limit:
				r.decision = admitParked
				switch {
				case c.limit < 0:
					reasons = append(reasons, "breaker")
				case c.hasParked || c.parkedAheadInBatch:
					reasons = append(reasons, "fifo")
				default:
					reasons = append(reasons, "limit")
				}
				c.parkedAheadInBatch = true // FIFO: later jobs queue behind this one
				toPark = append(toPark, r)
			default:
				r.decision = admitSlot
				c.taken++
				admitIDs = append(admitIDs, r.job.ID)
				admitKinds = append(admitKinds, r.job.Kind)
			}
		}
		if len(admitIDs) > 0 {
			if err := insertSlots(ctx, q, counts, db.InsertConcurrencyExecutionsParams{
				JobIds: admitIDs, Kinds: admitKinds, WorkerID: &l.workerID, Reserved: false,
			}); err != nil {
				return fmt.Errorf("admit: %w", err)
			}
		}
		parked, err := l.park(ctx, q, toPark, reasons, counts)
		if err != nil {
			return err
		}
		parkedKinds = parked
		return saveCounts(ctx, q, counts)
	})
	for _, r := range batch {
		if err != nil {
			r.decision, r.err = admitRun, err
		} else if r.decision == admitParked {
			l.metrics.Parked.WithLabelValues(r.job.Kind).Inc()
			l.parkedTotal.Add(1)
		}
		close(r.done)
	}
	if err == nil && len(parkedKinds) > 0 {
		l.recheck(parkedKinds)
	}
}

// park parks the running jobs of batch in place, in the transaction of q:
// it marks them for parking (River's completion of each then makes it
// pending) and records when and why (reasons, in step with batch). A crash
// before River's completion leaves the job running and marked: whoever
// rescues it (River's rescuer, the liveness reaper) parks it the same way.
// A job no longer running (rescued meanwhile) is not parked; the decision
// of its request stays admitParked, so its worker returns without running
// it. It returns the kinds that got parked jobs, whose flags it sets.
func (l *Limiter) park(ctx context.Context, q *db.Queries, batch []*admitRequest, reasons []string, counts map[string]*kindCounts) ([]string, error) {
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
	for i, r := range batch {
		job := r.job
		if !done[job.ID] {
			l.logger.Warn("job to park is no longer running; not parked", "kind", job.Kind, "job_id", job.ID)
			continue
		}
		p.JobIds = append(p.JobIds, job.ID)
		p.Kinds = append(p.Kinds, job.Kind)
		p.Reasons = append(p.Reasons, reasons[i])
		p.Keys = append(p.Keys, r.key)
		if c := counts[job.Kind]; !c.hasParked && !keyReason(reasons[i]) {
			// New jobs of the kind wait behind it (FIFO); a job that waits
			// for its key holds up only its key.
			c.hasParked, c.dirty = true, true
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
	return kinds, nil
}

// releaseBatch frees the slots of jobs that ended (the fast path, one
// statement: ReleaseJobs) and, for kinds with parked jobs and now a free
// slot, resumes the oldest parked jobs into the free slots in a second
// transaction. Admissions park rather than take a slot while jobs are
// parked, so the freed slots wait for the resume. A request without a job
// (a recheck after a parking) only looks for free slots. When either step
// fails (the database is unreachable), the kinds are cleaned up again in the
// background (retryRelease).
func (l *Limiter) releaseBatch(batch []*releaseRequest) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(batch[0].ctx), batchTimeout)
	defer cancel()
	p := db.ReleaseJobsParams{
		Kinds:    distinctKinds(len(batch), func(i int) string { return batch[i].kind }),
		JobIds:   make([]int64, 0, len(batch)),
		WorkerID: l.workerID,
	}
	for _, r := range batch {
		if r.job != nil {
			p.JobIds = append(p.JobIds, r.job.ID)
		}
	}
	rows, err := retryDeadlock(func() ([]*db.ReleaseJobsRow, error) { return db.New(l.pool).ReleaseJobs(ctx, p) })
	if err != nil {
		l.logger.Error("concurrency slots not released; retrying", "error", err)
		l.retryRelease(p.Kinds, p.JobIds)
		return
	}
	var resumeKinds []string
	limited := map[string]bool{}
	for _, row := range rows {
		limited[row.Kind] = true
		free := row.MaxConcurrency >= 0 && (row.MaxConcurrency == 0 || row.Admitted < row.MaxConcurrency)
		// A kind with per-key or rate limits may have jobs waiting for a
		// key whose slot just freed, whatever the kind's flag says.
		if free && (row.HasParked || (row.Keyed && row.AnyParked)) {
			resumeKinds = append(resumeKinds, row.Kind)
		}
	}
	// A recheck of a kind whose limit is gone (cleared while jobs were
	// completing their parking): those jobs resume at once, unlimited.
	var unlimited []string
	for _, r := range batch {
		if r.job == nil && !limited[r.kind] && !slices.Contains(unlimited, r.kind) {
			unlimited = append(unlimited, r.kind)
			resumeKinds = append(resumeKinds, r.kind)
		}
	}
	if len(resumeKinds) == 0 {
		return
	}
	err = l.withBatchTx(batch[0].ctx, func(ctx context.Context, tx pgx.Tx) error {
		q := db.New(tx)
		sort.Strings(resumeKinds)
		counts, err := lockKinds(ctx, q, resumeKinds)
		if err != nil {
			return err
		}
		for _, kind := range resumeKinds {
			c, ok := counts[kind]
			if !ok && slices.Contains(unlimited, kind) {
				c, ok = &kindCounts{}, true
			}
			if ok {
				if _, err := l.resumeInto(ctx, q, kind, c); err != nil {
					return err
				}
			}
		}
		return saveCounts(ctx, q, counts)
	})
	if err != nil {
		l.logger.Error("parked jobs not resumed; retrying", "error", err)
		l.retryRelease(resumeKinds, nil)
	}
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

// resumeInto resumes parked jobs of kind into its free slots, as counted by
// c (locked), records the changes in c, sets the kind's parked flag from
// its records again, and returns how many jobs it resumed.
func (l *Limiter) resumeInto(ctx context.Context, q *db.Queries, kind string, c *kindCounts) (int, error) {
	if c.keyed() {
		return l.resumeKeyed(ctx, q, kind, c)
	}
	if c.limit < 0 {
		return 0, nil
	}
	free := int32(MaxResumeBatch)
	if c.limit > 0 {
		free = c.limit - c.taken
	}
	if free <= 0 {
		return 0, nil
	}
	n, err := l.resume(ctx, q, kind, free, c.limit > 0, c)
	if err != nil {
		return 0, err
	}
	if c.limit > 0 {
		c.taken += int32(n)
	}
	// The flag says whether records remain (jobs still waiting, completing
	// their parking, or held by another transaction).
	has, err := q.HasParkedJobs(ctx, kind)
	if err != nil {
		return 0, fmt.Errorf("look for parked %s jobs: %w", kind, err)
	}
	if has != c.hasParked {
		c.hasParked, c.dirty = has, true
	}
	return n, nil
}

// resume makes the n oldest parked jobs of kind available again, in the
// transaction of q (the kind's limit row locked), reserves a slot for each
// when reserve is set (the kind has a positive limit; the slot rows added
// are counted in c), and wakes the River producers of their queues. It
// returns how many jobs it resumed.
func (l *Limiter) resume(ctx context.Context, q *db.Queries, kind string, n int32, reserve bool, c *kindCounts) (int, error) {
	resumed, err := q.ResumeParkedJobs(ctx, db.ResumeParkedJobsParams{Kind: kind, MaxRows: n})
	if err != nil {
		return 0, fmt.Errorf("resume parked %s jobs: %w", kind, err)
	}
	if len(resumed) == 0 {
		return 0, nil
	}
	queues := make([]string, 0, 1)
	ids := make([]int64, len(resumed))
	kinds := make([]string, len(resumed))
	for i, r := range resumed {
		ids[i], kinds[i] = r.ID, kind
		if !slices.Contains(queues, r.Queue) {
			queues = append(queues, r.Queue)
		}
	}
	if reserve {
		if err := insertSlots(ctx, q, map[string]*kindCounts{kind: c}, db.InsertConcurrencyExecutionsParams{
			JobIds: ids, Kinds: kinds, WorkerID: nil, Reserved: true,
		}); err != nil {
			return 0, fmt.Errorf("reserve slots for resumed %s jobs: %w", kind, err)
		}
	}
	if err := q.NotifyRiverInsert(ctx, queues); err != nil {
		return 0, fmt.Errorf("notify queues of resumed %s jobs: %w", kind, err)
	}
	l.metrics.Resumed.WithLabelValues(kind).Add(float64(len(resumed)))
	return len(resumed), nil
}

func (l *Limiter) withBatchTx(parent context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), batchTimeout)
	defer cancel()
	return pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error { return fn(ctx, tx) })
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
