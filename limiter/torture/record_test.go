package torture

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// unlimited is the capacity of no limit.
const unlimited = math.MaxInt32

// run is one real execution, as its worker recorded it.
type run struct {
	id      int64
	job     int64
	kind    string
	key     string
	attempt int
	worker  string
	start   time.Time
	// slot is the concurrency slot its worker's limiter let it start on
	// (leased, line, none; "": the limiter did not decide it).
	slot string
	// end is when it ended: as recorded, or when its worker was killed;
	// zero if neither (still running).
	end     time.Time
	outcome string // ok, fail, snooze, cancelled; "" if it never ended
	// cut: its worker was killed while it ran (end is the kill).
	cut bool
}

// change is one state change of a job (torture_states).
type change struct {
	job         int64
	from, to    string // to is "deleted" for a deletion
	scheduledAt time.Time
	client      string // the worker that fetched it last
	at          time.Time
	query       string // the statement that resumed it (from pending)
	tx          int64  // its transaction
}

// limits is a torture kind's limits at some time.
type limits struct {
	present    bool // a concurrency_limits row
	max        int32
	fields     []string
	keyMax     int32
	rateMax    int32
	ratePeriod time.Duration
	ratePerKey bool
}

// kindCap is how many jobs of the kind may run at once.
func (l limits) kindCap() int {
	switch {
	case !l.present || l.max == 0:
		return unlimited
	case l.max < 0:
		return 0
	}
	return int(l.max)
}

// keyCap is how many jobs of one key may run at once.
func (l limits) keyCap() int {
	if l.present && l.keyMax > 0 {
		return int(l.keyMax)
	}
	return unlimited
}

// hasRate reports whether a rate limit is set.
func (l limits) hasRate() bool { return l.present && l.rateMax > 0 }

// keyed reports whether the limits have a partition (key of a job: its
// args' "key"); else every job of the kind has the key "".
func (l limits) keyed() bool { return l.present && len(l.fields) > 0 }

// strict reports whether jobs of a key must start in job-id order without
// exception: the kind has a per-key limit or a rate (it never uses leased
// slots).
func (l limits) strict() bool { return l.keyed() || l.hasRate() }

// limited reports whether any limit holds.
func (l limits) limited() bool {
	return l.present && (l.max != 0 || l.keyMax > 0 || l.rateMax > 0)
}

// equal reports whether l and o are the same limits.
func (l limits) equal(o limits) bool {
	return l.present == o.present && l.max == o.max && slices.Equal(l.fields, o.fields) && l.keyMax == o.keyMax &&
		l.rateMax == o.rateMax && l.ratePeriod == o.ratePeriod && l.ratePerKey == o.ratePerKey
}

func (l limits) rateEqual(o limits) bool {
	return l.hasRate() == o.hasRate() && (!l.hasRate() ||
		(l.rateMax == o.rateMax && l.ratePeriod == o.ratePeriod && l.ratePerKey == o.ratePerKey &&
			(!l.ratePerKey || slices.Equal(l.fields, o.fields))))
}

func (l limits) String() string {
	if !l.present {
		return "none"
	}
	s := fmt.Sprintf("max %d", l.max)
	if l.keyMax > 0 {
		s += fmt.Sprintf(", %d per key", l.keyMax)
	}
	if l.rateMax > 0 {
		s += fmt.Sprintf(", rate %d/%s", l.rateMax, l.ratePeriod)
		if l.ratePerKey {
			s += " per key"
		}
	}
	return s
}

// limitChange is a change of a kind's limits, at the commit of its
// transaction (a deferred trigger). Until changeWindow after it, a worker
// may still follow the limits before it; from the transaction's beginning
// (began) the transaction itself acts on the new ones (a clear lets the
// line go, a raise grants, before the commit).
type limitChange struct {
	at, began time.Time
	tx        int64 // its transaction (0: not known)
	limits    limits
}

// job is a torture job as the test inserted it, with its state at the end.
type job struct {
	id          int64
	kind        string
	args        jobArgs
	maxAttempts int
	// inserted is when its insert had committed (the database's clock
	// right after it returned).
	inserted time.Time
	// final is its state at the end ("" when deleted); attempt its River
	// attempt count then.
	final   string
	attempt int
	// errors are the errors River recorded for its attempts.
	errors []string
}

// clientOp is a River client call of the test on a job.
type clientOp struct {
	op            string // cancel, delete, retry
	job           int64
	before, after time.Time
	state         string // the job's state as the call returned it
}

// workerEvent is a worker process started, stopped or killed.
type workerEvent struct {
	worker string
	what   string // start, stop, kill
	at     time.Time
}

// record is everything the checks read: what really ran, what changed, and
// what the test did.
type record struct {
	runs    []run
	changes map[int64][]change // by job, in order
	// commits are when the transactions that fetched jobs committed (by
	// transaction), for diagnosis.
	commits map[int64]time.Time
	limits  map[string][]limitChange
	jobs    map[int64]*job
	ops     []clientOp
	workers []workerEvent
	// begin and end bound the observation: the first insert, and the
	// moment every job had ended.
	begin, end time.Time
	// drainFrom is when the schedule ended and the harness's drain began
	// (its own changes of limits: quiesce); zero when unknown.
	drainFrom time.Time
	// parkAfter is the longest park-after of the workers.
	parkAfter time.Duration
	// runsOf indexes runs by job (indexRuns).
	runsOf map[int64][]run
	// samples are the accounting samples taken while the schedule ran.
	samples []sample
	// line is, by job, every change of the limiter's rows for it
	// (torture_line): for the diagnosis in a violation's report only,
	// never to excuse one.
	line map[int64][]lineEvent
	// marks is, by job, every change of its parking mark (torture_marks):
	// for diagnosis only, as line.
	marks map[int64][]lineEvent
}

// sample is the limiter's count of the torture kinds' slots at one moment.
type sample struct {
	// at is a time before the sample's snapshot was taken, to a time
	// after it (zero: at).
	at, to time.Time
	// counted is each limited kind's count on its limit row (admitted);
	// rows the slot rows and leased slots it stands for.
	counted, rows map[string]int
	// keyRows is the slot rows of each key (kind, then key), keyCounted
	// the slots counted on the key's row (concurrency_key_lines.slots).
	keyRows, keyCounted map[string]map[string]int
	// slots are the slot rows, for a report.
	slots []sampleSlot
}

// until is a time after the sample's snapshot was taken.
func (s sample) until() time.Time {
	if s.to.IsZero() {
		return s.at
	}
	return s.to
}

// when is the sample's times, for a report.
func (s sample) when() string {
	return s.at.Format(time.StampMicro) + "–" + s.until().Format("05.000000")
}

// sampleSlot is a slot row of a sample.
type sampleSlot struct {
	Job      int64   `json:"job"`
	Kind     string  `json:"kind"`
	Key      *string `json:"key"`
	Reserved bool    `json:"reserved"`
	Worker   *string `json:"worker"`
}

// lineEvent is a change of a job's slot or waiter row.
type lineEvent struct {
	what     string // table and operation
	reserved bool
	worker   string
	at       time.Time
	query    string
	tx       int64 // the transaction that made it
}

// kinds are the torture kinds.
var kinds = []string{"torture.a", "torture.b"}

// limitsAt is kind's limits at t: those of the last change made by then.
func (r *record) limitsAt(kind string, t time.Time) limits {
	var out limits
	for _, c := range r.limits[kind] {
		if c.at.After(t) {
			break
		}
		out = c.limits
	}
	return out
}

// possible is every limits of kind that a decision at t on worker may
// follow ("": any worker): the last ones in force by t, those before a
// change made less than changeWindow before t, unless the worker started
// after that change (it read the limits afresh), and those of a change
// whose transaction had begun by t (it acts on them before its commit).
func (r *record) possible(kind, worker string, t time.Time) []limits {
	var started time.Time
	if worker != "" {
		started = r.startedAt(worker)
	}
	var prev limits
	var out []limits
	var inFlight *limits // a change whose transaction had begun by t acts on its limits before its commit
	for _, c := range r.limits[kind] {
		if c.at.After(t) {
			if !c.began.IsZero() && !c.began.After(t) {
				inFlight = &c.limits
			}
			break
		}
		if t.Before(c.at.Add(changeWindow)) && !started.After(c.at) {
			out = appendLimits(out, prev)
		}
		prev = c.limits
	}
	out = appendLimits(out, prev)
	if inFlight != nil {
		out = appendLimits(out, *inFlight) // last: the limits' order is the changes' order
	}
	return out
}

// appendLimits appends l to ls unless it is there.
func appendLimits(ls []limits, l limits) []limits {
	for _, x := range ls {
		if x.equal(l) {
			return ls
		}
	}
	return append(ls, l)
}

// limitsDuring is every limits of kind a decision at some instant of
// [t0, t1] may follow.
func (r *record) limitsDuring(kind string, t0, t1 time.Time) []limits {
	out := r.possible(kind, "", t0)
	for _, c := range r.limits[kind] {
		if c.at.After(t0) && !c.at.After(t1) {
			out = appendLimits(out, c.limits)
		}
	}
	return out
}

// indexRuns indexes the runs by job.
func (r *record) indexRuns() {
	if r.runsOf != nil {
		return
	}
	r.runsOf = map[int64][]run{}
	for _, x := range r.runs {
		r.runsOf[x.job] = append(r.runsOf[x.job], x)
	}
}

// stateAt is the job's last change at or before t (ok false: none yet).
func (r *record) stateAt(id int64, t time.Time) (change, bool) {
	cs := r.changes[id]
	i := sort.Search(len(cs), func(i int) bool { return cs[i].at.After(t) })
	if i == 0 {
		return change{}, false
	}
	return cs[i-1], true
}

// loadRecord reads the record: the executions from the workers' run logs
// in runsDir, the rest from the database; jobs, ops and workers are the
// test's own.
func loadRecord(ctx context.Context, pool *pgxpool.Pool, runsDir string, inserted map[int64]*job, ops []clientOp,
	workers []workerEvent, samples []sample, parkAfter time.Duration) (*record, error) {
	r := &record{changes: map[int64][]change{}, limits: map[string][]limitChange{}, jobs: inserted, ops: ops,
		workers: workers, samples: samples, parkAfter: parkAfter}
	runs, err := readRunLogs(runsDir)
	if err != nil {
		return nil, err
	}
	for _, x := range runs {
		if x.end.IsZero() {
			if killed := r.killedAt(x.worker); !killed.IsZero() {
				x.end, x.cut = killed, true
			}
		}
		r.runs = append(r.runs, x)
	}
	rows, err := pool.Query(ctx, `SELECT job_id, COALESCE(old_state, ''), new_state, scheduled_at, COALESCE(client, ''), at,
		COALESCE(query, ''), tx FROM public.torture_states ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("read state changes: %w", err)
	}
	for rows.Next() {
		var c change
		var sched *time.Time
		if err := rows.Scan(&c.job, &c.from, &c.to, &sched, &c.client, &c.at, &c.query, &c.tx); err != nil {
			return nil, err
		}
		if sched != nil {
			c.scheduledAt = *sched
		}
		r.changes[c.job] = append(r.changes[c.job], c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read state changes: %w", err)
	}
	commits, err := pool.Query(ctx, `SELECT tx, at FROM public.torture_commits`)
	if err != nil {
		return nil, fmt.Errorf("read fetch commits: %w", err)
	}
	r.commits = map[int64]time.Time{}
	for commits.Next() {
		var tx int64
		var at time.Time
		if err := commits.Scan(&tx, &at); err != nil {
			return nil, err
		}
		r.commits[tx] = at
	}
	if err := commits.Err(); err != nil {
		return nil, fmt.Errorf("read fetch commits: %w", err)
	}
	for id, cs := range r.changes {
		// Changes of one statement are logged in row order, at increasing
		// clock times; keep them in time order whatever the log's order.
		sort.SliceStable(cs, func(i, j int) bool { return cs[i].at.Before(cs[j].at) })
		r.changes[id] = unseenPendingFolded(cs)
	}
	r.line = map[int64][]lineEvent{}
	rows, err = pool.Query(ctx, `SELECT job_id, what, COALESCE(reserved, false), COALESCE(worker, ''), at, COALESCE(query, ''), tx
		FROM public.torture_line ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("read line changes: %w", err)
	}
	for rows.Next() {
		var id int64
		var e lineEvent
		if err := rows.Scan(&id, &e.what, &e.reserved, &e.worker, &e.at, &e.query, &e.tx); err != nil {
			return nil, err
		}
		r.line[id] = append(r.line[id], e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read line changes: %w", err)
	}
	r.marks = map[int64][]lineEvent{}
	rows, err = pool.Query(ctx, `SELECT job_id, format('mark %s→%s (%s→%s)', COALESCE(old_mark, '-'), COALESCE(new_mark, '-'),
		old_state, new_state), at, COALESCE(query, ''), tx FROM public.torture_marks ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("read mark changes: %w", err)
	}
	for rows.Next() {
		var id int64
		var e lineEvent
		if err := rows.Scan(&id, &e.what, &e.at, &e.query, &e.tx); err != nil {
			return nil, err
		}
		r.marks[id] = append(r.marks[id], e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read mark changes: %w", err)
	}
	rows, err = pool.Query(ctx, `SELECT kind, present, COALESCE(max_concurrency, 0), partition_fields, COALESCE(key_max, 0),
		COALESCE(rate_max, 0), COALESCE(rate_period_ms, 0), COALESCE(rate_per_key, false), at, began, tx
		FROM public.torture_limits ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("read limit changes: %w", err)
	}
	for rows.Next() {
		var kind string
		var l limits
		var periodMS int64
		var at, began time.Time
		var tx int64
		if err := rows.Scan(&kind, &l.present, &l.max, &l.fields, &l.keyMax, &l.rateMax, &periodMS, &l.ratePerKey, &at, &began, &tx); err != nil {
			return nil, err
		}
		l.ratePeriod = time.Duration(periodMS) * time.Millisecond
		r.limits[kind] = append(r.limits[kind], limitChange{at: at, began: began, tx: tx, limits: l})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read limit changes: %w", err)
	}
	rows, err = pool.Query(ctx, `SELECT id, state::text, attempt,
		COALESCE((SELECT array_agg(e->>'error') FROM unnest(errors) e), '{}')
		FROM river_job WHERE kind LIKE 'torture.%'`)
	if err != nil {
		return nil, fmt.Errorf("read jobs: %w", err)
	}
	type final struct {
		state   string
		attempt int
		errors  []string
	}
	finals, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (struct {
		id int64
		final
	}, error) {
		var x struct {
			id int64
			final
		}
		err := row.Scan(&x.id, &x.state, &x.attempt, &x.errors)
		return x, err
	})
	if err != nil {
		return nil, fmt.Errorf("read jobs: %w", err)
	}
	for _, f := range finals {
		if j, ok := r.jobs[f.id]; ok {
			j.final, j.attempt, j.errors = f.state, f.attempt, f.errors
		}
	}
	for _, j := range r.jobs {
		if cs := r.changes[j.id]; len(cs) > 0 && (r.begin.IsZero() || cs[0].at.Before(r.begin)) {
			r.begin = cs[0].at
		}
	}
	r.end, err = dbNow(ctx, pool)
	return r, err
}

// argsOf decodes a job's args.
func argsOf(raw []byte) (jobArgs, error) {
	var a jobArgs
	err := json.Unmarshal(raw, &a)
	return a, err
}

// readRunLogs reads the executions of every worker's run log in dir, in
// start order.
func readRunLogs(dir string) ([]run, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*"+runLogExt))
	if err != nil {
		return nil, err
	}
	var out []run
	for _, path := range files {
		worker := strings.TrimSuffix(filepath.Base(path), runLogExt)
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read run log: %w", err)
		}
		byRun := map[int64]int{}
		for i, line := range bytes.Split(data, []byte("\n")) {
			if len(line) == 0 {
				continue
			}
			var l runLine
			if err := json.Unmarshal(line, &l); err != nil {
				return nil, fmt.Errorf("run log %s line %d: %w", path, i+1, err)
			}
			at := time.Unix(0, l.At)
			if l.Outcome == "" {
				byRun[l.Run] = len(out)
				out = append(out, run{id: int64(len(out) + 1), job: l.Job, kind: l.Kind, key: l.Key, attempt: l.Attempt,
					worker: worker, start: at, slot: l.Slot})
				continue
			}
			k, ok := byRun[l.Run]
			if !ok {
				return nil, fmt.Errorf("run log %s line %d: the end of run %d, which never started", path, i+1, l.Run)
			}
			out[k].end, out[k].outcome = at, l.Outcome
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].start.Before(out[j].start) })
	return out, nil
}

// inDrain reports whether a run fetched at fetch and started at start may
// have followed limits only because of the drain's own changes of kind's
// limits (after the schedule): both times are in the drain, past the
// change window of every change the schedule made.
func (r *record) inDrain(kind string, fetch, start time.Time) bool {
	if r.drainFrom.IsZero() || fetch.Before(r.drainFrom) || start.Before(r.drainFrom) {
		return false
	}
	for _, c := range r.limits[kind] {
		if c.at.Before(r.drainFrom) && fetch.Before(c.at.Add(changeWindow)) {
			return false
		}
	}
	return true
}

// unseenPendingFolded folds a job's pending state that no other
// transaction saw (made and left in one transaction: a step back, or a
// grant as its parking completed, which sluice_step_back resumes in the
// statement that parked it; a parking at a fetch and a resume in one
// release) into one change from the state before to the state after, as
// every other session saw the job; a fold back to the same state is no
// change. cs is in time order.
func unseenPendingFolded(cs []change) []change {
	out := make([]change, 0, len(cs))
	for i := 0; i < len(cs); i++ {
		c := cs[i]
		if i+1 < len(cs) && c.to == "pending" && c.tx != 0 {
			if n := cs[i+1]; n.from == "pending" && n.tx == c.tx {
				c.to, c.query, c.scheduledAt = n.to, n.query, n.scheduledAt
				if n.client != "" {
					c.client = n.client
				}
				i++
				if c.from == c.to {
					continue
				}
			}
		}
		out = append(out, c)
	}
	return out
}

// lateFetchCommit is how long after River's statement a fetch may commit
// before the test reports it: the order promise's 50 ms less the age of
// the view a leased slot is given on (30 ms: local.TakeFresh). A fetch
// later than that would let a younger job pass its jobs, were it not
// counted while in flight (ledger.LeaseState, after 10 ms).
const lateFetchCommit = 20 * time.Millisecond

// lateFetchCommits counts the fetches (transactions that moved jobs to
// running) that committed more than d after the first of their jobs was
// marked running, and the latest such commit's lag.
func (r *record) lateFetchCommits(d time.Duration) (n int, worst time.Duration) {
	first := map[int64]time.Time{} // transaction → its first running mark
	for _, cs := range r.changes {
		for _, c := range cs {
			if c.to == "running" {
				if f, ok := first[c.tx]; !ok || c.at.Before(f) {
					first[c.tx] = c.at
				}
			}
		}
	}
	for tx, f := range first {
		if at, ok := r.commits[tx]; ok {
			if lag := at.Sub(f); lag > d {
				n++
				worst = max(worst, lag)
			}
		}
	}
	return n, worst
}
