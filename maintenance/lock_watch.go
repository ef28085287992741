package maintenance

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/sluice-dev/sluice/db"
)

// watchLock returns a context cancelled (cause ErrLockLost) when lock's
// connection stops answering, checked every interval, and a stop function
// that ends the watch; it must be called before the lock is released.
func watchLock(ctx context.Context, lock *db.SessionLock, interval time.Duration, logger *slog.Logger) (context.Context, func()) {
	runCtx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ticker := time.NewTicker(interval)
		defer ticker.Stop()
		for {
			select {
			case <-runCtx.Done():
				return
			case <-ticker.C:
				if err := lock.Ping(runCtx); err != nil && runCtx.Err() == nil {
					logger.Error("maintenance run stopped: its advisory lock is lost", "error", err)
					cancel(fmt.Errorf("%w: %v", ErrLockLost, err))
					return
				}
			}
		}
	}()
	return runCtx, func() {
		cancel(nil)
		<-done
	}
}
