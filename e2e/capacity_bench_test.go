package e2e_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/proc"
	"github.com/sluice-dev/sluice/internal/testdb"
)

// Capacity: how no-op throughput scales with worker processes on one
// Postgres, and what a worker's memory is idle and under load.
const (
	// scaleJobs is the no-op jobs of one scale-out round.
	scaleJobs = 40_000
	// memoryJobs is the backlog of the memory benchmark's load phase.
	memoryJobs = 50_000
	// idleRSSTarget is the bound on an idle worker's RSS, in MiB.
	idleRSSTarget = 40
)

// BenchmarkScaleOut works scaleJobs no-op jobs (demo.sleep of 0 ms) with 1,
// 2 and 4 `sluice worker` processes (200 jobs at once each) against one
// Postgres, the jobs inserted at once once the workers are up; each count
// runs two rounds, in the order 1 2 4 4 2 1, and its best round counts. Figures: jobs/s with 1, 2 and 4 workers, the ratios 2w/1w and
// 4w/1w (ratio: 2w/1w), and, for the best 4-worker round, where the time
// went: the machine's CPU busy share, the CPU seconds per 1,000 jobs of
// the workers and of Postgres, commits per second, and the wait events of
// the database's active backends (printed). No target: the issue asks for
// the curve and its ceiling.
func BenchmarkScaleOut(b *testing.B) {
	url := testdb.New(b)
	pool := openBenchPool(b, url)
	for range b.N {
		best := map[int]scaleRun{}
		for _, k := range []int{1, 2, 4, 4, 2, 1} {
			run := scaleOutRound(b, pool, url, k)
			fmt.Printf("BenchmarkScaleOut: %d worker(s): %.0f jobs/s; CPU busy %.0f%%, workers %.2f s and Postgres %.2f s of CPU per 1,000 jobs, %.0f commits/s; active backends by wait: %s\n",
				k, run.rate, 100*run.load.MachineBusy, 1000*run.load.WorkerCPU/scaleJobs, 1000*run.load.PostgresCPU/scaleJobs,
				run.commitsPerSecond, run.load.topWaits(6))
			if run.rate > best[k].rate {
				best[k] = run
			}
		}
		one, two, four := best[1].rate, best[2].rate, best[4].rate
		b.ReportMetric(one, "1w-jobs/s")
		b.ReportMetric(two, "2w-jobs/s")
		b.ReportMetric(four, "4w-jobs/s")
		b.ReportMetric(two/one, "ratio")
		b.ReportMetric(four/one, "4w/1w")
		b.ReportMetric(100*best[4].load.MachineBusy, "4w-cpu-busy-%")
		b.ReportMetric(best[4].commitsPerSecond, "4w-commits/s")
		b.ReportMetric(1000*best[4].load.WorkerCPU/scaleJobs, "4w-worker-cpu-s/1k-jobs")
		b.ReportMetric(1000*best[4].load.PostgresCPU/scaleJobs, "4w-postgres-cpu-s/1k-jobs")
	}
}

// scaleRun is one round of BenchmarkScaleOut.
type scaleRun struct {
	rate             float64
	commitsPerSecond float64
	load             loadSample
}

// scaleOutRound starts k workers, inserts scaleJobs no-op jobs, waits until
// they are done and stops the workers.
func scaleOutRound(b *testing.B, pool *pgxpool.Pool, url string, k int) scaleRun {
	b.Helper()
	resetRiverJobs(b, pool)
	workers := make([]*proc.Worker, k)
	pids := make([]int, k)
	for i := range workers {
		workers[i] = proc.StartWorker(b, url, fmt.Sprintf("scale-%d-%d", k, i), "--default-workers", fmt.Sprint(noopConcurrency), "--log-level", "warn")
		pids[i] = workers[i].PID()
	}
	meter := startLoadMeter(b, pool, pids)
	start := time.Now()
	insertNoops(b, pool, scaleJobs)
	waitCompleted(b, pool)
	elapsed := time.Since(start)
	load := meter.stop(b, pids)
	for _, w := range workers {
		w.Signal(b, syscall.SIGTERM)
	}
	for _, w := range workers {
		if code := w.Wait(b, time.Minute); code != 0 {
			b.Fatalf("worker exited %d:\n%s", code, w.Log())
		}
	}
	return scaleRun{rate: dbRate(b, pool), commitsPerSecond: meter.commitsSince(b) / elapsed.Seconds(), load: load}
}

// BenchmarkWorkerMemory measures a stock `sluice worker` process (its
// default settings, --pprof on): its RSS idle (10 s after start), then its
// peak RSS and Go heap while it works memoryJobs queued no-op jobs, and
// prints the top entries of its Go heap profile at the middle of the load.
// Target: idle RSS under 40 MiB (ratio = idle RSS / 40). Whether memory
// grows under a long load is `make soak`'s question (TestSoak).
func BenchmarkWorkerMemory(b *testing.B) {
	ctx := context.Background()
	for range b.N {
		// A fresh database, not emptied and analysed: a worker idle on a
		// river_job analysed empty worked the 50,000 jobs at about 500 a
		// second for 95 s (6 s here): River's statements planned while the
		// statistics said the table was empty scanned it.
		url := testdb.New(b)
		pool := openBenchPool(b, url)
		w := proc.StartWorker(b, url, "memory", "--pprof", "--log-level", "warn")
		time.Sleep(10 * time.Second) // idle: startup garbage collected, every service ticking
		idle, ok := rssMiB(w.PID())
		if !ok {
			b.Fatal("worker gone")
		}
		idleHeap := heapInuseMiB(b, w)

		insertNoops(b, pool, memoryJobs)
		var peak, peakHeap float64
		profiled := false
		for {
			rss, _ := rssMiB(w.PID())
			peak = max(peak, rss)
			peakHeap = max(peakHeap, heapInuseMiB(b, w))
			var left int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM river_job WHERE kind = 'demo.sleep' AND state <> 'completed'").Scan(&left); err != nil {
				b.Fatal(err)
			}
			if !profiled && left <= memoryJobs/2 {
				profiled = true
				fmt.Printf("BenchmarkWorkerMemory: the worker's Go heap (inuse_space) with %d of %d jobs left:\n%s\n", left, memoryJobs, heapTop(b, w))
			}
			if left == 0 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		w.Signal(b, syscall.SIGTERM)
		if code := w.Wait(b, time.Minute); code != 0 {
			b.Fatalf("worker exited %d:\n%s", code, w.Log())
		}
		b.ReportMetric(idle, "idle-rss-MiB")
		b.ReportMetric(peak, "load-rss-MiB")
		b.ReportMetric(idleHeap, "idle-heap-MiB")
		b.ReportMetric(peakHeap, "load-heap-MiB")
		b.ReportMetric(idle/idleRSSTarget, "ratio")
		b.ReportMetric(idleRSSTarget, "target")
	}
}

// heapInuseMiB is the worker's go_memstats_heap_inuse_bytes (its /metrics)
// in MiB.
func heapInuseMiB(tb testing.TB, w *proc.Worker) float64 {
	tb.Helper()
	return workerMetric(tb, w, "go_memstats_heap_inuse_bytes") / (1 << 20)
}

// workerMetric is the unlabelled gauge name on the worker's /metrics.
func workerMetric(tb testing.TB, w *proc.Worker, name string) float64 {
	tb.Helper()
	return jobtest.MetricValue(tb, jobtest.Scraper{URL: "http://" + w.Addr + "/metrics"}, name, nil)
}

// heapTop is the top of the worker's heap profile (inuse_space), from `go
// tool pprof -top`.
func heapTop(tb testing.TB, w *proc.Worker) string {
	tb.Helper()
	resp, err := http.Get("http://" + w.Addr + "/debug/pprof/heap")
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	file := filepath.Join(tb.TempDir(), "heap.pb.gz")
	f, err := os.Create(file)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		tb.Fatal(err)
	}
	f.Close()
	out, err := exec.Command("go", "tool", "pprof", "-top", "-sample_index=inuse_space", "-nodecount=12", proc.Binary(tb), file).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("(go tool pprof failed: %v)\n%s", err, out)
	}
	return string(out)
}
