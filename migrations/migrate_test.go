package migrations_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/migrations"
	"github.com/sluice-dev/sluice/modules"
)

// stock are the migrations of the stock binary: every built-in module.
var stock = migrations.Options{Modules: modules.All()}

func openEmpty(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	url := testdb.NewEmpty(t)
	pool, err := pgkit.Open(context.Background(), url, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return url, pool
}

func TestUpIdempotent(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	_, pool := openEmpty(t)

	require.ErrorIs(t, migrations.Check(ctx, pool, stock), migrations.ErrNotMigrated)

	steps, err := migrations.Up(ctx, pool, stock)
	require.NoError(t, err)
	var river, sluice int
	for _, s := range steps {
		switch s.Component {
		case "river":
			river++
		case "sluice":
			sluice++
		}
	}
	require.Positive(t, river)
	require.Positive(t, sluice)
	require.NoError(t, migrations.Check(ctx, pool, stock))

	steps, err = migrations.Up(ctx, pool, stock)
	require.NoError(t, err)
	require.Empty(t, steps, "a second up applies nothing")

	statuses, err := migrations.Status(ctx, pool, stock)
	require.NoError(t, err)
	for _, s := range statuses {
		require.True(t, s.Applied, "%s %s", s.Component, s.Name)
	}
}

func TestUpConcurrent(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url, _ := openEmpty(t)

	// Several processes migrating at once: separate pools, same database.
	const n = 4
	var wg sync.WaitGroup
	errs := make([]error, n)
	applied := make([]int, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pool, err := pgkit.Open(ctx, url, 10*time.Second)
			if err != nil {
				errs[i] = err
				return
			}
			defer pool.Close()
			steps, err := migrations.Up(ctx, pool, stock)
			errs[i] = err
			applied[i] = len(steps)
		}()
	}
	wg.Wait()
	total := 0
	nonZero := 0
	for i := range n {
		require.NoError(t, errs[i])
		total += applied[i]
		if applied[i] > 0 {
			nonZero++
		}
	}
	require.Equal(t, 1, nonZero, "exactly one process applies the migrations: %v", applied)

	pool, err := pgkit.Open(ctx, url, 10*time.Second)
	require.NoError(t, err)
	defer pool.Close()
	require.NoError(t, migrations.Check(ctx, pool, stock))
	statuses, err := migrations.Status(ctx, pool, stock)
	require.NoError(t, err)
	require.Len(t, statuses, total)
}

func TestDownAndUpAgain(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	_, pool := openEmpty(t)

	_, err := migrations.Up(ctx, pool, stock)
	require.NoError(t, err)

	// River's schema cannot go while sluice's depends on it.
	one := int64(1)
	_, err = migrations.Down(ctx, pool, stock, migrations.DownOpts{To: &one, River: true})
	require.Error(t, err)

	zero := int64(0)
	steps, err := migrations.Down(ctx, pool, stock, migrations.DownOpts{To: &zero, River: true})
	require.NoError(t, err)
	require.NotEmpty(t, steps)

	var tables int
	require.NoError(t, pool.QueryRow(ctx, `
		SELECT count(*) FROM pg_tables
		WHERE schemaname = 'public' AND tablename IN ('river_job', 'settings', 'maintenance_runs')`).Scan(&tables))
	require.Zero(t, tables)

	// Down with nothing left is not an error.
	steps, err = migrations.Down(ctx, pool, stock, migrations.DownOpts{})
	require.NoError(t, err)
	require.Empty(t, steps)

	_, err = migrations.Up(ctx, pool, stock)
	require.NoError(t, err)
	require.NoError(t, migrations.Check(ctx, pool, stock))
}

func TestDownOneStep(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	_, pool := openEmpty(t)
	_, err := migrations.Up(ctx, pool, stock)
	require.NoError(t, err)

	steps, err := migrations.Down(ctx, pool, stock, migrations.DownOpts{})
	require.NoError(t, err)
	require.Len(t, steps, 1)
	require.Equal(t, "sluice", steps[0].Component)

	err = migrations.Check(ctx, pool, stock)
	require.True(t, errors.Is(err, migrations.ErrNotMigrated), "%v", err)
	require.Contains(t, err.Error(), steps[0].Name)
}
