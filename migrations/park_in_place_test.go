package migrations_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/migrations"
)

// parkInPlaceVersion is the migration that moved parking in place.
const parkInPlaceVersion = 8

// TestParkInPlaceMigration converts waiting work of the old form (parked =
// a completed River row plus a record holding its copy) to parking in place,
// keeping every waiting job, and converts it back on the way down.
func TestParkInPlaceMigration(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	_, pool := openEmpty(t)
	_, err := migrations.Up(ctx, pool, stock)
	require.NoError(t, err)
	before := int64(parkInPlaceVersion - 1)
	_, err = migrations.Down(ctx, pool, stock, migrations.DownOpts{To: &before})
	require.NoError(t, err)

	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	insertJob := func(state, metadata string, uniqueKey []byte) int64 {
		t.Helper()
		var id int64
		require.NoError(t, pool.QueryRow(ctx, `
			INSERT INTO river_job (state, kind, args, queue, priority, max_attempts, tags, metadata,
			                       attempt, attempted_at, attempted_by, finalized_at, unique_key, unique_states)
			VALUES ($1::river_job_state, 'demo.sleep', '{"ms": 1}', 'q1', 2, 9, '{tag-a}', $2::jsonb,
			        1, now(), '{w1}', CASE WHEN $1::text = 'completed' THEN now() END,
			        $3, CASE WHEN $3::bytea IS NOT NULL THEN B'11110001' END)
			RETURNING id`, state, metadata, uniqueKey).Scan(&id))
		return id
	}
	park := func(originalID int64) {
		t.Helper()
		exec(`INSERT INTO concurrency_parked_jobs (kind, args, queue, priority, max_attempts, tags, metadata, original_job_id)
		      VALUES ('demo.sleep', '{"ms": 1}', 'q1', 2, 9, '{tag-a}', '{"app": 1}', $1)`, originalID)
	}
	exec(`INSERT INTO concurrency_limits (kind, max_concurrency) VALUES ('demo.sleep', 1)`)
	// A: the usual case, its completed original still there.
	a := insertJob("completed", `{"app": 1, "sluice_parked": {"at": "2026-01-01T00:00:00Z"}}`, nil)
	park(a)
	// B: the original already deleted by River's cleaner.
	const gone = 999_999
	park(gone)
	// C: the original retried by hand: it is live again.
	c := insertJob("available", `{"app": 1, "sluice_parked": {}}`, nil)
	park(c)
	// D: unique, and a duplicate now holds its key.
	d := insertJob("completed", `{"app": 1, "sluice_parked": {}}`, []byte("key-d"))
	dup := insertJob("available", `{}`, []byte("key-d"))
	park(d)

	_, err = migrations.Up(ctx, pool, stock)
	require.NoError(t, err)

	type row struct {
		state, metadata string
		attempt         int
		attemptedBy     []string
		finalized       bool
		hasUniqueKey    bool
	}
	get := func(id int64) row {
		t.Helper()
		var r row
		require.NoError(t, pool.QueryRow(ctx, `SELECT state::text, metadata::text, attempt, COALESCE(attempted_by, '{}'),
			finalized_at IS NOT NULL, unique_key IS NOT NULL FROM river_job WHERE id = $1`, id).
			Scan(&r.state, &r.metadata, &r.attempt, &r.attemptedBy, &r.finalized, &r.hasUniqueKey))
		return r
	}
	ra := get(a)
	require.Equal(t, "pending", ra.state)
	require.JSONEq(t, `{"app": 1}`, ra.metadata)
	require.Zero(t, ra.attempt, "the parking attempt undone")
	require.Empty(t, ra.attemptedBy)
	require.False(t, ra.finalized)
	require.Equal(t, "available", get(c).state, "live again: left alone")
	rd := get(d)
	require.Equal(t, "pending", rd.state)
	require.False(t, rd.hasUniqueKey, "waits on without the key its duplicate holds")
	require.Equal(t, "available", get(dup).state)
	var b int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT id FROM river_job WHERE state = 'pending' AND id NOT IN ($1, $2)`, a, d).Scan(&b))
	rb := get(b)
	require.JSONEq(t, `{"app": 1}`, rb.metadata)

	parked := jobIDs(t, pool, `SELECT job_id FROM concurrency_parked_jobs ORDER BY job_id`)
	require.ElementsMatch(t, []int64{a, b, d}, parked, "every waiting job parked in place")
	require.Equal(t, 3, countRows(t, pool, `SELECT count(*) FROM concurrency_parked_jobs WHERE reason = 'migrated'`))
	require.Equal(t, 1, countRows(t, pool, `SELECT has_parked::int FROM concurrency_limits WHERE kind = 'demo.sleep'`))

	// Down: back to the old form, every waiting job kept.
	_, err = migrations.Down(ctx, pool, stock, migrations.DownOpts{To: &before})
	require.NoError(t, err)
	require.ElementsMatch(t, []int64{a, b, d},
		jobIDs(t, pool, `SELECT original_job_id FROM concurrency_parked_jobs ORDER BY id`))
	require.Equal(t, 3, countRows(t, pool, `SELECT count(*) FROM river_job WHERE id IN ($1, $2, $3)
		AND state = 'completed' AND metadata ? 'sluice_parked'`, a, b, d))
	require.Equal(t, 3, countRows(t, pool, `SELECT parked::int FROM concurrency_limits WHERE kind = 'demo.sleep'`))

	// A job caught in the middle of its parking refuses the way down.
	_, err = migrations.Up(ctx, pool, stock)
	require.NoError(t, err)
	exec(`UPDATE river_job SET state = 'running', metadata = metadata || '{"sluice_park": true}' WHERE id = $1`, dup)
	_, err = migrations.Down(ctx, pool, stock, migrations.DownOpts{To: &before})
	require.ErrorContains(t, err, "stop every sluice worker")
}

func jobIDs(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) []int64 {
	t.Helper()
	rows, err := pool.Query(context.Background(), sql, args...)
	require.NoError(t, err)
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	return ids
}

func countRows(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}
