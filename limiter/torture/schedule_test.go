package torture

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/limiter"
	"github.com/sluice-dev/sluice/policy"
)

// A seed's schedule is drawn from the seed alone, before the run: every
// operation with every random choice made, and the offset from the
// schedule's start at which it runs. The run then carries it out; nothing
// it finds in the database changes what the schedule says (a River client
// call picks its job by a drawn fraction of the jobs it finds waiting), so
// TORTURE_SEED=N replays the same operations at the same offsets.

// Sizes of a seed's schedule.
const (
	// schedulePhase is how long a seed's operations go on.
	schedulePhase = 9 * time.Second
	// maxJobs caps the jobs a seed inserts.
	maxJobs = 1200
)

// opKind is what an operation of the schedule does.
type opKind int

const (
	opBurst   opKind = iota // insert several jobs of a kind at once
	opTrickle               // insert a few jobs a few ms apart
	opLimit                 // change a limit of a kind
	opClient                // cancel, delete or retry a waiting job through River's client
	opReplace               // start a worker, then stop or kill another
)

// plannedJob is a job an insert of the schedule makes.
type plannedJob struct {
	args        jobArgs
	maxAttempts int
}

// limitOp is a change of a kind's limits.
type limitOp struct {
	facet string // per-kind, breaker, per-key, rate, clear per-kind, clear per-key, clear rate, clear all
	n     int32  // per-kind and per-key limits
	rate  limiter.Rate
}

// op is one operation of a schedule.
type op struct {
	at   time.Duration // from the schedule's start
	what opKind
	kind string // torture.a or torture.b (inserts, limit changes)

	jobs     []plannedJob    // inserts
	oneByOne bool            // a burst inserted one job per transaction
	gaps     []time.Duration // a trickle's pause after each insert

	limit limitOp

	call string  // cancel, delete or retry
	pick float64 // which of the jobs found waiting: index pick × their number

	kill   bool          // kill (SIGKILL) rather than stop (SIGTERM)
	victim float64       // which of the live workers: index victim × their number
	park   time.Duration // the new worker's park-after
}

// policyOp is an enqueue policy in force on one kind for a seed's whole
// run: at most maxWaiting jobs of each key (by args field key) waiting,
// and a conflicting insert discarded or replacing the newest waiting job.
type policyOp struct {
	kind       string
	onConflict policy.OnConflict
	maxWaiting int32
}

// schedule is a seed's whole schedule.
type schedule struct {
	seed uint64
	// policy, when not nil, is in force from the start (set before the
	// first worker starts).
	policy *policyOp
	// slots is every worker's MaxWorkers for the default queue.
	slots int
	// parks are the park-after times of the workers started first.
	parks []time.Duration
	ops   []op
	// quiesceClear, per kind (a, b): at the end, clear every limit (true)
	// or set a per-kind limit of 20, then clear the per-key and rate limits.
	quiesceClear [2]bool
}

// parkAfters are the park-after times a worker is drawn with.
var parkAfters = []time.Duration{30 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond}

// drawSchedule draws the schedule of seed.
func drawSchedule(seed uint64) *schedule {
	rng := rand.New(rand.NewPCG(seed, 0x70727475))
	s := &schedule{seed: seed}
	workers := 2 + rng.IntN(2)
	s.slots = 8 + rng.IntN(17)
	for range workers {
		s.parks = append(s.parks, parkAfters[rng.IntN(len(parkAfters))])
	}
	jobs := 0
	for at := time.Duration(0); at < schedulePhase; at += time.Duration(10+rng.IntN(240)) * time.Millisecond {
		o, ok := drawOp(rng, &jobs)
		if ok {
			o.at = at
			s.ops = append(s.ops, o)
		}
	}
	for i := range s.quiesceClear {
		s.quiesceClear[i] = rng.IntN(2) == 0
	}
	s.policy = drawPolicy(seed)
	return s
}

// drawPolicy draws a seed's enqueue policy, or none (one seed in two),
// from a stream of its own, so that a seed's operations are what they
// were before policies came into the schedule.
func drawPolicy(seed uint64) *policyOp {
	rng := rand.New(rand.NewPCG(seed, 0x706f6c69))
	if rng.IntN(2) == 0 {
		return nil
	}
	return &policyOp{
		kind:       "torture." + []string{"a", "b"}[rng.IntN(2)],
		onConflict: []policy.OnConflict{policy.Discard, policy.Replace}[rng.IntN(2)],
		maxWaiting: int32(1 + rng.IntN(6)),
	}
}

// drawOp draws one operation; jobs counts the jobs inserted so far (no
// insert beyond maxJobs). ok is false for a pause.
func drawOp(rng *rand.Rand, jobs *int) (op, bool) {
	r := rng.IntN(100)
	o := op{kind: "torture." + []string{"a", "b"}[rng.IntN(2)]}
	switch {
	case r < 22:
		o.what = opBurst
		n := 5 + rng.IntN(50)
		for range n {
			o.jobs = append(o.jobs, drawJob(rng, o.kind))
		}
		o.oneByOne = rng.IntN(3) == 0
	case r < 32:
		o.what = opTrickle
		for range 3 + rng.IntN(8) {
			o.jobs = append(o.jobs, drawJob(rng, o.kind))
			o.gaps = append(o.gaps, time.Duration(5+rng.IntN(40))*time.Millisecond)
		}
	case r < 49:
		o.what = opLimit
		o.limit = drawLimit(rng)
	case r < 64:
		o.what = opClient
		o.call = []string{"cancel", "delete", "retry"}[rng.IntN(3)]
		o.pick = rng.Float64()
	case r < 68:
		o.what = opReplace
		o.kill = rng.IntN(2) == 0
		o.victim = rng.Float64()
		o.park = parkAfters[rng.IntN(len(parkAfters))]
	default:
		return op{}, false
	}
	if o.what == opBurst || o.what == opTrickle {
		if *jobs >= maxJobs {
			return op{}, false
		}
		*jobs += len(o.jobs)
	}
	return o, true
}

// drawJob draws a job of kind: a skewed key (k0 most often), a short
// duration, sometimes a failure or a snooze.
func drawJob(rng *rand.Rand, kind string) plannedJob {
	// Zipf-like: key i with weight 1/(i+1) over 8 keys.
	weights := []float64{1, 1.0 / 2, 1.0 / 3, 1.0 / 4, 1.0 / 5, 1.0 / 6, 1.0 / 7, 1.0 / 8}
	sum := 0.0
	for _, w := range weights {
		sum += w
	}
	p := rng.Float64() * sum
	key := 0
	for i, w := range weights {
		if p < w {
			key = i
			break
		}
		p -= w
	}
	j := plannedJob{args: jobArgs{K: strings.TrimPrefix(kind, "torture."), Key: fmt.Sprintf("k%d", key), MS: rng.IntN(30)},
		maxAttempts: 5}
	switch r := rng.IntN(100); {
	case r < 6:
		j.args.Fail = 1
	case r < 8:
		j.args.Fail, j.maxAttempts = 9, 2
	case r < 12:
		j.args.Snooze = true
	}
	return j
}

// drawLimit draws a change of a kind's limits.
func drawLimit(rng *rand.Rand) limitOp {
	switch r := rng.IntN(100); {
	case r < 22:
		return limitOp{facet: "per-kind", n: []int32{1, 2, 3, 4, 6}[rng.IntN(5)]}
	case r < 30:
		return limitOp{facet: "breaker", n: -1}
	case r < 50:
		return limitOp{facet: "per-key", n: []int32{1, 1, 2, 3}[rng.IntN(4)]}
	case r < 72:
		rate := limiter.Rate{Max: []int32{2, 3, 5, 8}[rng.IntN(4)], Per: []time.Duration{time.Second, 2 * time.Second}[rng.IntN(2)]}
		rate.PerKey = rng.IntN(2) == 0
		return limitOp{facet: "rate", rate: rate}
	case r < 80:
		return limitOp{facet: "clear per-kind"}
	case r < 88:
		return limitOp{facet: "clear per-key"}
	case r < 94:
		return limitOp{facet: "clear rate"}
	}
	return limitOp{facet: "clear all"}
}

// String is the operation on one line.
func (o op) String() string {
	at := fmt.Sprintf("%6.3fs", o.at.Seconds())
	switch o.what {
	case opBurst, opTrickle:
		keys := map[string]int{}
		fails, snoozes, ms := 0, 0, 0
		for _, j := range o.jobs {
			keys[j.args.Key]++
			ms += j.args.MS
			if j.args.Fail > 0 {
				fails++
			}
			if j.args.Snooze {
				snoozes++
			}
		}
		how := "burst (InsertMany)"
		switch {
		case o.what == opTrickle:
			how = "trickle"
		case o.oneByOne:
			how = "burst (one by one)"
		}
		return fmt.Sprintf("%s %s %s: %d jobs (%d keys, %d ms of work, %d failing, %d snoozing)", at, how, o.kind,
			len(o.jobs), len(keys), ms, fails, snoozes)
	case opLimit:
		switch o.limit.facet {
		case "per-kind", "per-key", "breaker":
			return fmt.Sprintf("%s limit %s %s %d", at, o.kind, o.limit.facet, o.limit.n)
		case "rate":
			scope := "per kind"
			if o.limit.rate.PerKey {
				scope = "per key"
			}
			return fmt.Sprintf("%s limit %s rate %s %s", at, o.kind, o.limit.rate, scope)
		}
		return fmt.Sprintf("%s limit %s %s", at, o.kind, o.limit.facet)
	case opClient:
		return fmt.Sprintf("%s River Job%s%s of the waiting job at %.3f", at, strings.ToUpper(o.call[:1]), o.call[1:], o.pick)
	case opReplace:
		how := "stop (SIGTERM)"
		if o.kill {
			how = "kill (SIGKILL)"
		}
		return fmt.Sprintf("%s start a worker (park-after %s), then %s the live worker at %.3f", at, o.park, how, o.victim)
	}
	return at + " ?"
}

// String is the schedule, one line per operation.
func (s *schedule) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: %d workers (park-after %v), MaxWorkers %d; at the end %s\n", s.seed, len(s.parks), s.parks,
		s.slots, s.quiesceString())
	if p := s.policy; p != nil {
		fmt.Fprintf(&b, "enqueue policy of %s: by key, max waiting %d, on conflict %s (its bursts go in one by one)\n",
			p.kind, p.maxWaiting, p.onConflict)
	}
	for _, o := range s.ops {
		b.WriteString(o.String())
		b.WriteByte('\n')
	}
	return b.String()
}

func (s *schedule) quiesceString() string {
	var out []string
	for i, clear := range s.quiesceClear {
		kind := "torture." + []string{"a", "b"}[i]
		if clear {
			out = append(out, "clear every limit of "+kind)
		} else {
			out = append(out, "limit "+kind+" to 20")
		}
	}
	return strings.Join(out, ", ")
}

// TestScheduleIsDrawnFromTheSeedAlone: a seed's schedule is the same every
// time it is drawn, and another seed's differs.
func TestScheduleIsDrawnFromTheSeedAlone(t *testing.T) {
	for _, seed := range []uint64{1, 101, 399460107, 792045804} {
		a, b := drawSchedule(seed).String(), drawSchedule(seed).String()
		if a != b {
			t.Fatalf("seed %d drawn twice differs:\n%s\n---\n%s", seed, a, b)
		}
		if c := drawSchedule(seed + 1).String(); c == a {
			t.Fatalf("seeds %d and %d draw the same schedule", seed, seed+1)
		}
		if n := len(drawSchedule(seed).ops); n < 20 {
			t.Fatalf("seed %d: only %d operations", seed, n)
		}
	}
}

// TestTortureSchedule prints the schedule of TORTURE_SEED without running
// it (go test -run TestTortureSchedule -v with TORTURE_SEED set).
func TestTortureSchedule(t *testing.T) {
	seed, ok := seedFromEnv(t)
	if !ok {
		t.Skip("TORTURE_SEED not set")
	}
	t.Logf("schedule:\n%s", drawSchedule(seed))
}
