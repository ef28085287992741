package app

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/sluice-dev/sluice/db"
)

// heartbeat keeps the worker's sluice_workers row: inserted at start,
// refreshed every interval (heartbeat_at, and the end of the dispatcher's
// last tick), deleted on a clean shutdown.
type heartbeat struct {
	q        *db.Queries
	id       string
	host     string
	pid      int32
	interval time.Duration
	// poll is the dispatcher's poll interval; 0: no dispatcher.
	poll     time.Duration
	lastTick func() time.Time
	logger   *slog.Logger
}

func newHeartbeat(q *db.Queries, id string, interval, poll time.Duration, lastTick func() time.Time, logger *slog.Logger) *heartbeat {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return &heartbeat{q: q, id: id, host: host, pid: int32(os.Getpid()), interval: interval, poll: poll, lastTick: lastTick, logger: logger}
}

// beat inserts or refreshes the row.
func (h *heartbeat) beat(ctx context.Context) error {
	params := db.UpsertWorkerHeartbeatParams{
		ID:                h.id,
		Host:              h.host,
		Pid:               h.pid,
		HeartbeatInterval: interval(h.interval),
	}
	if h.poll > 0 {
		params.PollInterval = interval(h.poll)
	}
	if h.lastTick != nil {
		if t := h.lastTick(); !t.IsZero() {
			params.DispatcherTickAt = &t
		}
	}
	ctx, cancel := context.WithTimeout(ctx, max(h.interval, 5*time.Second))
	defer cancel()
	if err := h.q.UpsertWorkerHeartbeat(ctx, params); err != nil {
		return fmt.Errorf("worker heartbeat: %w", err)
	}
	return nil
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
			if err := h.beat(ctx); err != nil && ctx.Err() == nil {
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
	if err := h.q.DeleteWorker(ctx, h.id); err != nil {
		return fmt.Errorf("remove worker row: %w", err)
	}
	return nil
}

func interval(d time.Duration) pgtype.Interval {
	return pgtype.Interval{Microseconds: d.Microseconds(), Valid: true}
}
