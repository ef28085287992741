package policy_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/policy"
)

// Declared policies follow the schedules' rule: written at start, an
// operator's change (a clear too) wins until Reset, a policy no longer
// declared goes unless an operator changed it.
func TestDeclaredPolicies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	declared := []policy.Policy{
		{Kind: "policy.sync", ByArgs: []string{"tenant"}, MaxWaiting: 1, OnConflict: policy.Discard},
		{Kind: "policy.other", MaxWaiting: 3, OnConflict: policy.Reject},
	}
	res, err := e.store.SyncDeclared(ctx, declared, "w1")
	require.NoError(t, err)
	require.Equal(t, []string{"policy.sync", "policy.other"}, res.Written)
	rows, err := e.store.List(ctx)
	require.NoError(t, err)
	require.Len(t, rows, 2)
	require.Equal(t, policy.SourceConfig, rows[0].Source)

	// The operator changes one and clears the other: both survive a restart.
	e.set(t, policy.Policy{ByArgs: []string{"tenant"}, MaxWaiting: 5, OnConflict: policy.Replace})
	cleared, err := e.store.Clear(ctx, "policy.other")
	require.NoError(t, err)
	require.True(t, cleared)
	res, err = e.store.SyncDeclared(ctx, declared, "w2")
	require.NoError(t, err)
	require.Empty(t, res.Written)
	require.ElementsMatch(t, []string{"policy.sync", "policy.other"}, res.Kept)
	rows, err = e.store.List(ctx)
	require.NoError(t, err)
	require.Len(t, rows, 1, "the cleared one stays off")
	require.Equal(t, int32(5), rows[0].MaxWaiting)
	require.Equal(t, policy.SourceSQL, rows[0].Source)

	// Reset writes the declarations back.
	require.NoError(t, e.store.Reset(ctx, "policy.sync"))
	require.NoError(t, e.store.Reset(ctx, "policy.other"))
	rows, err = e.store.List(ctx)
	require.NoError(t, err)
	require.Len(t, rows, 2)
	for _, r := range rows {
		require.Equal(t, policy.SourceConfig, r.Source, r.Kind)
	}
	var notDeclared *policy.NotDeclaredError
	require.True(t, errors.As(e.store.Reset(ctx, "policy.none"), &notDeclared))

	// No longer declared: removed (it followed its declaration).
	res, err = e.store.SyncDeclared(ctx, declared[:1], "w3")
	require.NoError(t, err)
	require.Equal(t, []string{"policy.other"}, res.Removed)

	// A bad declaration writes nothing.
	_, err = e.store.SyncDeclared(ctx, []policy.Policy{{Kind: "policy.sync", MaxWaiting: 0, OnConflict: policy.Discard}}, "w4")
	require.ErrorIs(t, err, policy.ErrInvalid)
	rows, err = e.store.List(ctx)
	require.NoError(t, err)
	require.Len(t, rows, 1)
}

// A worker writes the program's declared policies at start (source
// config), and refuses bad ones before anything runs.
func TestWorkerWritesDeclaredPolicies(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	url := testdb.New(t)
	workers := river.NewWorkers()
	river.AddWorkerArgs(workers, loadArgs{K: "replace"}, &loadRecorder{})
	cfg := app.Config{
		Workers: workers, DatabaseURL: url, ID: "policy-declared", Logger: jobtest.Logger(t),
		Queues:   map[string]int{river.QueueDefault: 1},
		Policies: []policy.Policy{{Kind: "policy.load.replace", ByArgs: []string{"key"}, MaxWaiting: 2, OnConflict: policy.Replace}},
	}

	bad := cfg
	bad.Policies = []policy.Policy{{Kind: "policy.load.replace", ByArgs: []string{"nope"}, MaxWaiting: 1, OnConflict: policy.Discard}}
	_, err := app.NewWorker(ctx, bad)
	require.ErrorIs(t, err, policy.ErrInvalid)
	require.ErrorContains(t, err, `its args have no field "nope"`)

	w, err := app.NewWorker(ctx, cfg)
	require.NoError(t, err)
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- w.RunNotify(ctx, func() { close(started) }) }()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("worker: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("worker did not start")
	}
	pool, err := pgkit.Open(ctx, url, 10*time.Second)
	require.NoError(t, err)
	defer pool.Close()
	rows, err := policy.NewStore(pool).List(ctx)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.Equal(t, policy.SourceConfig, rows[0].Source)
	require.Equal(t, int32(2), rows[0].MaxWaiting)
	cancel()
	<-done
}
