package liveness

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/db"
)

// heartbeat keeps the worker's sluice_workers row: inserted at start
// (register), refreshed every interval (heartbeat_at, and the end of the
// dispatcher's last tick), deleted on a clean shutdown. A refresh that finds
// no row means the worker was reaped (liveness.markReaped).
type heartbeat struct {
	q        *db.Queries
	live     *liveness
	id       string
	host     string
	pid      int32
	interval time.Duration
	// poll is the dispatcher's poll interval; 0: no dispatcher.
	poll time.Duration
	// queues is the JSON object of the queues the worker serves, recorded
	// at registration (nil: not recorded).
	queues   []byte
	lastTick func() time.Time
	logger   *slog.Logger
	// beatAt, if set, is set to the time of every successful beat.
	beatAt prometheus.Gauge
}

func newHeartbeat(q *db.Queries, live *liveness, interval, poll time.Duration, lastTick func() time.Time, logger *slog.Logger) *heartbeat {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return &heartbeat{q: q, live: live, id: live.id, host: host, pid: int32(os.Getpid()), interval: interval, poll: poll, lastTick: lastTick, logger: logger}
}

// timeout bounds one beat: at least the interval, at most 5s, and at most a
// third of dead-after, so that after a database outage a worker's first
// successful beat comes well within the dead-after other reapers wait.
func (h *heartbeat) timeout() time.Duration {
	return max(h.interval, min(5*time.Second, h.live.deadAfter/MinDeadAfterBeats))
}

// registered records that the worker's row was inserted, at at.
func (h *heartbeat) registered(at time.Time) {
	h.live.registered.Store(true)
	h.succeeded(at)
}

// register inserts the worker's row. It reports false, without error, when
// a row with the same id exists (another process uses or used the id).
func (h *heartbeat) register(ctx context.Context) (bool, error) {
	params := db.RegisterWorkerParams{
		ID:                h.id,
		Incarnation:       h.live.incarnation,
		Host:              h.host,
		Pid:               h.pid,
		HeartbeatInterval: interval(h.interval),
		DeadAfter:         interval(h.live.deadAfter),
		BackendName:       h.live.backendName,
		Queues:            h.queues,
	}
	if h.poll > 0 {
		params.PollInterval = interval(h.poll)
	}
	ctx, cancel := context.WithTimeout(ctx, h.timeout())
	defer cancel()
	n, err := h.q.RegisterWorker(ctx, params)
	if err != nil {
		return false, fmt.Errorf("register worker: %w", err)
	}
	if n == 1 {
		h.registered(time.Now())
	}
	return n == 1, nil
}

// beat refreshes the row. A row that is gone marks the worker reaped and
// returns ErrReaped.
func (h *heartbeat) beat(ctx context.Context) error {
	params := db.HeartbeatWorkerParams{
		ID:                h.id,
		Incarnation:       h.live.incarnation,
		HeartbeatInterval: interval(h.interval),
		DeadAfter:         interval(h.live.deadAfter),
	}
	if h.poll > 0 {
		params.PollInterval = interval(h.poll)
	}
	if h.lastTick != nil {
		if t := h.lastTick(); !t.IsZero() {
			params.DispatcherTickAt = &t
		}
	}
	ctx, cancel := context.WithTimeout(ctx, h.timeout())
	defer cancel()
	n, err := h.q.HeartbeatWorker(ctx, params)
	switch {
	case errors.Is(err, ErrReaped):
		h.live.beatFailed()
		return err
	case err != nil:
		h.live.beatFailed()
		return fmt.Errorf("worker heartbeat: %w", err)
	case n == 0:
		h.live.beatFailed()
		h.live.markReaped("its heartbeat found the worker's row gone")
		return ErrReaped
	}
	h.succeeded(time.Now())
	return nil
}

// succeeded records a successful beat at now.
func (h *heartbeat) succeeded(now time.Time) {
	h.live.beatSucceeded(now)
	if h.beatAt != nil {
		h.beatAt.Set(float64(now.UnixNano()) / 1e9)
	}
}

// run beats every interval until ctx is done, and once more as soon as the
// dispatcher's first tick is done (so that the row shows a tick early). A
// failed beat is logged; the next one tries again.
func (h *heartbeat) run(ctx context.Context) {
	ticker := time.NewTicker(h.interval)
	defer ticker.Stop()
	if h.lastTick != nil {
		h.afterFirstTick(ctx, ticker.C)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			if err := h.beat(ctx); errors.Is(err, ErrReaped) {
				return
			} else if err != nil && ctx.Err() == nil {
				h.logger.Warn("worker heartbeat failed", "error", err)
			}
		}
	}
}

// afterFirstTick waits for the dispatcher's first tick (or the first
// regular beat) and beats.
func (h *heartbeat) afterFirstTick(ctx context.Context, regular <-chan time.Time) {
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	for h.lastTick().IsZero() {
		select {
		case <-ctx.Done():
			return
		case <-regular:
		case <-poll.C:
			continue
		}
		break
	}
	if err := h.beat(ctx); err != nil && ctx.Err() == nil {
		h.logger.Warn("worker heartbeat failed", "error", err)
	}
}

// remove deletes the row (clean shutdown).
func (h *heartbeat) remove(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := h.q.DeleteWorker(ctx, db.DeleteWorkerParams{ID: h.id, Incarnation: h.live.incarnation}); err != nil {
		return fmt.Errorf("remove worker row: %w", err)
	}
	return nil
}

func interval(d time.Duration) pgtype.Interval {
	return pgtype.Interval{Microseconds: d.Microseconds(), Valid: true}
}
