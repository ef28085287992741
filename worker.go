package sluice

import (
	"context"
	"errors"
	"net/http"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/sluice-dev/sluice/app"
)

// ErrReaped is returned by Worker.Stop (and Err) when the worker found
// itself declared dead by another worker, which rescued its jobs: it
// stopped at once, and a new Worker must be started under a new id.
var ErrReaped = app.ErrReaped

// Worker is a sluice worker inside an application's own process: the River
// client working the program's jobs, the schedule dispatcher, the heartbeat
// and the reaper, and (with Config.HTTPAddr) the HTTP endpoints.
type Worker struct {
	w *app.Worker

	mu      sync.Mutex
	cancel  context.CancelFunc
	done    chan struct{}
	err     error
	started bool
	// closed: stopped before it was started; it cannot start any more.
	closed bool
}

// New connects to cfg.DatabaseURL, checks that the database is migrated
// (every migration of River, sluice's core, cfg.Modules and
// cfg.Migrations applied: by Migrate, or by `migrate up` of a program whose
// Main has the same Migrations and Modules), and builds the worker. Nothing
// runs until Start.
func New(ctx context.Context, cfg Config) (*Worker, error) {
	w, err := app.NewWorker(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &Worker{w: w, done: make(chan struct{})}, nil
}

// Start starts working jobs in the background: it registers the worker,
// then starts its River client, dispatcher, heartbeat and reaper. It
// returns once they run; Stop ends them.
func (w *Worker) Start(ctx context.Context) error {
	w.mu.Lock()
	switch {
	case w.closed:
		w.mu.Unlock()
		return errors.New("sluice: worker stopped before it was started: build a new one with New")
	case w.started:
		w.mu.Unlock()
		return errors.New("sluice: worker already started")
	}
	w.started = true
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w.cancel = cancel
	w.mu.Unlock()

	started := make(chan struct{})
	go func() {
		err := w.w.RunNotify(runCtx, func() { close(started) })
		w.mu.Lock()
		w.err = err
		w.mu.Unlock()
		close(w.done)
	}()
	select {
	case <-started:
		return nil
	case <-w.done:
		return w.Err()
	case <-ctx.Done():
		cancel()
		<-w.done
		return context.Cause(ctx)
	}
}

// Stop stops the worker gracefully: it stops dispatching and fetching, lets
// running jobs finish for up to Config.ShutdownTimeout, cancels those still
// running and returns once the worker has stopped, or when ctx is done. It
// returns the error the worker stopped with (ErrReaped when it was reaped).
// As River's Client.Stop, Stop of a worker that was never started returns
// nil; it releases the worker's pool (and listener), and the worker cannot
// be started any more.
func (w *Worker) Stop(ctx context.Context) error {
	w.mu.Lock()
	cancel, started := w.cancel, w.started
	if !started && !w.closed {
		w.closed = true
		w.w.Close()
		close(w.done)
	}
	w.mu.Unlock()
	if !started {
		return nil
	}
	cancel()
	select {
	case <-w.done:
		return w.Err()
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Stopped is closed once the worker has stopped, by Stop or on its own
// (ErrReaped, or its HTTP server failing).
func (w *Worker) Stopped() <-chan struct{} { return w.done }

// Err is the error the worker stopped with, once Stopped is closed.
func (w *Worker) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Client is the worker's River client: insert jobs with it (Insert,
// InsertTx, InsertMany), and use River's whole client API on them.
func (w *Worker) Client() *river.Client[pgx.Tx] { return w.w.Client() }

// Pool is the worker's database pool.
func (w *Worker) Pool() *pgxpool.Pool { return w.w.Pool() }

// Handler serves the worker's HTTP endpoints, for an application to mount
// in its own server (under Config.HTTPPrefix, with http.StripPrefix):
// /healthz and /readyz, open to all; /metrics, /stats, /health, River UI at
// /riverui/ and sluice's pages at /ui/ (/ leads there), behind
// Config.HTTPToken when it is set. Without a token they are open: who may
// reach them is the application's to decide (its server, its middleware).
func (w *Worker) Handler() http.Handler { return w.w.Handler() }

// HTTPAddr is the address the worker's own HTTP server listens on, or ""
// without one.
func (w *Worker) HTTPAddr() string { return w.w.HTTPAddr() }
