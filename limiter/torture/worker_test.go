package torture

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/riverqueue/river"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/limiter"
)

// Environment of a worker process: the test binary runs itself as one when
// workerEnv is set (TestMain).
const (
	workerEnv        = "SLUICE_TORTURE_WORKER" // the worker's id
	workerParkEnv    = "SLUICE_TORTURE_PARK_AFTER"
	workerSlotsEnv   = "SLUICE_TORTURE_MAX_WORKERS"
	workerRunsEnv    = "SLUICE_TORTURE_RUN_LOG" // the worker's run log (runLog)
	workerStartedMsg = "torture worker started"
)

// Liveness settings of the worker processes: a killed worker is found dead
// and its jobs and slots rescued within about deadAfter.
const (
	heartbeat = 100 * time.Millisecond
	deadAfter = 600 * time.Millisecond
)

// retryDelay is how soon a failed torture job is retried.
const retryDelay = 50 * time.Millisecond

// snoozeFor is how long a snoozing torture job snoozes.
const snoozeFor = 100 * time.Millisecond

// jobArgs are the args of both torture kinds (torture.a, torture.b).
type jobArgs struct {
	// K names the kind: torture.K.
	K string `json:"k"`
	// Key is the partition field: per-key limits and rates use it.
	Key string `json:"key"`
	// MS is how long an execution works.
	MS int `json:"ms"`
	// Fail makes the first Fail executions (after a snooze) fail.
	Fail int `json:"fail,omitempty"`
	// Snooze makes the first execution snooze for snoozeFor.
	Snooze bool `json:"snooze,omitempty"`
}

// Kind is torture.K.
func (a jobArgs) Kind() string { return "torture." + a.K }

// recorder works the torture kinds and records each execution in its
// worker's run log (runLog): when it started and ended (the process's
// clock, read when it happens: the database and the test run on one
// machine, one clock), on which worker, for which attempt, and how it
// ended. Each line goes to the kernel with one write as it happens, so a
// worker killed with SIGKILL loses nothing it ran, and the record neither
// waits for nor takes a connection.
type recorder struct {
	river.WorkerDefaults[jobArgs]
	log    *runLog
	worker string
}

// NextRetry retries a failed execution soon.
func (*recorder) NextRetry(*river.Job[jobArgs]) time.Time { return time.Now().Add(retryDelay) }

// failMsg is the error of a torture execution that fails.
const failMsg = "torture: this execution fails"

// Work records the execution's start, works MS milliseconds (or until the
// job's context ends), and records how it ended. Whether it snoozes or
// fails is decided from the job's River row: a job snoozes once (River
// counts snoozes in its metadata), then fails until Fail of its attempts
// have failed (River keeps each failure's error).
func (w *recorder) Work(ctx context.Context, job *river.Job[jobArgs]) error {
	slot := ""
	if a, ok := limiter.AdmissionFrom(ctx); ok {
		slot = cmp.Or(a.Slot, "none")
	}
	n, err := w.log.start(job.ID, job.Kind, job.Args.Key, job.Attempt, slot)
	if err != nil {
		return fmt.Errorf("record the start: %w", err)
	}
	outcome := "ok"
	var result error
	select {
	case <-time.After(time.Duration(job.Args.MS) * time.Millisecond):
	case <-ctx.Done():
		outcome, result = "cancelled", context.Cause(ctx)
	}
	if result == nil {
		failed := 0
		for _, e := range job.Errors {
			if e.Error == failMsg {
				failed++
			}
		}
		var md struct {
			Snoozes int `json:"snoozes"`
		}
		_ = json.Unmarshal(job.Metadata, &md)
		switch {
		case job.Args.Snooze && md.Snoozes == 0:
			outcome, result = "snooze", river.JobSnooze(snoozeFor)
		case failed < job.Args.Fail:
			outcome, result = "fail", errors.New(failMsg)
		}
	}
	if err := w.log.end(n, outcome); err != nil {
		return fmt.Errorf("record the end: %w", err)
	}
	return result
}

// runLog is a worker's log of executions: a file of JSON lines, one when an
// execution starts and one when it ends, each written with one write(2).
type runLog struct {
	mu   sync.Mutex
	f    *os.File
	next int64
}

// runLine is a line of a run log.
type runLine struct {
	Run     int64  `json:"run"`
	Job     int64  `json:"job,omitempty"`
	Kind    string `json:"kind,omitempty"`
	Key     string `json:"key,omitempty"`
	Attempt int    `json:"attempt,omitempty"`
	// Slot is the concurrency slot its worker's limiter let it start on
	// (limiter.AdmissionFrom: leased, line, none); "" when the limiter did
	// not decide it (its kind had no limit as the worker saw it).
	Slot    string `json:"slot,omitempty"`
	Outcome string `json:"outcome,omitempty"` // "" on a start line
	At      int64  `json:"at"`                // Unix nanoseconds
}

func (l *runLog) write(line runLine) error {
	b, err := json.Marshal(line)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, err = l.f.Write(append(b, '\n'))
	return err
}

// start records the start of an execution (slot: as runLine.Slot) and
// returns its number.
func (l *runLog) start(job int64, kind, key string, attempt int, slot string) (int64, error) {
	at := time.Now().UnixNano()
	l.mu.Lock()
	l.next++
	n := l.next
	l.mu.Unlock()
	return n, l.write(runLine{Run: n, Job: job, Kind: kind, Key: key, Attempt: attempt, Slot: slot, At: at})
}

// end records how execution n ended.
func (l *runLog) end(n int64, outcome string) error {
	return l.write(runLine{Run: n, Outcome: outcome, At: time.Now().UnixNano()})
}

// workerMain runs a worker process of the torture test: a sluice worker
// (heartbeat, reaper, dispatcher and all) working both torture kinds until
// SIGTERM (a graceful stop) or SIGKILL.
func workerMain(id string) int {
	level := slog.LevelWarn
	if os.Getenv("TORTURE_DEBUG") != "" || os.Getenv(failedLogsEnv) != "" {
		level = slog.LevelDebug // the limiter's trace of each job, for diagnosis
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	parkAfter, err := time.ParseDuration(os.Getenv(workerParkEnv))
	if err != nil {
		logger.Error("torture worker: bad park-after", "error", err)
		return 2
	}
	slots, err := strconv.Atoi(os.Getenv(workerSlotsEnv))
	if err != nil {
		logger.Error("torture worker: bad max workers", "error", err)
		return 2
	}
	f, err := os.OpenFile(os.Getenv(workerRunsEnv), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		logger.Error("torture worker: run log", "error", err)
		return 1
	}
	defer f.Close()
	rec := &recorder{worker: id, log: &runLog{f: f}}
	workers := river.NewWorkers()
	river.AddWorkerArgs(workers, jobArgs{K: "a"}, rec)
	river.AddWorkerArgs(workers, jobArgs{K: "b"}, rec)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	w, err := app.NewWorker(ctx, app.Config{
		Workers:           workers,
		DatabaseURL:       os.Getenv("DATABASE_URL"),
		ID:                id,
		Queues:            map[string]int{river.QueueDefault: slots},
		ParkAfter:         parkAfter,
		HeartbeatInterval: heartbeat,
		DeadAfter:         deadAfter,
		FetchPollInterval: 100 * time.Millisecond,
		ShutdownTimeout:   5 * time.Second,
		Logger:            logger,
	})
	if err != nil {
		logger.Error("torture worker: new", "error", err)
		return 1
	}
	if err := w.RunNotify(ctx, func() { fmt.Println(workerStartedMsg) }); err != nil {
		logger.Error("torture worker: run", "error", err)
		return 1
	}
	return 0
}
