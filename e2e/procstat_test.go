package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// clockTicks is the kernel's USER_HZ, the unit of /proc/<pid>/stat's CPU
// times (100 on every Linux this runs on).
const clockTicks = 100

// cpuSeconds is the CPU time (user + system) process pid has used, from
// /proc/<pid>/stat; false when the process is gone.
func cpuSeconds(pid int) (float64, bool) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// The command name, in parentheses, may hold spaces: split after it.
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return 0, false
	}
	fields := strings.Fields(string(raw[i+1:]))
	// fields[0] is the state (field 3): utime and stime are fields 14 and 15.
	if len(fields) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseFloat(fields[11], 64)
	stime, err2 := strconv.ParseFloat(fields[12], 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return (utime + stime) / clockTicks, true
}

// rssMiB is the resident set size of process pid in MiB (VmRSS).
func rssMiB(pid int) (float64, bool) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err != nil {
				return 0, false
			}
			return kb / 1024, true
		}
	}
	return 0, false
}

// postgresCPU is the CPU time of every process named postgres (the server
// and its backends), by pid.
func postgresCPU() map[int]float64 {
	out := map[int]float64{}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, dir := range dirs {
		comm, err := os.ReadFile(dir + "/comm")
		if err != nil || strings.TrimSpace(string(comm)) != "postgres" {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(dir))
		if err != nil {
			continue
		}
		if s, ok := cpuSeconds(pid); ok {
			out[pid] = s
		}
	}
	return out
}

// machineCPU is the machine's busy and total CPU time so far (all CPUs,
// in ticks), from /proc/stat.
func machineCPU() (busy, total float64) {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	fields := strings.Fields(line)[1:]
	for i, f := range fields {
		v, _ := strconv.ParseFloat(f, 64)
		total += v
		if i != 3 && i != 4 { // idle and iowait
			busy += v
		}
	}
	return busy, total
}

// loadSample is what a run cost the machine, measured from /proc and
// Postgres's statistics between start and stop.
type loadSample struct {
	// MachineBusy is the share of all CPUs busy (0 to 1).
	MachineBusy float64
	// WorkerCPU and PostgresCPU are the CPU seconds of the worker
	// processes and of Postgres's processes.
	WorkerCPU, PostgresCPU float64
	// Waits counts the active backends of the database by wait event
	// (sampled every 20ms; "CPU" for none).
	Waits map[string]int
	// Samples is how many times pg_stat_activity was sampled.
	Samples int
}

// loadMeter measures a run: start it once the workers are up, before the
// jobs are inserted, and stop it once they are done.
type loadMeter struct {
	pool          *pgxpool.Pool
	busy0, total0 float64
	pg0           map[int]float64
	workers0      float64
	commits0      float64
	stopSampling  context.CancelFunc
	sampled       sync.WaitGroup
	waits         map[string]int
	samples       int
}

func startLoadMeter(tb testing.TB, pool *pgxpool.Pool, workers []int) *loadMeter {
	tb.Helper()
	m := &loadMeter{pool: pool, pg0: postgresCPU(), waits: map[string]int{}}
	for _, pid := range workers {
		if c, ok := cpuSeconds(pid); ok {
			m.workers0 += c
		}
	}
	m.busy0, m.total0 = machineCPU()
	m.commits0 = commits(tb, pool)
	ctx, cancel := context.WithCancel(context.Background())
	m.stopSampling = cancel
	m.sampled.Add(1)
	go func() {
		defer m.sampled.Done()
		for ctx.Err() == nil {
			rows, err := pool.Query(ctx, `
				SELECT COALESCE(wait_event_type || ':' || wait_event, 'CPU')
				FROM pg_stat_activity
				WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid()`)
			if err == nil {
				for rows.Next() {
					var w string
					if rows.Scan(&w) == nil {
						m.waits[w]++
					}
				}
				rows.Close()
				m.samples++
			}
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return m
}

// stop ends the measurement; workers are the worker processes' pids (still
// running), as given to startLoadMeter.
func (m *loadMeter) stop(tb testing.TB, workers []int) loadSample {
	tb.Helper()
	m.stopSampling()
	m.sampled.Wait()
	var s loadSample
	busy, total := machineCPU()
	if total > m.total0 {
		s.MachineBusy = (busy - m.busy0) / (total - m.total0)
	}
	for _, pid := range workers {
		if c, ok := cpuSeconds(pid); ok {
			s.WorkerCPU += c
		}
	}
	s.WorkerCPU -= m.workers0
	// Backends born during the run count whole; those of before, the
	// difference.
	for pid, c := range postgresCPU() {
		s.PostgresCPU += c - m.pg0[pid]
	}
	s.Waits, s.Samples = m.waits, m.samples
	return s
}

// commitsSince is the number of transactions committed in the database
// since the meter started. Call it once the workers have exited: a backend
// reports its counts to pg_stat_database up to a second late, and at its
// exit.
func (m *loadMeter) commitsSince(tb testing.TB) float64 {
	tb.Helper()
	return commits(tb, m.pool) - m.commits0
}

// topWaits formats the most frequent wait events, as shares of the samples
// (average active backends in each).
func (s loadSample) topWaits(n int) string {
	type kv struct {
		k string
		v int
	}
	var all []kv
	for k, v := range s.Waits {
		all = append(all, kv{k, v})
	}
	slices.SortFunc(all, func(a, b kv) int { return b.v - a.v })
	var parts []string
	for i, e := range all {
		if i == n {
			break
		}
		parts = append(parts, fmt.Sprintf("%s %.1f", e.k, float64(e.v)/float64(max(s.Samples, 1))))
	}
	return strings.Join(parts, ", ")
}

// commits is the database's xact_commit so far (pg_stat_database; the
// statistics are flushed by backends at least every second).
func commits(tb testing.TB, pool *pgxpool.Pool) float64 {
	tb.Helper()
	var n float64
	if err := pool.QueryRow(context.Background(),
		`SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&n); err != nil {
		tb.Fatal(err)
	}
	return n
}
