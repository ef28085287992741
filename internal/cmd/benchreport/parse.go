package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
)

// Result is one benchmark of a `go test -bench` run.
type Result struct {
	// Package is the Go package the benchmark belongs to.
	Package string
	// Name is the benchmark's name without the GOMAXPROCS suffix, e.g.
	// BenchmarkIdleTick or BenchmarkX/case=1.
	Name string
	// Metrics are the reported values by unit ("ms/run", "ratio", …).
	Metrics map[string]float64
	// Units lists the metric units in the order they were reported.
	Units []string
	// Skipped and Failed say how the benchmark ended without figures;
	// Note is its last log line (the reason for a skip).
	Skipped bool
	Failed  bool
	Note    string
}

// Run is what a `go test -bench` run produced.
type Run struct {
	Results []*Result
	// CPU is the "cpu:" header line go test prints.
	CPU string
	// FailedPackages lists the packages whose tests or benchmarks failed.
	FailedPackages []string
}

// event is one line of `go test -json` (test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// resultLine matches a benchmark result: name, iterations, then value/unit
// pairs.
var resultLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+(\d+)\s+(\d.*)$`)

// logLine matches a test log line "    file_test.go:12: message".
var logLine = regexp.MustCompile(`^\s+\S+\.go:\d+: (.*)$`)

// Parse reads the output of `go test -bench` — as JSON (`-json`, which also
// tells skipped benchmarks and their reasons) or as plain text, where each
// result line follows the "pkg:" header of its package — and passes every
// line of plain output on to echo as it goes.
func Parse(r io.Reader, echo io.Writer) (*Run, error) {
	p := &parser{run: &Run{}, byKey: map[string]*Result{}, pending: map[string]string{}, logs: map[string]string{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1024*1024), 64*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		var ev event
		if strings.HasPrefix(line, "{") && json.Unmarshal([]byte(line), &ev) == nil && ev.Action != "" {
			p.event(ev, echo)
			continue
		}
		fmt.Fprintln(echo, line)
		p.plain(line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read go test output: %w", err)
	}
	return p.run, nil
}

type parser struct {
	run   *Run
	byKey map[string]*Result
	// pkg is the package of plain output (its last "pkg:" line).
	pkg string
	// pending holds each JSON stream's output not yet ended by a newline
	// (a result line can arrive in two events).
	pending map[string]string
	// logs holds each benchmark's last log line.
	logs map[string]string
}

func (p *parser) event(ev event, echo io.Writer) {
	switch ev.Action {
	case "output":
		key := ev.Package + "\x00" + ev.Test
		text := p.pending[key] + ev.Output
		lines := strings.Split(text, "\n")
		p.pending[key] = lines[len(lines)-1]
		for _, line := range lines[:len(lines)-1] {
			if !strings.HasPrefix(line, "=== RUN") && !(ev.Test != "" && line == ev.Test) {
				fmt.Fprintln(echo, line)
			}
			p.line(ev.Package, ev.Test, line)
		}
	case "skip", "fail":
		if ev.Test == "" {
			if ev.Action == "fail" {
				p.run.FailedPackages = append(p.run.FailedPackages, ev.Package)
			}
			return
		}
		if !strings.HasPrefix(baseName(ev.Test), "Benchmark") {
			return
		}
		res := p.result(ev.Package, baseName(ev.Test))
		if len(res.Metrics) > 0 {
			return // a failure after the figures were reported keeps them
		}
		res.Skipped = ev.Action == "skip"
		res.Failed = ev.Action == "fail"
		res.Note = p.logs[ev.Package+"\x00"+ev.Test]
	}
}

func (p *parser) plain(line string) {
	if pkg, ok := strings.CutPrefix(line, "pkg: "); ok {
		p.pkg = strings.TrimSpace(pkg)
		return
	}
	if strings.HasPrefix(line, "FAIL\t") || strings.HasPrefix(line, "FAIL ") {
		if f := strings.Fields(line); len(f) >= 2 {
			p.run.FailedPackages = append(p.run.FailedPackages, f[1])
		}
		return
	}
	p.line(p.pkg, "", line)
}

// line handles one line of output of package pkg, test (benchmark) test.
func (p *parser) line(pkg, test, line string) {
	if cpu, ok := strings.CutPrefix(line, "cpu: "); ok {
		p.run.CPU = strings.TrimSpace(cpu)
		return
	}
	if m := logLine.FindStringSubmatch(line); m != nil && test != "" {
		p.logs[pkg+"\x00"+test] = m[1]
		return
	}
	m := resultLine.FindStringSubmatch(line)
	if m == nil {
		return
	}
	fields := strings.Fields(m[3])
	if len(fields)%2 != 0 {
		return
	}
	res := p.result(pkg, m[1])
	for i := 0; i < len(fields); i += 2 {
		v, err := strconv.ParseFloat(fields[i], 64)
		if err != nil {
			return
		}
		unit := fields[i+1]
		if _, seen := res.Metrics[unit]; !seen {
			res.Units = append(res.Units, unit)
		}
		res.Metrics[unit] = v
	}
}

// result returns the result of benchmark name in pkg, creating it.
func (p *parser) result(pkg, name string) *Result {
	key := pkg + "\x00" + name
	if r, ok := p.byKey[key]; ok {
		return r
	}
	r := &Result{Package: pkg, Name: name, Metrics: map[string]float64{}}
	p.byKey[key] = r
	p.run.Results = append(p.run.Results, r)
	return r
}

// baseName strips the GOMAXPROCS suffix go test adds to benchmark names.
func baseName(name string) string {
	if i := strings.LastIndex(name, "-"); i > 0 {
		if _, err := strconv.Atoi(name[i+1:]); err == nil {
			return name[:i]
		}
	}
	return name
}
