package maintenance

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/sluice-dev/sluice/internal/pgkit"
)

// watchLock returns a context cancelled (cause ErrLockLost) when lock's
// connection stops answering, checked every interval, and a stop function
// that ends the watch; it must be called before the lock is released.
//
// Each check is a ping bounded by half the interval: a connection that does
// not answer in time (half-open, or its server side gone) counts as lost,
// since the server may have released the lock already, and the run is
// stopped before another run of the kind could overlap it.
func watchLock(ctx context.Context, lock *pgkit.SessionLock, interval time.Duration, logger *slog.Logger) (context.Context, func()) {
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
				pingCtx, cancelPing := context.WithTimeout(runCtx, interval/2)
				err := lock.Ping(pingCtx)
				cancelPing()
				if err != nil && runCtx.Err() == nil {
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
