package scheduler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/kinds"
	"github.com/sluice-dev/sluice/settings"
)

// Defaults of Config.
const (
	DefaultPollInterval = time.Second
	DefaultBatchSize    = 2000
	// MaxBatchSize bounds Config.BatchSize.
	MaxBatchSize = 10_000
	// NotifyChannel is the channel the schedules table's triggers notify
	// and the dispatchers LISTEN on.
	NotifyChannel = "sluice_schedules"
	// stopGrace is how long a stopping dispatcher lets its batch in flight
	// finish before cancelling it (a cancelled batch rolls back: nothing is
	// lost, another dispatcher redoes it).
	stopGrace = 10 * time.Second
	// batchTimeout bounds one claim-and-dispatch transaction.
	batchTimeout = time.Minute
)

// Config configures a Dispatcher.
type Config struct {
	// Pool is the database pool (required).
	Pool *pgxpool.Pool
	// Client inserts the jobs, with InsertManyTx in the claim's
	// transaction (required; an insert-only client will do).
	Client *river.Client[pgx.Tx]
	// Registry decodes and validates the job args (required).
	Registry *kinds.Registry
	// Logger receives the dispatcher's log lines; nil discards them.
	Logger *slog.Logger
	// Metrics are the dispatcher's collectors; nil: a private registry.
	Metrics *Metrics
	// PollInterval is the longest the dispatcher sleeps between ticks
	// (default 1s); it wakes earlier for the next due time and on NOTIFY.
	PollInterval time.Duration
	// BatchSize is how many due rows one transaction claims (default 2000).
	BatchSize int
	// Now, if set, is the dispatcher's clock instead of the database's
	// now() (tests drive time with it).
	Now func() time.Time
	// DisableListen turns the LISTEN/NOTIFY wake-up off (polling only).
	DisableListen bool
	// Tracer makes a span (sluice.schedule.dispatch) of every tick that
	// dispatches due schedules; the jobs' insert spans, and so their work
	// spans, are in its trace. Nil: none.
	Tracer trace.Tracer
}

// Dispatcher turns due schedules rows into River jobs: each tick it claims
// due rows with FOR UPDATE SKIP LOCKED, inserts their jobs and advances
// the rows in the same transaction, so each due time yields exactly one job
// however many dispatchers run.
type Dispatcher struct {
	// TestSignals let tests wait for background work (no-ops otherwise).
	TestSignals TestSignals

	cfg      Config
	q        *db.Queries
	settings *settings.Settings
	registry *kinds.Registry
	logger   *slog.Logger
	metrics  *Metrics

	wake      chan struct{}
	lastTick  atomic.Int64 // unix nanoseconds of the end of the last good tick
	listening atomic.Bool

	cacheMu   sync.Mutex
	cronCache map[string]cronEntry

	// runMu guards stop, set while started with Start.
	runMu sync.Mutex
	stop  func()
}

type cronEntry struct {
	cron *Cron
	err  error
}

// TickResult summarises one tick.
type TickResult struct {
	// Initialised counts rows whose next_run_at was computed.
	Initialised int
	// Dispatched counts rows dispatched (one or more jobs, or none when
	// the misfire policy skipped every due time).
	Dispatched int
	// Jobs counts jobs inserted.
	Jobs int
	// Failed counts failed dispatches.
	Failed int
	// Sleep is how long to wait before the next tick: until the next due
	// time, at most the poll interval.
	Sleep time.Duration
}

// New validates cfg and returns a dispatcher; nothing runs until Run.
func New(cfg Config) (*Dispatcher, error) {
	switch {
	case cfg.Pool == nil:
		return nil, errors.New("scheduler: Config.Pool is required")
	case cfg.Client == nil:
		return nil, errors.New("scheduler: Config.Client is required")
	case cfg.PollInterval < 0:
		return nil, fmt.Errorf("scheduler: poll interval must not be negative, got %s", cfg.PollInterval)
	case cfg.BatchSize < 0 || cfg.BatchSize > MaxBatchSize:
		return nil, fmt.Errorf("scheduler: batch size must be between 1 and %d, got %d", MaxBatchSize, cfg.BatchSize)
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.Registry == nil {
		return nil, errors.New("scheduler: a Dispatcher needs the program's kinds (Config.Registry)")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Tracer == nil {
		cfg.Tracer = noop.NewTracerProvider().Tracer("")
	}
	if cfg.Metrics == nil {
		m, err := NewMetrics(nil)
		if err != nil {
			return nil, err
		}
		cfg.Metrics = m
	}
	return &Dispatcher{
		cfg:       cfg,
		q:         db.New(cfg.Pool),
		settings:  settings.New(cfg.Pool),
		registry:  cfg.Registry,
		logger:    cfg.Logger.With("component", "scheduler"),
		metrics:   cfg.Metrics,
		wake:      make(chan struct{}, 1),
		cronCache: map[string]cronEntry{},
	}, nil
}

// PollInterval is the dispatcher's poll interval.
func (d *Dispatcher) PollInterval() time.Duration { return d.cfg.PollInterval }

// LastTick is when the last successful tick ended (zero before the first).
func (d *Dispatcher) LastTick() time.Time {
	n := d.lastTick.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// Listening reports whether the LISTEN connection is established.
func (d *Dispatcher) Listening() bool { return d.listening.Load() }

// Wake makes a running dispatcher tick now.
func (d *Dispatcher) Wake() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// Run ticks until ctx is cancelled: at once, then whenever the next due
// time comes, a NOTIFY arrives or the poll interval passes. On
// cancellation it lets the batch in flight finish (at most 10s), stops the
// listener and returns nil. Tick errors (an unreachable database) are
// logged and retried at the next poll.
func (d *Dispatcher) Run(ctx context.Context) error {
	// Ticks run on a context of their own, cancelled stopGrace after ctx,
	// so that a stop does not abort a batch half-way without need.
	tickCtx, cancelTicks := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelTicks()
	stopWatch := context.AfterFunc(ctx, func() { time.AfterFunc(stopGrace, cancelTicks) })
	defer stopWatch()

	var wg sync.WaitGroup
	if !d.cfg.DisableListen {
		wg.Go(func() { d.listen(ctx) })
	}
	defer wg.Wait()

	d.logger.Info("schedule dispatcher started", "poll_interval", d.cfg.PollInterval.String(), "batch_size", d.cfg.BatchSize)
	for {
		sleep := d.cfg.PollInterval
		res, err := d.tick(tickCtx, ctx)
		switch {
		case ctx.Err() != nil:
			d.logger.Info("schedule dispatcher stopped")
			return nil
		case err != nil:
			d.logger.Error("schedule dispatcher tick failed; retrying at the next poll", "error", err)
		default:
			sleep = res.Sleep
		}
		timer := time.NewTimer(sleep)
		select {
		case <-ctx.Done():
			timer.Stop()
			d.logger.Info("schedule dispatcher stopped")
			return nil
		case <-timer.C:
		case <-d.wake:
			timer.Stop()
		}
	}
}

// Start runs the dispatcher in the background (Run) and returns at once.
// Unlike River's services, only Stop stops it, not the cancellation of
// ctx: a sluice worker stops its dispatcher at a moment of its choosing in
// its graceful stop. Starting a started dispatcher is an error.
func (d *Dispatcher) Start(ctx context.Context) error {
	d.runMu.Lock()
	defer d.runMu.Unlock()
	if d.stop != nil {
		return errors.New("scheduler: dispatcher already started")
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	d.stop = func() { cancel(); <-done }
	go func() {
		defer close(done)
		if err := d.Run(runCtx); err != nil {
			d.logger.Error("schedule dispatcher stopped", "error", err)
		}
	}()
	return nil
}

// Stop stops a dispatcher started with Start and waits for it: the batch in
// flight finishes (at most 10s). Stopping one that is not started does
// nothing.
func (d *Dispatcher) Stop() {
	d.runMu.Lock()
	stop := d.stop
	d.stop = nil
	d.runMu.Unlock()
	if stop != nil {
		stop()
	}
}

// Tick runs one pass: the idle check; if rows wait for their next_run_at,
// computes it; if rows are due, dispatches all of them in batches. It is
// what Run calls; tests and benchmarks call it directly.
func (d *Dispatcher) Tick(ctx context.Context) (TickResult, error) {
	return d.tick(ctx, ctx)
}

// tick works on ctx and stops between batches once stop is done.
func (d *Dispatcher) tick(ctx, stop context.Context) (TickResult, error) {
	start := time.Now()
	var res TickResult
	peek, err := d.q.SchedulerPeek(ctx)
	if err != nil {
		return res, fmt.Errorf("scheduler idle check: %w", err)
	}
	set := &dispatchSettings{ctx: ctx, settings: d.settings, logger: d.logger}
	worked := false
	if peek.Uninitialised {
		worked = true
		for stop.Err() == nil {
			n, err := d.initialiseBatch(ctx, set, &res)
			if err != nil {
				return res, err
			}
			if n < d.cfg.BatchSize {
				break
			}
		}
	}
	if now := d.clock(peek.DbNow); peek.NextDue != nil && !peek.NextDue.After(now) {
		worked = true
		if err := d.dispatchDue(ctx, stop, set, &res); err != nil {
			return res, err
		}
	}
	if worked {
		if peek, err = d.q.SchedulerPeek(ctx); err != nil {
			return res, fmt.Errorf("scheduler idle check: %w", err)
		}
	}
	res.Sleep = d.cfg.PollInterval
	if d.cfg.Now == nil && peek.NextDue != nil {
		// Wake for the next due time; a row due already is held by
		// another transaction (or failing): poll for it.
		if until := peek.NextDue.Sub(peek.DbNow); until > 0 && until < res.Sleep {
			res.Sleep = until
		}
	}
	d.lastTick.Store(time.Now().UnixNano())
	d.metrics.TickDuration.Observe(time.Since(start).Seconds())
	d.TestSignals.Ticked.Signal(res)
	return res, nil
}

// dispatchDue dispatches due rows, batch after batch, until none is left
// or stop is done, in a span of its own: the jobs inserted are in its
// trace.
func (d *Dispatcher) dispatchDue(ctx, stop context.Context, set *dispatchSettings, res *TickResult) (err error) {
	ctx, span := d.cfg.Tracer.Start(ctx, "sluice.schedule.dispatch")
	defer func() {
		span.SetAttributes(attribute.Int("dispatched", res.Dispatched), attribute.Int("jobs", res.Jobs),
			attribute.Int("failed", res.Failed))
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}()
	for stop.Err() == nil {
		n, err := d.dispatchBatch(ctx, set, res)
		if err != nil {
			return err
		}
		if n < d.cfg.BatchSize {
			break
		}
	}
	return nil
}

// clock is the dispatcher's now: Config.Now, else the database's.
func (d *Dispatcher) clock(dbNow time.Time) time.Time {
	if d.cfg.Now != nil {
		return d.cfg.Now()
	}
	return dbNow
}

// claimNow is the now passed to the claim queries: nil means the database's.
func (d *Dispatcher) claimNow() *time.Time {
	if d.cfg.Now == nil {
		return nil
	}
	t := d.cfg.Now()
	return &t
}

// wallNow is the time a commit happened, for the lag metric.
func (d *Dispatcher) wallNow() time.Time {
	if d.cfg.Now != nil {
		return d.cfg.Now()
	}
	return time.Now()
}

// cron parses expr in tz, caching the result (rows share expressions).
func (d *Dispatcher) cron(expr, tz string) (*Cron, error) {
	key := expr + "\x00" + tz
	d.cacheMu.Lock()
	defer d.cacheMu.Unlock()
	if e, ok := d.cronCache[key]; ok {
		return e.cron, e.err
	}
	c, err := ParseCron(expr, tz)
	if err != nil {
		var cronErr *CronError
		if errors.As(err, &cronErr) {
			err = &FieldError{Field: cronErr.Field, Value: cronErr.Value, Reason: cronErr.Reason, Err: err}
		}
	}
	if len(d.cronCache) >= 10_000 {
		clear(d.cronCache)
	}
	d.cronCache[key] = cronEntry{cron: c, err: err}
	return c, err
}
