package policy_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/policy"
)

// syncArgs are the args of the kind the tests give policies to.
type syncArgs struct {
	Tenant string `json:"tenant"`
	Seq    int    `json:"seq"`
}

func (syncArgs) Kind() string { return "policy.sync" }

// env is a test's database, an insert-only River client on it (as a
// team's own client would be) and the policy store.
type env struct {
	pool   *pgxpool.Pool
	client *river.Client[pgx.Tx]
	store  *policy.Store
}

func newEnv(t *testing.T) *env {
	t.Helper()
	pool := testdb.NewPool(t)
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: jobtest.Logger(t)})
	require.NoError(t, err)
	return &env{pool: pool, client: client, store: policy.NewStore(pool)}
}

func (e *env) set(t *testing.T, p policy.Policy) {
	t.Helper()
	if p.Kind == "" {
		p.Kind = syncArgs{}.Kind()
	}
	require.NoError(t, e.store.Set(context.Background(), p))
}

func (e *env) insert(t *testing.T, tenant string, seq int) *rivertype.JobInsertResult {
	t.Helper()
	res, err := e.client.Insert(context.Background(), syncArgs{Tenant: tenant, Seq: seq}, nil)
	require.NoError(t, err)
	return res
}

func (e *env) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	return jobtest.Count(t, e.pool, sql, args...)
}

// waiting is how many jobs of the test kind with tenant wait.
func (e *env) waiting(t *testing.T, tenant string) int {
	t.Helper()
	return e.count(t, `SELECT count(*) FROM river_job WHERE kind = 'policy.sync' AND args->>'tenant' = $1
		AND state IN ('available', 'scheduled', 'retryable', 'pending')`, tenant)
}

// keyRow is the enqueue_policy_keys row of the test kind's key.
func (e *env) keyRow(t *testing.T, key string) (waiting, inserted, discarded, replaced, debounced int64) {
	t.Helper()
	require.NoError(t, e.pool.QueryRow(context.Background(), `
		SELECT waiting, inserted, discarded, replaced, debounced FROM enqueue_policy_keys
		WHERE kind = 'policy.sync' AND key = $1`, key).Scan(&waiting, &inserted, &discarded, &replaced, &debounced))
	return
}

func near(t *testing.T, want, got time.Time, tolerance time.Duration) {
	t.Helper()
	require.WithinDuration(t, want, got, tolerance)
}
