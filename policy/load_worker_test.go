package policy_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/sluice-dev/sluice/app"
)

// Environment of a load worker process.
const (
	loadWorkerEnv    = "SLUICE_POLICY_LOAD_WORKER" // the worker's id
	loadRunLogEnv    = "SLUICE_POLICY_LOAD_RUNS"   // its run log
	loadStartedMsg   = "policy load worker started"
	loadJobMS        = 2
	loadPollInterval = 100 * time.Millisecond
	loadHeartbeat    = 100 * time.Millisecond
	loadDeadAfter    = 600 * time.Millisecond
	loadSlots        = 6
)

// loadArgs are the args of the load kinds: the key and the enqueue's
// sequence number.
type loadArgs struct {
	K   string `json:"k"` // the kind: policy.load.K
	Key string `json:"key"`
	Seq int64  `json:"seq"`
}

func (a loadArgs) Kind() string { return "policy.load." + a.K }

// loadLine is a line of a run log: an execution's start (Hash of the args
// it got) or end (Hash of its row's args in the database then).
type loadLine struct {
	Worker string `json:"worker"`
	Run    int64  `json:"run"`
	Job    int64  `json:"job,omitempty"`
	Kind   string `json:"kind,omitempty"`
	Key    string `json:"key,omitempty"`
	Seq    int64  `json:"seq,omitempty"`
	Hash   string `json:"hash"`
	End    bool   `json:"end,omitempty"`
	At     int64  `json:"at"` // Unix nanoseconds
}

// loadRecorder works the load kinds for loadJobMS and logs each execution,
// one write(2) per line, so that a worker killed with SIGKILL loses
// nothing it ran.
type loadRecorder struct {
	river.WorkerDefaults[loadArgs]
	id   string
	pool *pgxpool.Pool
	mu   sync.Mutex
	f    *os.File
	next int64
}

func hashOf(b []byte) string {
	var v any
	if err := json.Unmarshal(b, &v); err == nil {
		b, _ = json.Marshal(v) // canonical: jsonb and Go may space differently
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

func (r *loadRecorder) write(l loadLine) error {
	b, err := json.Marshal(l)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	_, err = r.f.Write(append(b, '\n'))
	return err
}

// Work logs the start with the args' hash, works, reads the row's args
// back and logs the end with their hash.
func (r *loadRecorder) Work(ctx context.Context, job *river.Job[loadArgs]) error {
	r.mu.Lock()
	r.next++
	n := r.next
	r.mu.Unlock()
	if err := r.write(loadLine{Worker: r.id, Run: n, Job: job.ID, Kind: job.Kind, Key: job.Args.Key, Seq: job.Args.Seq,
		Hash: hashOf(job.EncodedArgs), At: time.Now().UnixNano()}); err != nil {
		return fmt.Errorf("log the start: %w", err)
	}
	time.Sleep(loadJobMS * time.Millisecond)
	var args []byte
	if err := r.pool.QueryRow(ctx, "SELECT args FROM river_job WHERE id = $1", job.ID).Scan(&args); err != nil {
		return fmt.Errorf("read the args back: %w", err)
	}
	return r.write(loadLine{Worker: r.id, Run: n, Hash: hashOf(args), End: true, At: time.Now().UnixNano()})
}

// loadWorkerMain runs a sluice worker process working the load kinds until
// SIGTERM or SIGKILL.
func loadWorkerMain(id string) int {
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	f, err := os.OpenFile(os.Getenv(loadRunLogEnv), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		logger.Error("load worker: run log", "error", err)
		return 1
	}
	defer f.Close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		logger.Error("load worker: pool", "error", err)
		return 1
	}
	defer pool.Close()
	rec := &loadRecorder{id: id, pool: pool, f: f}
	workers := river.NewWorkers()
	river.AddWorkerArgs(workers, loadArgs{K: "replace"}, rec)
	river.AddWorkerArgs(workers, loadArgs{K: "debounce"}, rec)
	w, err := app.NewWorker(ctx, app.Config{
		Workers:           workers,
		DatabaseURL:       os.Getenv("DATABASE_URL"),
		ID:                id,
		Queues:            map[string]int{river.QueueDefault: loadSlots},
		HeartbeatInterval: loadHeartbeat,
		DeadAfter:         loadDeadAfter,
		FetchPollInterval: loadPollInterval,
		ShutdownTimeout:   5 * time.Second,
		Logger:            logger,
	})
	if err != nil {
		logger.Error("load worker: new", "error", err)
		return 1
	}
	if err := w.RunNotify(ctx, func() { fmt.Println(loadStartedMsg) }); err != nil {
		logger.Error("load worker: run", "error", err)
		return 1
	}
	return 0
}
