package limiter

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/sluice-dev/sluice/limiter/internal/ledger"
)

// maxFetchThrough is how many times one of River's fetches fetches again
// for the jobs that parked at it: a backlog of one key, available, is
// worked through (parked, most of it) in few of River's fetch cycles, and
// a job of another key inserted behind it is fetched soon.
const maxFetchThrough = 16

// parkAheadScan is how many available jobs of limited kinds, at the front
// of River's fetch order, a fetch looks at to park those behind long lines
// before it fetches (ledger.ParkAhead).
const parkAheadScan = 500

// Driver returns River's pgx driver d with the limiter deciding the jobs
// of kinds (the kinds the client works) that each fetch brings, together
// and in job-id order, before River hands them to its goroutines: a job
// of a limited kind takes a leased slot, a slot of the line, or its place
// in the line, or parks at once, never seen by River's executors. Without
// it the middleware decides each job alone, in the order Go schedules
// their goroutines. Every other call of the driver is River's own.
func (l *Limiter) Driver(d *riverpgxv5.Driver, kinds []string) riverdriver.Driver[pgx.Tx] {
	return &fetchDriver{Driver: d, l: l, kinds: slices.Clone(kinds), parking: map[string]bool{}}
}

// fetchDriver is River's pgx driver whose executors decide what they fetch.
type fetchDriver struct {
	*riverpgxv5.Driver
	l     *Limiter
	kinds []string

	mu      sync.Mutex
	parking map[string]bool // queues whose last fetch parked jobs for a long line
}

// parks reports whether queue's last fetch parked jobs for a long line
// (ledger.Decision.LongLine, or ahead of the fetch): its next one parks
// the jobs behind long lines first.
func (d *fetchDriver) parks(queue string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.parking[queue]
}

// parked records whether a fetch of queue parked jobs for a long line.
func (d *fetchDriver) parked(queue string, any bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if any {
		d.parking[queue] = true
	} else {
		delete(d.parking, queue)
	}
}

// GetExecutor returns River's executor, watched.
func (d *fetchDriver) GetExecutor() riverdriver.Executor {
	return &fetchExecutor{Executor: d.Driver.GetExecutor(), d: d}
}

// fetchExecutor is River's executor whose fetches the limiter decides.
type fetchExecutor struct {
	riverdriver.Executor
	d *fetchDriver
}

// JobGetAvailable fetches as River does, at most what the fetch gate lets
// in, and has the limiter decide the jobs of limited kinds. After a fetch
// that parked jobs because their line was long already, the next one
// first parks the available jobs behind long lines (fetch), so that it
// reaches the jobs behind them. The jobs
// that parked leave the result; while a full fetch parked every job it
// fetched, it fetches again (River fetches again at once only after a
// full fetch), up to maxFetchThrough times. Once it keeps a job it hands
// River what it has: a job that can start, or is granted a slot while the
// fetch went on, would start after younger jobs of its kind that other
// workers fetched since. When it stops with jobs parked it wakes the
// queue's producer to fetch again.
func (e *fetchExecutor) JobGetAvailable(ctx context.Context, params *riverdriver.JobGetAvailableParams) (*riverdriver.JobGetAvailableResult, error) {
	l := e.d.l
	params = l.gate.admit(ctx, params)
	want := params.MaxToLock
	out := &riverdriver.JobGetAvailableResult{}
	parkedAny := false // jobs parked for a long line, at this fetch or ahead of it
	more := false      // the last fetch was full and jobs of it parked
	defer func() { e.d.parked(params.Queue, parkedAny) }()
	for range maxFetchThrough {
		p := *params
		p.MaxToLock = want - len(out.Jobs)
		f, err := e.fetch(ctx, &p, parkedAny || e.d.parks(params.Queue))
		if err != nil {
			if len(out.Jobs) > 0 {
				return out, nil // River gets what it has; the error comes back at its next fetch
			}
			return nil, err
		}
		res := f.res
		parkedAny = parkedAny || f.ahead > 0
		if res == nil || len(res.Jobs) == 0 {
			more = false
			break
		}
		parked, longLine := l.fetched(ctx, res.Jobs, res.DecodeErrors, e.d.kinds, f.admitted, f.admitErr)
		parkedAny = parkedAny || longLine
		l.noteLeasedMarks(f.leased)
		for _, job := range res.Jobs {
			if parked[job.ID] {
				continue
			}
			out.Jobs = append(out.Jobs, job)
			if err := res.DecodeErrors[job.ID]; err != nil {
				if out.DecodeErrors == nil {
					out.DecodeErrors = map[int64]error{}
				}
				out.DecodeErrors[job.ID] = err
			}
		}
		more = len(res.Jobs) == p.MaxToLock && len(parked) > 0 && !l.isStopped()
		if !more || len(out.Jobs) > 0 {
			// River gets the jobs kept without waiting for more fetches (one
			// that can start, or is granted meanwhile, would start after
			// younger jobs of its kind that other workers fetched since).
			break
		}
	}
	if more {
		l.gate.wake(params.Queue) // its producer fetches again for the jobs that parked
	}
	return out, nil
}

// fetchedJobs is what one fetch brought.
type fetchedJobs struct {
	res *riverdriver.JobGetAvailableResult
	// leased are the jobs marked leased (for the lease keeper).
	leased []ledger.Fetched
	// ahead is how many jobs the fetch parked ahead of it.
	ahead int
	// admitted is the jobs of limited kinds put in their queues within the
	// fetch's transaction (nil: not done; fetched does it), and admitErr
	// what kept it from finishing.
	admitted *admission
	admitErr error
}

// fetch fetches as River does. While a kind the client works is limited
// (as the worker's copy of the limits has it), it fetches in a
// transaction in which the worker's memory decides the fetched jobs of
// limited kinds on the leased path (admitLocal: a first attempt takes a
// spare leased slot at once, or waits in the worker for one), and which
// marks the others as not decided yet (ledger.MarkFetched; toMark):
// another worker's decision lets no younger job of their lines start
// before theirs. A job waiting for a leased slot is marked leased: for the
// other workers' leases it waits, until this worker's lease keeper
// publishes what waits; those are returned for the keeper
// (noteLeasedMarks). A job that took a slot is not marked: it waits for
// nothing. With parkAhead (the last fetch parked jobs for a long line),
// the same transaction first parks the available jobs behind long lines
// (ledger.ParkAhead; how many it returns).
func (e *fetchExecutor) fetch(ctx context.Context, params *riverdriver.JobGetAvailableParams, parkAhead bool) (*fetchedJobs, error) {
	l := e.d.l
	limited := l.markedKinds(ctx, e.d.kinds)
	if len(limited) == 0 {
		res, err := e.Executor.JobGetAvailable(ctx, params)
		return &fetchedJobs{res: res}, err
	}
	tx, err := e.Executor.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin the fetch: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // a no-op once committed
	out := &fetchedJobs{}
	t0 := time.Now()
	if err := l.ledger.Fetching(ctx, e.d.UnwrapTx(tx)); err != nil {
		return nil, err
	}
	if parkAhead {
		ahead, err := l.ledger.ParkAhead(ctx, e.d.UnwrapTx(tx), params.Queue, limited, parkAheadScan, l.gate.slotsOf(params.Queue))
		if err != nil {
			return nil, err
		}
		out.ahead = len(ahead)
	}
	if out.res, err = tx.JobGetAvailable(ctx, params); err != nil {
		return nil, fmt.Errorf("fetch: %w", err)
	}
	fetchedAt := time.Now()
	var marks []ledger.Fetched
	if out.res != nil {
		// By the copy of the limits as it is (no statement on another
		// connection while this transaction holds one): expired, the jobs
		// are all marked, and decided after the commit.
		var took map[int64]bool
		if snap := l.limits.held(); snap != nil {
			jobs := l.limitedOf(out.res.Jobs, out.res.DecodeErrors, e.d.kinds)
			if err := l.lookAtFetch(ctx, e.d.UnwrapTx(tx), jobs, snap); err != nil {
				return nil, err
			}
			out.admitted, out.admitErr = l.admitLocal(ctx, jobs, false, snap)
			took = out.admitted.took
		}
		marks = l.toMark(out.res, limited, took)
		if err := l.ledger.MarkFetched(ctx, e.d.UnwrapTx(tx), marks); err != nil {
			if out.admitted != nil {
				l.unadmit(out.admitted)
			}
			return nil, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		if out.admitted != nil {
			l.unadmit(out.admitted)
		}
		return nil, fmt.Errorf("commit the fetch: %w", err)
	}
	if out.ahead > 0 {
		l.trace("parked ahead", "queue", params.Queue, "jobs", out.ahead, "took", time.Since(t0))
	}
	if out.res != nil && len(out.res.Jobs) > 0 {
		// Other workers see the fetch's jobs (its marks) from its commit:
		// how long after River's statement that came.
		l.trace("fetch committed", "queue", params.Queue, "jobs", len(out.res.Jobs), "first", out.res.Jobs[0].ID,
			"after_fetch", time.Since(fetchedAt))
	}
	for _, m := range marks {
		if m.Leased {
			out.leased = append(out.leased, m)
		}
	}
	return out, nil
}

// lookAtFetch reads, in the fetch's transaction tx, the state of each kind
// on the leased path whose first attempts the fetch brought (and whose
// queue exists), into its queue's view, as the lease keeper does: a job
// takes a spare leased slot at its fetch only on a view younger than
// local.TakeFresh, and the keeper's, read every 25 ms, often is not by
// then (P2: a fetch takes ~27 ms). The read sees every fetch committed
// before this one's statement.
func (l *Limiter) lookAtFetch(ctx context.Context, tx pgx.Tx, jobs []*rivertype.JobRow, snap *limitsSnapshot) error {
	var looked []string
	for _, job := range jobs {
		if job.Attempt > 1 || everParked(job) || slices.Contains(looked, job.Kind) || snap.of(job.Kind).Regime() != ledger.Leased {
			continue
		}
		looked = append(looked, job.Kind)
		q := l.queues.get(job.Kind)
		if q == nil {
			continue // the keeper reads it once it serves the kind
		}
		heard, at := l.limits.gen.Load(), time.Now()
		st, err := l.ledger.LeaseStateOn(ctx, tx, job.Kind, l.keeper.cfg.WantedWindow)
		if err != nil {
			return fmt.Errorf("read %s at the fetch: %w", job.Kind, err)
		}
		if st.Present {
			q.SetView(viewOf(st, heard, at))
			l.TestSignals.LookedAtFetch.Signal(job.Kind)
		}
	}
	return nil
}

// noteLeasedMarks tells the kinds' queues of the jobs their fetch marked
// leased (once the jobs are in the queues): the lease keeper's next
// publication takes the marks away.
func (l *Limiter) noteLeasedMarks(marks []ledger.Fetched) {
	byKind := map[string][]int64{}
	for _, m := range marks {
		byKind[m.Kind] = append(byKind[m.Kind], m.ID)
	}
	for kind, ids := range byKind {
		q := l.queues.get(kind)
		if q == nil {
			continue // never decided: the marks run out
		}
		q.NoteLeasedMarks(ids)
	}
	if len(byKind) > 0 {
		l.keeper.wakeUp()
	}
}

// markedKinds is the limits of kinds that have one, as the worker's copy
// has them, when the limiter decides fetched jobs (none otherwise).
func (l *Limiter) markedKinds(ctx context.Context, kinds []string) map[string]ledger.Limits {
	if l.ignoreLimits || l.neverPark || l.isStopped() {
		return nil
	}
	out := l.limits.guess(ctx, kinds)
	for kind, lim := range out {
		if lim.Regime() == ledger.Unlimited {
			delete(out, kind)
		}
	}
	return out
}

// toMark is the jobs of res of limited kinds (limits) but those that took
// a leased slot at once (took), each marked leased when it is a first
// attempt, never parked, of a kind whose leased path is open in this
// worker (the worker's memory decides it: it waits for a leased slot, or,
// the path closed meanwhile, the ledger decides it).
func (l *Limiter) toMark(res *riverdriver.JobGetAvailableResult, limits map[string]ledger.Limits, took map[int64]bool) []ledger.Fetched {
	var out []ledger.Fetched
	open := map[string]bool{} // per kind, read once a fetch
	for _, job := range res.Jobs {
		lim, ok := limits[job.Kind]
		if !ok || job.Kind == ResumeKind || res.DecodeErrors[job.ID] != nil || took[job.ID] {
			continue
		}
		leased := false
		if lim.Regime() == ledger.Leased && job.Attempt <= 1 && !everParked(job) {
			o, read := open[job.Kind]
			if !read {
				o = true // no queue yet: the limits' copy's word
				if q := l.queues.get(job.Kind); q != nil {
					o = q.LeasedPathOpen()
				}
				open[job.Kind] = o
			}
			leased = o
		}
		key, _ := ledger.PartitionKey(job.EncodedArgs, lim.Fields)
		out = append(out, ledger.Fetched{ID: job.ID, Kind: job.Kind, Key: key, Leased: leased})
	}
	return out
}

// limitedOf is the jobs of kinds (the client's) that the limiter decides:
// not ResumeKind, args decoded.
func (l *Limiter) limitedOf(jobs []*rivertype.JobRow, decodeErrs map[int64]error, kinds []string) []*rivertype.JobRow {
	mine := make([]*rivertype.JobRow, 0, len(jobs))
	for _, job := range jobs {
		if job.Kind != ResumeKind && decodeErrs[job.ID] == nil && slices.Contains(kinds, job.Kind) {
			mine = append(mine, job)
		}
	}
	return mine
}

// fetched decides the fetched jobs of kinds (those of limited kinds) and
// returns those that parked: admitted is what the fetch's transaction
// did of it (admitLocal; nil: nothing, and admitErr what stopped it). A
// decision that fails leaves its jobs to the middleware.
func (l *Limiter) fetched(ctx context.Context, jobs []*rivertype.JobRow, decodeErrs map[int64]error, kinds []string,
	admitted *admission, admitErr error) (parked map[int64]bool, longLine bool) {
	if admitted == nil && (l.ignoreLimits || l.neverPark || l.isStopped()) {
		return nil, false
	}
	mine := l.limitedOf(jobs, decodeErrs, kinds)
	if len(mine) == 0 {
		return nil, false
	}
	if admitted == nil {
		admitted, admitErr = l.admitLocal(ctx, mine, false, nil)
	}
	gone, err := l.admitLedger(admitted)
	if err = cmp.Or(admitErr, err); err != nil {
		l.logger.Warn("concurrency limits: fetched jobs not decided at their fetch; deciding them in the middleware", "error", err)
	}
	parked = map[int64]bool{}
	for id, d := range gone {
		if d.Action == ledger.Parked || d.Action == ledger.StepBack {
			parked[id] = true
			longLine = longLine || d.LongLine
		}
	}
	// What goes to River undecided (no limit now) is decided in the
	// middleware, together and in order, if a limit comes meanwhile.
	var undecided []*rivertype.JobRow
	for _, job := range mine {
		if q := l.queues.get(job.Kind); !parked[job.ID] && (q == nil || q.Get(job.ID) == nil) {
			undecided = append(undecided, job)
		}
	}
	l.strays.add(undecided)
	return parked, longLine
}
