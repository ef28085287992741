package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/tidwall/gjson"

	"github.com/sluice-dev/sluice/db"
)

// Concurrency-limit constants.
const (
	// LimitCacheTTL is how long a worker trusts its copy of the
	// concurrency_limits table: a new or removed limit takes effect within it.
	LimitCacheTTL = time.Second
	// MaxResumeBatch caps how many parked jobs one resume moves back into
	// River when the kind has no limit (0 or no row).
	MaxResumeBatch = 5000
	// OutcomeParked is the metrics outcome of a job that was parked.
	OutcomeParked = "parked"
	// metaParked and metaResumed are the job metadata keys recording that a
	// job was parked, and that a job is a resumed parked job.
	metaParked  = "sluice_parked"
	metaResumed = "sluice_resumed"
	// parkChunk caps the jobs parked by one transaction.
	parkChunk = 128
	// batchTimeout bounds one admission or release transaction.
	batchTimeout = 30 * time.Second
)

type admission int

const (
	admitRun    admission = iota // not limited: run without a slot
	admitSlot                    // admitted: holds a slot until it ends
	admitParked                  // parked: finished without running
)

// Limiter enforces the global per-kind concurrency limits of
// concurrency_limits. It is the worker middleware of every job (a job of a
// kind without a limit passes through after an in-memory lookup) and does the
// resuming for the release path and concurrency_limit.resume.
//
// Admission and release are group-committed: concurrent jobs of a process
// share one transaction, which locks the limit rows of their kinds (so
// admission is serialized per kind across processes), counts the slots taken,
// admits, and parks the rest — parking completes the River job with
// JobCompleteTx in that same transaction.
type Limiter struct {
	river.MiddlewareDefaults

	pool     *pgxpool.Pool
	logger   *slog.Logger
	metrics  *LimitMetrics
	workerID string

	cacheMu     sync.Mutex
	cache       map[string]int32
	cacheLoaded time.Time

	admitter batcher[admitRequest]
	releaser batcher[releaseRequest]
}

type admitRequest struct {
	ctx      context.Context
	job      *rivertype.JobRow
	done     chan struct{}
	decision admission
	deferred bool // parked in the batch's second round
	err      error
}

type releaseRequest struct {
	ctx  context.Context
	job  *rivertype.JobRow
	done chan struct{}
}

func newLimiter(pool *pgxpool.Pool, logger *slog.Logger, metrics *LimitMetrics, workerID string) *Limiter {
	l := &Limiter{pool: pool, logger: logger, metrics: metrics, workerID: workerID}
	l.admitter.process = l.admitBatch
	l.releaser.process = l.releaseBatch
	return l
}

// Work admits, parks or passes through the job, and releases its slot when
// it ends, whatever the outcome.
func (l *Limiter) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	if job.Kind == ConcurrencyLimitResumeKind {
		return doInner(ctx) // never limited itself
	}
	if isResumed(job) {
		// A resumed job's slot was reserved when it was resumed.
		defer l.release(ctx, job)
		return doInner(ctx)
	}
	limit, ok, err := l.limitOf(ctx, job.Kind)
	if err != nil {
		return err
	}
	if !ok || limit == 0 {
		return doInner(ctx)
	}

	req := &admitRequest{ctx: ctx, job: job, done: make(chan struct{})}
	l.admitter.submit(req, req.done)
	if req.err != nil {
		return fmt.Errorf("concurrency limit of %s: %w", job.Kind, req.err)
	}
	switch req.decision {
	case admitParked:
		SetOutcome(ctx, OutcomeParked)
		return nil
	case admitSlot:
		defer l.release(ctx, job)
	}
	return doInner(ctx)
}

// isResumed reports whether job is the first attempt of a resumed parked
// job (later attempts go through admission again).
func isResumed(job *rivertype.JobRow) bool {
	return job.Attempt <= 1 && gjson.GetBytes(job.Metadata, metaResumed).Exists()
}

// limitOf returns the limit row of kind from a cache refreshed every
// LimitCacheTTL (ok false: no row). The cache only decides whether a job
// needs admission; admission itself reads the locked row.
func (l *Limiter) limitOf(ctx context.Context, kind string) (int32, bool, error) {
	l.cacheMu.Lock()
	defer l.cacheMu.Unlock()
	if l.cache == nil || time.Since(l.cacheLoaded) > LimitCacheTTL {
		rows, err := db.New(l.pool).ListConcurrencyLimits(ctx)
		if err != nil {
			if l.cache == nil {
				return 0, false, fmt.Errorf("read concurrency limits: %w", err)
			}
			l.logger.Warn("concurrency limits not refreshed; using the last copy", "error", err)
		} else {
			l.cache = make(map[string]int32, len(rows))
			for _, r := range rows {
				l.cache[r.Kind] = r.MaxConcurrency
			}
		}
		l.cacheLoaded = time.Now()
	}
	limit, ok := l.cache[kind]
	return limit, ok, nil
}

// release frees the job's slot and, in the same transaction, resumes parked
// jobs of its kind into the freed slots. A release that fails leaves a stale
// row, which concurrency_limit.resume cleans up.
func (l *Limiter) release(ctx context.Context, job *rivertype.JobRow) {
	req := &releaseRequest{ctx: context.WithoutCancel(ctx), job: job, done: make(chan struct{})}
	l.releaser.submit(req, req.done)
}

// kindCounts is the locked state of one limited kind within a batch, and the
// changes the batch makes to its counts.
type kindCounts struct {
	limit, taken       int32
	parked             int64
	dAdmit             int32
	dParked            int64
	parkedAheadInBatch bool
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
		out[row.Kind] = &kindCounts{limit: row.MaxConcurrency, taken: row.Admitted, parked: row.Parked}
	}
	return out, nil
}

// saveCounts writes the count changes of a batch.
func saveCounts(ctx context.Context, q *db.Queries, counts map[string]*kindCounts) error {
	var p db.AddConcurrencyCountsParams
	for kind, c := range counts {
		if c.dAdmit != 0 || c.dParked != 0 {
			p.Kinds = append(p.Kinds, kind)
			p.Admitted = append(p.Admitted, c.dAdmit)
			p.Parked = append(p.Parked, c.dParked)
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

// admitBatch decides a batch of admissions. Admitted jobs are answered as
// soon as their transaction commits; jobs that must be parked are decided
// again and parked in later transactions of at most parkChunk jobs (a slot
// may have freed meanwhile), so a large parking neither delays the jobs that
// may run nor holds the kind's lock against releases for long.
func (l *Limiter) admitBatch(batch []*admitRequest) {
	pending := batch
	for round := 0; len(pending) > 0; round++ {
		parkNow := round > 0 // the second round parks what it cannot admit
		var deferred []*admitRequest
		err := l.withBatchTx(pending[0].ctx, func(ctx context.Context, tx pgx.Tx) error {
			deferred = deferred[:0]
			q := db.New(tx)
			kinds := distinctKinds(len(pending), func(i int) string { return pending[i].job.Kind })
			counts, err := lockKinds(ctx, q, kinds)
			if err != nil {
				return err
			}
			var admitIDs []int64
			var admitKinds []string
			var toPark []*admitRequest
			for _, r := range pending {
				r.deferred = false
				c, ok := counts[r.job.Kind]
				switch {
				case !ok || c.limit == 0:
					r.decision = admitRun
				case c.limit < 0 || c.parked > 0 || c.parkedAheadInBatch || c.taken >= c.limit:
					r.decision = admitParked
					c.parkedAheadInBatch = true // FIFO: later jobs queue behind this one
					if parkNow && len(toPark) < parkChunk {
						toPark = append(toPark, r)
					} else {
						r.deferred = true
						deferred = append(deferred, r)
					}
				default:
					r.decision = admitSlot
					c.taken++
					c.dAdmit++
					admitIDs = append(admitIDs, r.job.ID)
					admitKinds = append(admitKinds, r.job.Kind)
				}
			}
			if len(admitIDs) > 0 {
				if err := q.InsertConcurrencyExecutions(ctx, db.InsertConcurrencyExecutionsParams{
					JobIds: admitIDs, Kinds: admitKinds, WorkerID: l.workerIDPtr(), Reserved: false,
				}); err != nil {
					return fmt.Errorf("admit: %w", err)
				}
			}
			if err := l.park(ctx, tx, toPark, counts); err != nil {
				return err
			}
			return saveCounts(ctx, q, counts)
		})
		for _, r := range pending {
			switch {
			case err != nil:
				r.decision, r.err = admitRun, err
			case r.deferred:
				continue // decided again in the next round
			case r.decision == admitParked:
				l.metrics.Parked.WithLabelValues(r.job.Kind).Inc()
			}
			close(r.done)
		}
		if err != nil {
			return
		}
		pending = deferred
	}
}

// park completes the River jobs of batch, recording sluice_parked in their
// metadata, and writes a parked row (FIFO in batch order) for each, in tx: a
// crash either parks a job (once) or leaves it running, to be retried. A job
// no longer running (rescued meanwhile) is not parked; a job an earlier
// attempt had parked already is only completed. Counts are updated in
// counts.
func (l *Limiter) park(ctx context.Context, tx pgx.Tx, batch []*admitRequest, counts map[string]*kindCounts) error {
	if len(batch) == 0 {
		return nil
	}
	q := db.New(tx)
	patch, _ := json.Marshal(map[string]any{metaParked: map[string]any{"at": time.Now().UTC(), "worker_id": l.workerID}})
	var complete db.CompleteParkedRiverJobsParams
	for _, r := range batch {
		complete.Ids = append(complete.Ids, r.job.ID)
		complete.Patches = append(complete.Patches, patch)
	}
	completed, err := q.CompleteParkedRiverJobs(ctx, complete)
	if err != nil {
		return fmt.Errorf("complete parked jobs: %w", err)
	}
	done := make(map[int64]bool, len(completed))
	for _, id := range completed {
		done[id] = true
	}
	var p db.InsertParkedJobsParams
	for _, r := range batch {
		job := r.job
		if !done[job.ID] {
			l.logger.Warn("job to park is no longer running; not parked", "kind", job.Kind, "job_id", job.ID)
			continue
		}
		tags := []byte("[]")
		if len(job.Tags) > 0 {
			tags, _ = json.Marshal(job.Tags)
		}
		metadata := job.Metadata
		if len(metadata) == 0 {
			metadata = []byte("{}")
		}
		p.Kinds = append(p.Kinds, job.Kind)
		p.Args = append(p.Args, job.EncodedArgs)
		p.Queues = append(p.Queues, job.Queue)
		p.Priorities = append(p.Priorities, int16(job.Priority))
		p.MaxAttempts = append(p.MaxAttempts, int16(job.MaxAttempts))
		p.Tags = append(p.Tags, tags)
		p.Metadata = append(p.Metadata, metadata)
		p.OriginalJobIds = append(p.OriginalJobIds, job.ID)
	}
	if len(p.Kinds) == 0 {
		return nil
	}
	rows, err := q.InsertParkedJobs(ctx, p)
	if err != nil {
		return fmt.Errorf("park jobs: %w", err)
	}
	byJob := make(map[int64]string, len(batch))
	for _, r := range batch {
		byJob[r.job.ID] = r.job.Kind
	}
	for _, row := range rows {
		c := counts[byJob[row.OriginalJobID]]
		c.parked++
		c.dParked++
	}
	return nil
}

func (l *Limiter) releaseBatch(batch []*releaseRequest) {
	err := l.withBatchTx(batch[0].ctx, func(ctx context.Context, tx pgx.Tx) error {
		q := db.New(tx)
		kinds := distinctKinds(len(batch), func(i int) string { return batch[i].job.Kind })
		counts, err := lockKinds(ctx, q, kinds)
		if err != nil {
			return err
		}
		ids := make([]int64, len(batch))
		for i, r := range batch {
			ids[i] = r.job.ID
		}
		released, err := q.DeleteConcurrencyExecutions(ctx, ids)
		if err != nil {
			return fmt.Errorf("release slots: %w", err)
		}
		for _, row := range released {
			if c, ok := counts[row.Kind]; ok {
				c.taken--
				c.dAdmit--
			}
		}
		for _, kind := range kinds {
			c, ok := counts[kind]
			if !ok {
				continue // no limit row: concurrency_limit.resume handles its parked jobs
			}
			if err := l.resumeInto(ctx, tx, batch[0].ctx, kind, c); err != nil {
				return err
			}
		}
		return saveCounts(ctx, q, counts)
	})
	if err != nil {
		l.logger.Error("concurrency slots not released; concurrency_limit.resume will clean them up", "error", err)
	}
	for _, r := range batch {
		close(r.done)
	}
}

// resumeInto resumes parked jobs of kind into its free slots, as counted by
// c (locked), and records the changes in c.
func (l *Limiter) resumeInto(ctx context.Context, tx pgx.Tx, clientCtx context.Context, kind string, c *kindCounts) error {
	if c.parked <= 0 || c.limit < 0 {
		return nil
	}
	free := int32(MaxResumeBatch)
	if c.limit > 0 {
		free = c.limit - c.taken
	}
	if free <= 0 {
		return nil
	}
	n, err := l.resume(ctx, tx, clientCtx, kind, free, c.limit > 0)
	if err != nil {
		return err
	}
	if n == 0 {
		// The count said parked jobs exist but none were found (removed
		// by hand, or taken by a concurrent resume): recount.
		c.dAdmit, c.dParked = 0, 0
		return db.New(tx).RecountConcurrency(ctx, kind)
	}
	c.parked -= int64(n)
	c.dParked -= int64(n)
	if c.limit > 0 {
		c.taken += int32(n)
		c.dAdmit += int32(n)
	}
	return nil
}

// resume moves the n oldest parked jobs of kind back into River in tx,
// marked resumed, and reserves a slot for each when reserve is set (the kind
// has a positive limit). clientCtx carries the River client. It returns how
// many jobs it resumed.
func (l *Limiter) resume(ctx context.Context, tx pgx.Tx, clientCtx context.Context, kind string, n int32, reserve bool) (int, error) {
	q := db.New(tx)
	parked, err := q.TakeParkedJobs(ctx, db.TakeParkedJobsParams{Kind: kind, MaxRows: n})
	if err != nil {
		return 0, fmt.Errorf("take parked %s jobs: %w", kind, err)
	}
	if len(parked) == 0 {
		return 0, nil
	}
	client, err := river.ClientFromContextSafely[pgx.Tx](clientCtx)
	if err != nil {
		return 0, fmt.Errorf("resume %s jobs: %w", kind, err)
	}
	params := make([]river.InsertManyParams, len(parked))
	for i, p := range parked {
		metadata, err := resumedMetadata(p)
		if err != nil {
			return 0, err
		}
		params[i] = river.InsertManyParams{
			Args: rawArgs{kind: p.Kind, raw: p.Args},
			InsertOpts: &river.InsertOpts{
				MaxAttempts: int(p.MaxAttempts),
				Metadata:    metadata,
				Priority:    int(p.Priority),
				Queue:       p.Queue,
				Tags:        p.Tags,
			},
		}
	}
	results, err := client.InsertManyTx(ctx, tx, params)
	if err != nil {
		return 0, fmt.Errorf("insert resumed %s jobs: %w", kind, err)
	}
	queues := make([]string, 0, 1)
	for _, p := range parked {
		if !slices.Contains(queues, p.Queue) {
			queues = append(queues, p.Queue)
		}
	}
	if err := q.NotifyRiverInsert(ctx, queues); err != nil {
		return 0, fmt.Errorf("notify queues of resumed %s jobs: %w", kind, err)
	}
	if reserve {
		ids := make([]int64, len(results))
		kinds := make([]string, len(results))
		for i, res := range results {
			ids[i], kinds[i] = res.Job.ID, kind
		}
		if err := q.InsertConcurrencyExecutions(ctx, db.InsertConcurrencyExecutionsParams{
			JobIds: ids, Kinds: kinds, WorkerID: nil, Reserved: true,
		}); err != nil {
			return 0, fmt.Errorf("reserve slots for resumed %s jobs: %w", kind, err)
		}
	}
	l.metrics.Resumed.WithLabelValues(kind).Add(float64(len(results)))
	return len(results), nil
}

// resumedMetadata is the parked job's metadata marked resumed.
func resumedMetadata(p *db.ConcurrencyParkedJob) ([]byte, error) {
	meta := map[string]json.RawMessage{}
	if len(p.Metadata) > 0 {
		if err := json.Unmarshal(p.Metadata, &meta); err != nil {
			return nil, fmt.Errorf("parked job %d: metadata: %w", p.ID, err)
		}
	}
	delete(meta, metaParked)
	marker, _ := json.Marshal(map[string]any{
		"parked_id": p.ID, "original_job_id": p.OriginalJobID, "parked_at": p.ParkedAt,
	})
	meta[metaResumed] = marker
	return json.Marshal(meta)
}

func (l *Limiter) withBatchTx(parent context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), batchTimeout)
	defer cancel()
	return pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error { return fn(ctx, tx) })
}

func (l *Limiter) workerIDPtr() *string {
	if l.workerID == "" {
		return nil
	}
	return &l.workerID
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

// rawArgs are job args kept as raw JSON under a kind, to insert or complete a
// job whose args type this code does not need to know.
type rawArgs struct {
	kind string
	raw  json.RawMessage
}

// Kind is the job kind.
func (a rawArgs) Kind() string { return a.kind }

// MarshalJSON returns the raw args.
func (a rawArgs) MarshalJSON() ([]byte, error) {
	if len(a.raw) == 0 {
		return []byte("{}"), nil
	}
	return a.raw, nil
}

// UnmarshalJSON keeps the raw args.
func (a *rawArgs) UnmarshalJSON(b []byte) error {
	a.raw = append(a.raw[:0], b...)
	return nil
}
