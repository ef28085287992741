package e2e_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/riverqueue/river"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/proc"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/modules/demo"
)

// The soak (`make soak`): a stock worker kept busy for SOAK_DURATION
// (default 5m) must not grow. Not part of `make test`.
const (
	// soakRate is the no-op jobs inserted per second, in batches every
	// soakTick: steady work well within a stock worker's reach.
	soakRate = 5000
	soakTick = 100 * time.Millisecond
	// soakSample is how often memory is sampled.
	soakSample = 5 * time.Second
	// soakVacuum is how often river_job is vacuumed when the server's
	// autovacuum is off.
	soakVacuum = 30 * time.Second
	// soakRSSGrowth and soakHeapGrowth bound the growth of the last fifth
	// of the soak over the second fifth (the first is warm-up), as a share
	// of the second. The Go heap between two collections swings by GOGC
	// (100%: up to twice the live heap), so means over a window of 12
	// samples move by a few percent without any leak; a leak of even
	// 1 KiB per job is 5 MiB a second here and shows at once.
	soakRSSGrowth  = 0.10
	soakHeapGrowth = 0.25
)

// soakPoint is one sample of the soak.
type soakPoint struct {
	at         time.Duration
	rss, heap  float64 // MiB
	goroutines float64
	backlog    int64
}

// TestSoak keeps a stock `sluice worker` (default settings) busy
// with soakRate no-op jobs a second for SOAK_DURATION, samples its RSS,
// Go heap in use and goroutines every soakSample, prints them, and fails
// if the mean RSS or heap of the last fifth grew beyond soakRSSGrowth or
// soakHeapGrowth over the second fifth, or if goroutines kept growing.
// Skipped unless SLUICE_SOAK=1 (`make soak` sets it).
func TestSoak(t *testing.T) {
	if os.Getenv("SLUICE_SOAK") != "1" {
		t.Skip("the soak runs with `make soak` (SLUICE_SOAK=1; SOAK_DURATION, default 5m)")
	}
	duration := 5 * time.Minute
	if v := os.Getenv("SOAK_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Minute {
			t.Fatalf("SOAK_DURATION: want a Go duration of at least 1m, got %q", v)
		}
		duration = d
	}
	ctx := context.Background()
	url := testdb.New(t)
	pool := openBenchPool(t, url)
	w := proc.StartWorker(t, url, "soak", "--log-level", "warn")
	inserter, err := app.NewInsertClient(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	batch := make([]river.InsertManyParams, soakRate*int(soakTick)/int(time.Second))
	for i := range batch {
		batch[i] = river.InsertManyParams{Args: demo.SleepArgs{}}
	}

	// A server with autovacuum off (as CI's here is) lets river_job's dead
	// rows pile up (2 million in 3 minutes at this rate) and River's fetch
	// slow down with them: vacuum it every soakVacuum, as autovacuum would.
	var autovacuum string
	if err := pool.QueryRow(ctx, "SHOW autovacuum").Scan(&autovacuum); err != nil {
		t.Fatal(err)
	}
	vacuumEvery := time.Duration(0)
	if autovacuum != "on" {
		vacuumEvery = soakVacuum
		fmt.Printf("TestSoak: the server runs with autovacuum off: river_job is vacuumed every %s\n", soakVacuum)
	}

	feedCtx, stopFeed := context.WithCancel(ctx)
	fed := make(chan error, 1)
	go func() {
		tick := time.NewTicker(soakTick)
		defer tick.Stop()
		lastVacuum := time.Now()
		for {
			if vacuumEvery > 0 && time.Since(lastVacuum) >= vacuumEvery {
				lastVacuum = time.Now()
				if _, err := pool.Exec(feedCtx, "VACUUM river_job"); err != nil && feedCtx.Err() == nil {
					fed <- fmt.Errorf("vacuum: %w", err)
					return
				}
			}
			select {
			case <-feedCtx.Done():
				fed <- nil
				return
			case <-tick.C:
				if _, err := inserter.InsertManyFast(feedCtx, batch); err != nil && feedCtx.Err() == nil {
					fed <- err
					return
				}
			}
		}
	}()

	start := time.Now()
	var points []soakPoint
	fmt.Printf("TestSoak: %s, %d no-op jobs/s\n%8s %9s %9s %11s %8s\n", duration, soakRate, "at", "RSS MiB", "heap MiB", "goroutines", "backlog")
	for time.Since(start) < duration {
		time.Sleep(soakSample)
		select {
		case err := <-fed:
			t.Fatalf("feeder: %v", err)
		default:
		}
		p := soakPoint{at: time.Since(start).Round(time.Second)}
		var ok bool
		if p.rss, ok = rssMiB(w.PID()); !ok {
			t.Fatalf("worker gone:\n%s", w.Log())
		}
		p.heap = heapInuseMiB(t, w)
		p.goroutines = workerMetric(t, w, "go_goroutines")
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM river_job WHERE state = 'available'").Scan(&p.backlog); err != nil {
			t.Fatal(err)
		}
		points = append(points, p)
		fmt.Printf("%8s %9.1f %9.1f %11.0f %8d\n", p.at, p.rss, p.heap, p.goroutines, p.backlog)
	}
	stopFeed()
	<-fed
	w.Signal(t, syscall.SIGTERM)
	if code := w.Wait(t, time.Minute); code != 0 {
		t.Fatalf("worker exited %d:\n%s", code, w.Log())
	}

	fifth := len(points) / 5
	if fifth < 2 {
		t.Fatalf("only %d samples: the soak is too short", len(points))
	}
	second, last := points[fifth:2*fifth], points[len(points)-fifth:]
	mean := func(ps []soakPoint, f func(soakPoint) float64) float64 {
		var sum float64
		for _, p := range ps {
			sum += f(p)
		}
		return sum / float64(len(ps))
	}
	var problems []string
	check := func(name string, f func(soakPoint) float64, bound float64) {
		before, after := mean(second, f), mean(last, f)
		growth := after/before - 1
		fmt.Printf("TestSoak: %s: mean %.1f in the second fifth, %.1f in the last (%+.1f%%, bound %+.0f%%)\n", name, before, after, 100*growth, 100*bound)
		if growth > bound {
			problems = append(problems, fmt.Sprintf("%s grew %.1f%% (%.1f → %.1f), more than %.0f%%", name, 100*growth, before, after, 100*bound))
		}
	}
	check("RSS MiB", func(p soakPoint) float64 { return p.rss }, soakRSSGrowth)
	check("heap MiB", func(p soakPoint) float64 { return p.heap }, soakHeapGrowth)
	// Goroutines follow the jobs running at a sample; a leak grows them
	// with every job (5,000 a second), far past the 50 of a queue.
	check("goroutines", func(p soakPoint) float64 { return p.goroutines }, 0.5)
	if len(problems) > 0 {
		t.Fatalf("the worker grew under a steady load:\n%s", strings.Join(problems, "\n"))
	}
}
