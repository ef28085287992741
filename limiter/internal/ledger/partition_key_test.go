package ledger

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/testdb"
)

// TestPartitionKeyMatchesSQL: the key the worker computes from a job's args
// as River fetches them (jsonb text) is the one sluice_partition_key computes
// in SQL (the views, the safety net and the CLI's repartition use it), for
// every shape of value, missing fields and several fields.
func TestPartitionKeyMatchesSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.NewPool(t)
	for _, tc := range []struct {
		args   string
		fields []string
	}{
		{`{"tenant": "acme", "n": 1}`, []string{"tenant"}},
		{`{"tenant":"acme"}`, []string{"missing"}},
		{`{"n": 1.50, "big": 12345678901234567890}`, []string{"n", "big"}},
		{`{"obj": {"b": 2, "a": [1, 2, {"c": null}]}, "s": "é \"q\" \\ \u0001"}`, []string{"obj", "s"}},
		{`{"t": true, "f": false, "z": null, "e": "", "arr": []}`, []string{"t", "f", "z", "e", "arr", "nope"}},
		{`{"a": 1, "a": 2}`, []string{"a"}},
	} {
		// The args as River reads them back: jsonb's text.
		var fetched []byte
		require.NoError(t, pool.QueryRow(ctx, `SELECT $1::jsonb::text`, tc.args).Scan(&fetched))
		var want string
		require.NoError(t, pool.QueryRow(ctx, `SELECT sluice_partition_key($1::jsonb, $2)`, tc.args, tc.fields).Scan(&want))
		got, ok := PartitionKey(fetched, tc.fields)
		require.True(t, ok, "%s", fetched)
		require.Equal(t, want, got, "args %s fields %v", fetched, tc.fields)
	}
	_, ok := PartitionKey([]byte(`[1, 2]`), []string{"a"})
	require.False(t, ok, "not an object: computed by SQL instead")
	_, ok = PartitionKey(nil, []string{"a"})
	require.False(t, ok)
}
