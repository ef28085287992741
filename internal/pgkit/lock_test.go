package pgkit_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
)

func TestSessionLock(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool := testdb.NewPool(t)

	t.Run("contention", func(t *testing.T) {
		t.Parallel()

		first, err := pgkit.TryLock(ctx, pool, "lock.contention")
		require.NoError(t, err)
		require.NotNil(t, first)

		second, err := pgkit.TryLock(ctx, pool, "lock.contention")
		require.NoError(t, err)
		require.Nil(t, second, "a second session must not get a held lock")

		other, err := pgkit.TryLock(ctx, pool, "lock.contention.other")
		require.NoError(t, err)
		require.NotNil(t, other, "locks of other names are independent")
		require.NoError(t, other.Release(ctx))

		require.NoError(t, first.Release(ctx))
		require.NoError(t, first.Release(ctx), "Release is idempotent")

		third, err := pgkit.TryLock(ctx, pool, "lock.contention")
		require.NoError(t, err)
		require.NotNil(t, third, "a released lock can be taken again")
		require.NoError(t, third.Release(ctx))
	})

	t.Run("visible in pg_locks under hashtextextended", func(t *testing.T) {
		t.Parallel()

		lock, err := pgkit.TryLock(ctx, pool, "lock.visible")
		require.NoError(t, err)
		require.NotNil(t, lock)
		defer lock.Release(ctx) //nolint:errcheck

		holders, err := db.New(pool).AdvisoryLockHolders(ctx, "lock.visible")
		require.NoError(t, err)
		require.Len(t, holders, 1)

		// The operator's view: the documented key, by hand.
		var n int
		require.NoError(t, pool.QueryRow(ctx, `
			SELECT count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND granted AND objsubid = 1
			  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			  AND ((classid::bigint << 32) | objid::bigint) = hashtextextended('lock.visible', 0)`).Scan(&n))
		require.Equal(t, 1, n)
	})

	t.Run("held by hand pauses the kind", func(t *testing.T) {
		t.Parallel()

		conn, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		_, err = conn.Exec(ctx, "SELECT pg_advisory_lock(hashtextextended('lock.by_hand', 0))")
		require.NoError(t, err)

		lock, err := pgkit.TryLock(ctx, pool, "lock.by_hand")
		require.NoError(t, err)
		require.Nil(t, lock)

		_, err = conn.Exec(ctx, "SELECT pg_advisory_unlock(hashtextextended('lock.by_hand', 0))")
		require.NoError(t, err)
		lock, err = pgkit.TryLock(ctx, pool, "lock.by_hand")
		require.NoError(t, err)
		require.NotNil(t, lock)
		require.NoError(t, lock.Release(ctx))
	})

	t.Run("dies with the holder's connection", func(t *testing.T) {
		t.Parallel()

		lock, err := pgkit.TryLock(ctx, pool, "lock.crash")
		require.NoError(t, err)
		require.NotNil(t, lock)
		holders, err := db.New(pool).AdvisoryLockHolders(ctx, "lock.crash")
		require.NoError(t, err)
		require.Len(t, holders, 1)

		// Simulate the holder's process dying: its backend goes away.
		_, err = pool.Exec(ctx, "SELECT pg_terminate_backend($1)", *holders[0].Pid)
		require.NoError(t, err)

		require.Eventually(t, func() bool {
			again, err := pgkit.TryLock(ctx, pool, "lock.crash")
			if err != nil || again == nil {
				return false
			}
			require.NoError(t, again.Release(ctx))
			return true
		}, 10*time.Second, 20*time.Millisecond)

		// Releasing on the dead connection reports it and does not panic.
		require.Error(t, lock.Release(ctx))
	})

	t.Run("release after cancellation", func(t *testing.T) {
		t.Parallel()

		lockCtx, cancel := context.WithCancel(ctx)
		lock, err := pgkit.TryLock(lockCtx, pool, "lock.cancelled")
		require.NoError(t, err)
		require.NotNil(t, lock)
		cancel()
		require.NoError(t, lock.Release(lockCtx), "release must not depend on the caller's context")

		again, err := pgkit.TryLock(ctx, pool, "lock.cancelled")
		require.NoError(t, err)
		require.NotNil(t, again)
		require.NoError(t, again.Release(ctx))
	})

	t.Run("blocking lock waits", func(t *testing.T) {
		t.Parallel()

		first, err := pgkit.Lock(ctx, pool, "lock.blocking")
		require.NoError(t, err)
		got := make(chan *pgkit.SessionLock)
		go func() {
			second, err := pgkit.Lock(ctx, pool, "lock.blocking")
			require.NoError(t, err)
			got <- second
		}()
		select {
		case <-got:
			t.Fatal("second Lock returned while the first held the lock")
		case <-time.After(200 * time.Millisecond):
		}
		require.NoError(t, first.Release(ctx))
		second := <-got
		require.NoError(t, second.Release(ctx))

		// A wait cut short by its context leaves nothing held (once the
		// server has noticed the waiter's connection is gone).
		first, err = pgkit.Lock(ctx, pool, "lock.blocking")
		require.NoError(t, err)
		waitCtx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		_, err = pgkit.Lock(waitCtx, pool, "lock.blocking")
		require.Error(t, err)
		require.NoError(t, first.Release(ctx))
		require.Eventually(t, func() bool {
			free, err := pgkit.TryLock(ctx, pool, "lock.blocking")
			if err != nil || free == nil {
				return false
			}
			require.NoError(t, free.Release(ctx))
			return true
		}, 10*time.Second, 20*time.Millisecond)
	})
}
