package migrations_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/migrations"
)

// TestRiverMigratesAroundSluice: River's own migrations run down to the
// oldest version sluice supports and back up to the newest, with sluice's
// triggers and views on river_job in place and a parked job present (none
// of River's ALTERs is blocked by them); meanwhile the check refuses to
// start, saying which River migration is pending.
func TestRiverMigratesAroundSluice(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool := testdb.NewPool(t)
	jobtest.SetLimit(t, pool, "demo.sleep", 1)
	parked := jobtest.InsertParked(t, pool, "demo.sleep", `{"ms": 1}`)
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: pgkit.SchemasOf(pool).River})
	require.NoError(t, err)

	res, err := migrator.Migrate(ctx, rivermigrate.DirectionDown, &rivermigrate.MigrateOpts{TargetVersion: migrations.MinRiverVersion})
	require.NoError(t, err)
	require.NotEmpty(t, res.Versions, "River has versions above sluice's oldest")
	err = migrations.Check(ctx, pool, stock)
	require.ErrorIs(t, err, migrations.ErrNotMigrated)
	require.ErrorContains(t, err, "river migration")

	res, err = migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	require.NoError(t, err)
	require.NotEmpty(t, res.Versions)
	require.NoError(t, migrations.Check(ctx, pool, stock))
	require.Equal(t, "pending", jobtest.JobState(t, pool, parked))
	require.Equal(t, 1, jobtest.Count(t, pool, "SELECT count(*) FROM sluice_parked_jobs WHERE job_id = $1", parked))
}

// TestRiverSchemaTooNew: River's schema migrated by a newer River than
// sluice's is refused at start, naming the versions sluice supports.
func TestRiverSchemaTooNew(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool := testdb.NewPool(t)
	_, err := pool.Exec(ctx, `INSERT INTO river_migration (line, version) VALUES ('main', 99)`)
	require.NoError(t, err)
	err = migrations.Check(ctx, pool, stock)
	require.ErrorIs(t, err, migrations.ErrRiverUnsupported)
	require.ErrorContains(t, err, "it is at version 99, and this sluice supports River's schema versions 6 to")
}

// TestRiverSchemaTooOld: River's schema older than the oldest version sluice
// supports is refused at start, naming the version found and the versions
// supported, and `migrate up` is the way out.
func TestRiverSchemaTooOld(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool := testdb.NewPool(t)
	_, err := pool.Exec(ctx, `DELETE FROM river_migration WHERE version >= $1`, migrations.MinRiverVersion)
	require.NoError(t, err)
	err = migrations.Check(ctx, pool, stock)
	require.ErrorIs(t, err, migrations.ErrNotMigrated)
	require.ErrorContains(t, err, fmt.Sprintf("River's schema is at version %d, and this sluice supports River's schema versions %d to",
		migrations.MinRiverVersion-1, migrations.MinRiverVersion))
	require.ErrorContains(t, err, "run `sluice migrate up`")
}
