package torture

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
)

// violation is one broken promise.
type violation struct {
	check string
	msg   string
}

func (v violation) String() string { return v.check + ": " + v.msg }

// maxPerCheck caps the violations a check reports.
const maxPerCheck = 20

// violations are what the checks found, counted per check.
type violations struct {
	list  []violation
	count map[string]int
}

func (vs *violations) add(check, format string, args ...any) {
	if vs.count == nil {
		vs.count = map[string]int{}
	}
	vs.count[check]++
	if vs.count[check] <= maxPerCheck {
		vs.list = append(vs.list, violation{check: check, msg: fmt.Sprintf(format, args...)})
	}
}

// merge adds o's violations to vs.
func (vs *violations) merge(o *violations) {
	vs.list = append(vs.list, o.list...)
	for k, v := range o.count {
		if vs.count == nil {
			vs.count = map[string]int{}
		}
		vs.count[k] += v
	}
}

// The checks, in the order of the coverage table.
var checkNames = []string{"limit", "rate", "order", "fairness", "liveness", "outcome", "herd", "accounting"}

// Starvation: a check that exempted more than maxExempt of its candidates
// judged too little for its silence to mean anything. A seed, or a run,
// with fewer than minCandidates candidates of a check is not judged on it
// (one or two seeds of a short run say little of a rare event, a key behind
// another's backlog say); a run of minSeedsSilent seeds or more in which a
// check judged nothing at all fails.
const (
	maxExempt      = 0.10
	minCandidates  = 30
	minSeedsSilent = 10
)

// checkCoverage is what one check looked at: the events it judged (a
// start, a window, a job, a sample...), those it exempted from judgement
// and why, and the pairs a stated tolerance excused (judged events, shown
// so that a tolerance that excuses too much is seen).
type checkCoverage struct {
	judged  int
	exempt  map[string]int
	excused map[string]int
}

func (c *checkCoverage) exempted() int {
	n := 0
	for _, v := range c.exempt {
		n += v
	}
	return n
}

// drainExempt is why a check exempts a run that only the drain's own
// changes of limits (the harness's, after the schedule) left without a
// limit it could judge by: shown in the table, but neither a candidate nor
// an exemption of the seed's schedule for starvation.
const drainExempt = "the drain's change of limits, after the schedule"

// candidates is what starvation judges a check by: its events judged and
// exempted, and of them exempted, but those exempted for the drain's own
// changes (drainExempt).
func (c *checkCoverage) candidates() (n, exempted int) {
	exempted = c.exempted() - c.exempt[drainExempt]
	return c.judged + exempted, exempted
}

// coverage is every check's.
type coverage map[string]*checkCoverage

func newCoverage() coverage {
	c := coverage{}
	for _, name := range checkNames {
		c[name] = &checkCoverage{exempt: map[string]int{}, excused: map[string]int{}}
	}
	return c
}

// judge counts an event check judged.
func (c coverage) judge(check string) { c[check].judged++ }

// exempt counts an event check skipped, and why.
func (c coverage) exempt(check, why string) { c[check].exempt[why]++ }

// excuse counts a would-be violation of check that a stated tolerance
// excused.
func (c coverage) excuse(check, tolerance string) { c[check].excused[tolerance]++ }

func (c coverage) add(o coverage) {
	for name, oc := range o {
		cc := c[name]
		if cc == nil {
			cc = &checkCoverage{exempt: map[string]int{}, excused: map[string]int{}}
			c[name] = cc
		}
		cc.judged += oc.judged
		for k, v := range oc.exempt {
			cc.exempt[k] += v
		}
		for k, v := range oc.excused {
			cc.excused[k] += v
		}
	}
}

// starved lists the checks that exempted more than maxExempt of their
// candidates (judged and exempted), among those with at least
// minCandidates candidates; with silent, a check with no candidate at all
// is starved too.
func (c coverage) starved(silent bool) []string {
	var out []string
	for _, name := range checkNames {
		cc := c[name]
		if cc == nil {
			continue
		}
		n, exempted := cc.candidates()
		switch {
		case n == 0 && silent:
			out = append(out, fmt.Sprintf("check starved: %s judged nothing", name))
		case n < minCandidates:
		case float64(exempted) > maxExempt*float64(n):
			out = append(out, fmt.Sprintf("check starved: %s exempted %d of %d candidates (%.0f%%, at most %.0f%%): %s",
				name, exempted, n, 100*float64(exempted)/float64(n), 100*maxExempt, reasons(cc.exempt)))
		}
	}
	return out
}

// table is the coverage as a table: per check, the events judged and
// exempted (with why), and what the tolerances excused.
func (c coverage) table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-11s %8s %8s %7s  %s\n", "check", "judged", "exempt", "share", "exempted (why) | excused by a tolerance")
	for _, name := range checkNames {
		cc := c[name]
		if cc == nil {
			continue
		}
		n := cc.judged + cc.exempted()
		share := 0.0
		if n > 0 {
			share = 100 * float64(cc.exempted()) / float64(n)
		}
		fmt.Fprintf(&b, "%-11s %8d %8d %6.1f%%  %s | %s\n", name, cc.judged, cc.exempted(), share, reasons(cc.exempt),
			reasons(cc.excused))
	}
	return b.String()
}

// reasons lists a count map, largest first.
func reasons(m map[string]int) string {
	if len(m) == 0 {
		return "-"
	}
	keys := slices.Collect(maps.Keys(m))
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		return keys[i] < keys[j]
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

// tally counts what the seeds did and found.
type tally struct {
	seeds      int
	ops        map[string]int
	jobs, runs int
	parkings   int
	violations map[string]int
	coverage   coverage
}

func newTally() *tally {
	return &tally{ops: map[string]int{}, violations: map[string]int{}, coverage: newCoverage()}
}

func (t *tally) add(o *tally) {
	t.seeds += o.seeds
	t.jobs += o.jobs
	t.runs += o.runs
	t.parkings += o.parkings
	for k, v := range o.ops {
		t.ops[k] += v
	}
	for k, v := range o.violations {
		t.violations[k] += v
	}
	t.coverage.add(o.coverage)
}

func (t *tally) String() string {
	total := 0
	for _, v := range t.violations {
		total += v
	}
	return fmt.Sprintf("seeds %d, jobs %d, executions %d, parkings %d; operations: %s; violations %d (%s)",
		t.seeds, t.jobs, t.runs, t.parkings, reasons(t.ops), total, reasons(t.violations))
}

// summary is the tally and the coverage table.
func (t *tally) summary() string { return t.String() + "\n" + t.coverage.table() }

// starved is the run's starved checks over every seed.
func (t *tally) starved() []string { return t.coverage.starved(t.seeds >= minSeedsSilent) }
