package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
)

// Spec says how to read one benchmark's metrics as a row of the table.
type Spec struct {
	// What the row measures, in a few words.
	What string
	// Figure and Comparison are the units of the figure and of the
	// comparison measured beside it in the same run.
	Figure, Comparison string
	// TargetOn is the unit the target applies to (usually "ratio").
	TargetOn string
	// Cmp is how the value must compare with the target: "<", "<=", ">="
	// or ">"; "" when the row has no target.
	Cmp string
	// Target, when not zero, is the target itself; otherwise it is the
	// benchmark's "target" metric.
	Target float64
}

// specs are the benchmarks of the issues, by name. A row may come from a
// benchmark under another key: key "Name#suffix" reads benchmark Name.
// Benchmarks not listed here still get a row, read by convention (see
// guessSpec).
var specs = map[string]Spec{
	"BenchmarkNoopSluiceWorker": {
		What:   "P1 no-op jobs through a `sluice worker` process (vs raw River decoding the same args, same server, best of 5 rounds each)",
		Figure: "jobs/s", Comparison: "river-jobs/s", TargetOn: "ratio", Cmp: ">=",
	},
	"BenchmarkNoopTracing": {
		What:   "tracing: P1's no-op jobs through a `sluice worker` process with tracing on (OTLP/HTTP to a collector that discards, every job inserted in a trace) vs off (the default), best of 5 alternating rounds; ratio = on/off; no target: the cost when on",
		Figure: "traced-jobs/s", Comparison: "jobs/s",
	},
	"BenchmarkMetricsOverhead": {
		What:   "metrics (P1 may drop 0.02 at most): the job metrics middleware's time per job (a loop of a million no-op executions) vs the worker process's CPU per job (River's client and middleware, 5 rounds of 20,000 jobs); ratio = 1 − the share",
		Figure: "metrics-ns/job", Comparison: "process-cpu-ns/job", TargetOn: "ratio", Cmp: ">=",
	},
	"BenchmarkMetricsOverhead#throughput": {
		What:   "metrics: no-op jobs/s with the metrics middleware (vs without it, same run, medians of 5 alternating rounds, which vary by ±5% here); no target",
		Figure: "jobs/s", Comparison: "baseline-jobs/s",
	},
	"BenchmarkConcurrencyLimitOverhead": {
		What:   "P2 concurrency limits: no-op jobs under a limit never reached (vs no limit row)",
		Figure: "limited-jobs/s", Comparison: "baseline-jobs/s", TargetOn: "ratio", Cmp: ">=",
	},
	"BenchmarkConcurrencyLimitParked": {
		What:   "P3 concurrency limits: limit 4, 400 jobs of 50 ms (vs the ideal 4 per 50 ms); ratio = ideal / achieved time",
		Figure: "ms/run", Comparison: "ideal-ms/run", TargetOn: "ratio", Cmp: ">=",
	},
	// The second target of the same benchmark, which reports only
	// the first as its target metric.
	"BenchmarkConcurrencyLimitParked#latency": {
		What:   "P3 concurrency limits: p50 from a slot's release to the next parked job's start (p99 beside it)",
		Figure: "p50-release-to-start-ms", Comparison: "p99-release-to-start-ms", TargetOn: "p50-release-to-start-ms", Cmp: "<", Target: 50,
	},
	"BenchmarkDispatchLag": {
		What:   "P4 scheduler: p99 dispatch lag, 10,000 schedules due at once, 2 worker processes (vs inserting the same jobs in one InsertMany)",
		Figure: "p99-ms", Comparison: "baseline-ms", TargetOn: "ratio", Cmp: "<=",
	},
	"BenchmarkDropCancelingBuilds": {
		What:   "P5 ci.drop_canceling_builds: one run, 1,000,000 builds, 10,000 stuck (vs one set-based UPDATE)",
		Figure: "ms/run", Comparison: "baseline-ms/run", TargetOn: "ratio", Cmp: "<=",
	},
	"BenchmarkExportStuckJobs": {
		What:   "P6 export.stuck_jobs: one run, 100,000 active exports, 1,000 stuck (vs one statement that finds and marks them)",
		Figure: "ms/run", Comparison: "floor-ms/run", TargetOn: "ratio", Cmp: "<=",
	},
	"BenchmarkNoopAsynq": {
		What:   "P7 no-op jobs through a `sluice worker` process on Postgres (vs asynq on the local Redis, same concurrency); ratio = sluice / asynq",
		Figure: "jobs/s", Comparison: "asynq-jobs/s", TargetOn: "ratio", Cmp: ">=",
	},
	"BenchmarkNoopAsynq#river": {
		What:   "P7 raw River, same run, for reference: no-op jobs through a bare River client; no target",
		Figure: "river-jobs/s",
	},
	"BenchmarkConcurrencyLimitBinding": {
		What:   "P9 concurrency limits: 20,000 no-op jobs through a limit of 8 on 2 workers (vs no limit, same 2 workers)",
		Figure: "limited-jobs/s", Comparison: "baseline-jobs/s", TargetOn: "ratio", Cmp: ">=",
	},
	// How often a job was fetched in the same benchmark (no target).
	"BenchmarkConcurrencyLimitBinding#fetches": {
		What:   "P9 concurrency limits: times each job was fetched, on average (1 + parkings per job); no target",
		Figure: "fetches/job",
	},
	"BenchmarkPerKeyLimit": {
		What:   "P10 per-key limits: 20,000 no-op jobs over 100 keys, a per-key limit of 2, 2 workers (vs no limit, same jobs and workers)",
		Figure: "limited-jobs/s", Comparison: "baseline-jobs/s", TargetOn: "ratio", Cmp: ">=",
	},
	"BenchmarkPerKeyLimit#fetches": {
		What:   "P10 per-key limits: times each job was fetched, on average (1 + parkings per job); no target",
		Figure: "fetches/job",
	},
	"BenchmarkBreakerRaised": {
		What:   "P12 concurrency limits: a circuit breaker raised to 2 over 2,000 parked jobs of 10 ms, 2 workers (vs the ideal 2 per 10 ms); ratio = ideal / achieved drain time",
		Figure: "drain-ms", Comparison: "ideal-ms", TargetOn: "ratio", Cmp: ">=",
	},
	"BenchmarkBreakerRaised#parkings": {
		What:   "P12 concurrency limits: parkings per job in all, the first one included (the most jobs available at once after the raise beside it)",
		Figure: "parkings/job", Comparison: "max-available", TargetOn: "parkings/job", Cmp: "<=", Target: 1.05,
	},
	"BenchmarkParkedDrain": {
		What:   "P15 concurrency limits: 20,000 parked 0-ms jobs drained on one worker after a breaker is lifted to a limit of 8 (vs the same jobs through a limit of 8, never parked)",
		Figure: "drain-jobs/s", Comparison: "baseline-jobs/s", TargetOn: "ratio", Cmp: ">=",
	},
	"BenchmarkSteadyStreamManyKeys": {
		What:   "P14 concurrency limits: a steady stream of 750 no-op jobs/s over 200,000 tenants for 3 minutes on one worker, per-kind 8 and per-key 1: the share of the jobs completed by the stream's end (vs the same stream with no limit)",
		Figure: "limited-completed", Comparison: "baseline-completed", TargetOn: "ratio", Cmp: ">=",
	},
	"BenchmarkEnqueuePolicy": {
		What:   "P13 enqueue policies: single Insert calls from 8 goroutines of a kind under a discard policy whose keys are all full (vs a kind with no policy, alternating rounds, medians of 3)",
		Figure: "discard-inserts/s", Comparison: "plain-inserts/s", TargetOn: "ratio", Cmp: ">=",
	},
	"BenchmarkEnqueuePolicy#replace": {
		What:   "P13 enqueue policies: the same under a replace policy: replace/plain (replace inserts/s beside it)",
		Figure: "replace/plain", Comparison: "replace-inserts/s", TargetOn: "replace/plain", Cmp: ">=", Target: 0.80,
	},
	"BenchmarkEnqueuePolicy#many": {
		What:   "P13 enqueue policies: InsertMany of 10,000 under a discard policy, every key full: discard/plain (discard rows/s beside it)",
		Figure: "many-discard/plain", Comparison: "discard-many-rows/s", TargetOn: "many-discard/plain", Cmp: ">=", Target: 0.80,
	},
	"BenchmarkEnqueuePolicy#many-replace": {
		What:   "P13 enqueue policies: InsertMany of 10,000 under a replace policy, every key full: replace/plain (replace rows/s beside it; plain rows/s in the log)",
		Figure: "many-replace/plain", Comparison: "replace-many-rows/s", TargetOn: "many-replace/plain", Cmp: ">=", Target: 0.80,
	},
	"BenchmarkEnqueuePolicy#river-unique": {
		What:   "P13 reference: River's own duplicate answer (UniqueOpts ByArgs, no policy), single inserts/s (InsertMany rows/s beside it); no target",
		Figure: "river-unique-inserts/s", Comparison: "river-unique-many-rows/s",
	},
	"BenchmarkRateLimit": {
		What:   "P11 rate limits: 200 starts/s for 30 s, 2 workers, a backlog (achieved starts/s vs the configured rate)",
		Figure: "starts/s", Comparison: "configured-starts/s", TargetOn: "ratio", Cmp: ">=",
	},
	"BenchmarkRateLimit#window": {
		What:   "P11 rate limits: the most starts (the job's code beginning, as the workers record it) in any window of 1 s less the README's 150 ms jitter; the most fetches (River's attempted_at) in any 1 s beside it",
		Figure: "max-starts-in-window", Comparison: "max-fetches-in-1s", TargetOn: "max-starts-in-window", Cmp: "<=", Target: 200,
	},
	"BenchmarkKeyedFairness": {
		What:   "P10/P11 fairness: tenant A's jobs started between tenant B's insert of 5 jobs and B's last finish (A: 2,000 of 50 ms waiting; per-kind and per-key limits of 4)",
		Figure: "a-starts-during-b", Comparison: "b-ms", TargetOn: "a-starts-during-b", Cmp: "<=", Target: 40,
	},
	"BenchmarkScaleOut": {
		What:   "scale-out: 40,000 no-op jobs through 2 `sluice worker` processes (vs 1, same run, best of 2 rounds each); ratio = 2w/1w; no target",
		Figure: "2w-jobs/s", Comparison: "1w-jobs/s",
	},
	"BenchmarkScaleOut#4w": {
		What:   "scale-out: the same through 4 worker processes, and 4w/1w beside it; no target",
		Figure: "4w-jobs/s", Comparison: "4w/1w",
	},
	"BenchmarkScaleOut#ceiling": {
		What:   "scale-out, best 4-worker round: the machine's CPU busy (%) and Postgres's CPU seconds per 1,000 jobs (workers' in the log); no target",
		Figure: "4w-cpu-busy-%", Comparison: "4w-postgres-cpu-s/1k-jobs",
	},
	"BenchmarkWorkerMemory": {
		What:   "memory: RSS of a stock `sluice worker` idle 10 s after start (peak RSS while it works 50,000 queued no-op jobs beside it)",
		Figure: "idle-rss-MiB", Comparison: "load-rss-MiB", TargetOn: "idle-rss-MiB", Cmp: "<",
	},
	"BenchmarkWorkerMemory#heap": {
		What:   "memory: the worker's Go heap in use, idle (peak under the 50,000-job load beside it); growth under a steady load: `make soak`",
		Figure: "idle-heap-MiB", Comparison: "load-heap-MiB",
	},
	"BenchmarkIdleTick": {
		What:   "scheduler: one dispatcher tick, 100,000 schedules, none due (vs the same check as a table scan)",
		Figure: "ms/tick", Comparison: "seqscan-ms/check", TargetOn: "ms/tick", Cmp: "<",
	},
	"BenchmarkTaskCancellationTriggerOverhead": {
		What:   "cancellation monitoring: River no-op throughput with the river_job triggers (vs without)",
		Figure: "jobs/s", Comparison: "baseline-jobs/s", TargetOn: "ratio", Cmp: ">=",
	},
	"BenchmarkTaskCancellationTriggerUpdateCost": {
		What:   "cancellation monitoring: River's fetch + complete UPDATEs of 5,000 jobs with the triggers (vs without)",
		Figure: "ms/run", Comparison: "baseline-ms/run", TargetOn: "ratio", Cmp: "<=",
	},
	"BenchmarkWorkerFenceOverhead": {
		What:   "worker liveness: River no-op throughput with the fence triggers (vs without), medians",
		Figure: "jobs/s", Comparison: "baseline-jobs/s", TargetOn: "ratio", Cmp: ">=",
	},
	"BenchmarkWorkerFenceUpdateCost": {
		What:   "worker liveness: River's fetch + complete UPDATEs of 5,000 jobs with the fence (vs without)",
		Figure: "ms/run", Comparison: "baseline-ms/run", TargetOn: "ratio", Cmp: "<=",
	},
}

// comparisonPrefixes mark the unit of a comparison by convention.
var comparisonPrefixes = []string{"baseline-", "floor-", "ideal-", "seqscan-", "river-"}

// guessSpec reads a benchmark nobody described: the figure is its first
// metric that is neither ns/op, a comparison, ratio nor target; the
// comparison is its first unit with a comparison prefix; the target applies
// to the ratio, in an unknown direction.
func guessSpec(r *Result) Spec {
	s := Spec{What: "(not described in benchreport)", TargetOn: "ratio"}
	for _, u := range r.Units {
		switch {
		case u == "ns/op" || u == "ratio" || u == "target" || u == "B/op" || u == "allocs/op":
		case hasComparisonPrefix(u):
			if s.Comparison == "" {
				s.Comparison = u
			}
		case s.Figure == "":
			s.Figure = u
		}
	}
	return s
}

func hasComparisonPrefix(unit string) bool {
	for _, p := range comparisonPrefixes {
		if strings.HasPrefix(unit, p) {
			return true
		}
	}
	return false
}

// Row is one line of the table.
type Row struct {
	Benchmark, What, Figure, Comparison, Ratio, Target, Met string
}

// Rows turns results into table rows, in the order the benchmarks ran,
// with the extra rows of specs keyed "Name#…" after their benchmark's row.
func Rows(results []*Result) []Row {
	var rows []Row
	for _, r := range results {
		spec, known := specs[r.Name]
		if !known {
			spec = guessSpec(r)
		}
		rows = append(rows, row(r, r.Name, spec))
		for _, key := range extraKeys(r.Name) {
			rows = append(rows, row(r, key, specs[key]))
		}
	}
	return rows
}

// extraKeys are the spec keys "name#…", sorted.
func extraKeys(name string) []string {
	var keys []string
	for k := range specs {
		if strings.HasPrefix(k, name+"#") {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

func row(r *Result, label string, s Spec) Row {
	out := Row{Benchmark: label, What: s.What}
	switch {
	case r.Skipped:
		out.Figure = "skipped: " + orDefault(r.Note, "no reason given")
		return out
	case r.Failed:
		out.Figure = "FAILED: " + orDefault(r.Note, "see the output above")
		return out
	}
	out.Figure = metric(r, s.Figure)
	out.Comparison = metric(r, s.Comparison)
	target := s.Target
	if target == 0 {
		target = r.Metrics["target"]
	}
	fv, hasFigure := r.Metrics[s.Figure]
	cv, hasComparison := r.Metrics[s.Comparison]
	rv, hasRatio := r.Metrics["ratio"]
	out.Ratio = "—"
	switch {
	case strings.Contains(label, "#"):
		// An extra row: its figure against its own target, if it has one.
		if hasFigure && target != 0 && s.TargetOn != "" {
			out.Ratio = formatPrecise(fv / target)
		}
	case hasRatio:
		out.Ratio = formatPrecise(rv)
	case hasFigure && hasComparison && cv != 0:
		out.Ratio = formatPrecise(fv / cv)
	}
	out.Target, out.Met = "—", "—"
	if target == 0 || s.TargetOn == "" {
		return out
	}
	cmp := s.Cmp
	if cmp == "" {
		cmp = "?"
	}
	out.Target = fmt.Sprintf("%s %s %s", s.TargetOn, displayCmp(cmp), formatPrecise(target))
	v, ok := r.Metrics[s.TargetOn]
	if !ok || cmp == "?" {
		out.Met = "?"
		return out
	}
	if meets(v, cmp, target) {
		out.Met = "yes"
	} else {
		out.Met = "no"
	}
	return out
}

func metric(r *Result, unit string) string {
	if unit == "" {
		return "—"
	}
	v, ok := r.Metrics[unit]
	if !ok {
		return "—"
	}
	return formatNumber(v) + " " + unit
}

func meets(v float64, cmp string, target float64) bool {
	switch cmp {
	case "<":
		return v < target
	case "<=":
		return v <= target
	case ">":
		return v > target
	case ">=":
		return v >= target
	}
	return false
}

func displayCmp(cmp string) string {
	switch cmp {
	case "<=":
		return "≤"
	case ">=":
		return "≥"
	}
	return cmp
}

// formatNumber prints about three significant digits, without exponents.
func formatNumber(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	case a == 0:
		return "0"
	case a >= 0.01:
		return fmt.Sprintf("%.3f", v)
	default:
		return fmt.Sprintf("%.2g", v)
	}
}

// formatPrecise prints four significant digits, so that a ratio just
// short of its target does not print as the target itself.
func formatPrecise(v float64) string {
	s := fmt.Sprintf("%.4g", v)
	if strings.ContainsAny(s, "e") {
		return formatNumber(v)
	}
	return s
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// WriteTable writes rows as a Markdown table.
func WriteTable(w io.Writer, rows []Row) {
	fmt.Fprintln(w, "| benchmark | what it measures | figure | comparison (same run) | ratio | target | met |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n",
			cell(r.Benchmark), cell(r.What), cell(r.Figure), cell(r.Comparison), cell(r.Ratio), cell(r.Target), cell(r.Met))
	}
}

func cell(s string) string {
	if s == "" {
		return ""
	}
	return strings.ReplaceAll(s, "|", `\|`)
}
