package policy_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/policy"
)

// A plain SQL INSERT INTO river_job meets the policy too: a conflicting row
// is not inserted (INSERT 0 0, RETURNING returns nothing), and a replace
// is applied to the waiting job.
func TestPlainSQLInsert(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	insert := func(args string) int64 {
		t.Helper()
		tag, err := e.pool.Exec(ctx, `INSERT INTO river_job (kind, args, max_attempts) VALUES ('policy.sync', $1, 5)`, args)
		require.NoError(t, err)
		return tag.RowsAffected()
	}

	e.set(t, policy.Policy{ByArgs: []string{"tenant"}, MaxWaiting: 1, OnConflict: policy.Discard})
	require.EqualValues(t, 1, insert(`{"tenant": "acme", "seq": 1}`))
	require.EqualValues(t, 0, insert(`{"tenant": "acme", "seq": 2}`))
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM river_job WHERE args->>'seq' = '1'`))
	require.Zero(t, e.count(t, `SELECT count(*) FROM river_job WHERE args->>'seq' = '2'`))

	e.set(t, policy.Policy{ByArgs: []string{"tenant"}, MaxWaiting: 1, OnConflict: policy.Replace})
	require.EqualValues(t, 0, insert(`{"tenant": "acme", "seq": 3}`))
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM river_job WHERE args->>'seq' = '3'
		AND metadata->'sluice_policy'->>'replaces' = '1'`))
	// Several rows of one key in one statement: each meets the policy.
	tag, err := e.pool.Exec(ctx, `INSERT INTO river_job (kind, args, max_attempts)
		VALUES ('policy.sync', '{"tenant": "globex", "seq": 4}', 5), ('policy.sync', '{"tenant": "globex", "seq": 5}', 5)`)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
	require.Equal(t, 1, e.waiting(t, "globex"))
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM river_job WHERE args = '{"tenant": "globex", "seq": 5}'`))

	e.set(t, policy.Policy{ByArgs: []string{"tenant"}, MaxWaiting: 1, OnConflict: policy.Reject})
	_, err = e.pool.Exec(ctx, `INSERT INTO river_job (kind, args, max_attempts) VALUES ('policy.sync', '{"tenant": "acme"}', 5)`)
	_, ok := policy.AsRejected(err)
	require.True(t, ok, "%v", err)

	// The view, per key.
	waiting, inserted, discarded, replaced, _ := e.keyRow(t, `"acme"`)
	require.Equal(t, []int64{1, 1, 1, 1}, []int64{waiting, inserted, discarded, replaced})
	var outcomes int
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT sum(count) FROM enqueue_policy_outcomes WHERE kind = 'policy.sync'`).Scan(&outcomes))
	require.Equal(t, 5, outcomes, "acme: inserted, discarded, replaced; globex: inserted, replaced")
}

// Debounce through plain SQL: the row is skipped, the waiting job moved to
// now + D (never past first waiting + M), still available.
func TestPlainSQLDebounce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	e.set(t, policy.Policy{MaxWaiting: 1, OnConflict: policy.Debounce, Debounce: time.Minute, MaxDelay: 90 * time.Second})
	insert := func(seq int) int64 {
		t.Helper()
		tag, err := e.pool.Exec(ctx, `INSERT INTO river_job (kind, args, max_attempts) VALUES ('policy.sync', jsonb_build_object('seq', $1::int), 5)`, seq)
		require.NoError(t, err)
		return tag.RowsAffected()
	}
	require.EqualValues(t, 1, insert(1))
	var first, due time.Time
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT created_at, scheduled_at FROM river_job WHERE kind = 'policy.sync'`).Scan(&first, &due))
	near(t, first.Add(time.Minute), due, time.Second)
	_, err := e.pool.Exec(ctx, `UPDATE river_job SET metadata = jsonb_set(metadata, '{sluice_policy,first_waiting_at}', to_jsonb(now() - interval '60 seconds'))
		WHERE kind = 'policy.sync'`) // as if it had waited a minute
	require.NoError(t, err)
	require.EqualValues(t, 0, insert(2))
	var state string
	var args []byte
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT state, args, scheduled_at FROM river_job WHERE kind = 'policy.sync'`).Scan(&state, &args, &due))
	require.Equal(t, "available", state)
	require.JSONEq(t, `{"seq": 2}`, string(args))
	near(t, time.Now().Add(30*time.Second), due, 2*time.Second) // first waiting + 90s, not now + 60s
}
