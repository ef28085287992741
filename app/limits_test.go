package app_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/limiter"
)

// limitRow is a kind's limits and their sources, as a string per limit
// ("-" when unset).
func limitRow(t *testing.T, url, kind string) [3]string {
	t.Helper()
	pool := openPool(t, url)
	var out [3]string
	err := pool.QueryRow(context.Background(), `
		SELECT COALESCE(NULLIF(max_concurrency, 0)::text || '/' || max_source, COALESCE(max_concurrency::text || '/' || max_source, '-')),
		       COALESCE(key_max::text || ' by ' || array_to_string(partition_fields, ',') || '/' || key_source, '-'),
		       COALESCE(rate_max::text || ' per ' || rate_period::text || CASE WHEN rate_per_key THEN ' per key' ELSE '' END || '/' || rate_source, '-')
		FROM concurrency_limits WHERE kind = $1`, kind).Scan(&out[0], &out[1], &out[2])
	if err != nil {
		return [3]string{"none", "none", "none"}
	}
	return out
}

// TestDeclaredLimits: limits declared in Go are written at worker start; a
// limit set by the CLI (SQL) wins over the declared one across restarts
// until cleared, when the declared one applies again; a program that stops
// declaring them loses them at its next start.
func TestDeclaredLimits(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	url := testdb.New(t)
	declared := jobtest.Program()
	declared.Limits = []limiter.Limit{{
		Kind: "demo.sleep", Max: 5, ByArgs: []string{"ms"}, MaxPerKey: 1,
		Rate: &limiter.Rate{Max: 100, Per: time.Minute},
	}}
	start := func(p app.Program) {
		_, stop := startWorker(t, app.Config{DatabaseURL: url}.WithProgram(p))
		err, _ := stop()
		require.NoError(t, err)
	}

	start(declared)
	require.Equal(t, [3]string{"5/config", "1 by ms/config", "100 per 00:01:00/config"}, limitRow(t, url, "demo.sleep"))

	lim, err := limiter.New(limiter.Config{Pool: openPool(t, url)})
	require.NoError(t, err)
	require.NoError(t, lim.SetPerKey(ctx, "demo.sleep", []string{"ms"}, 3))
	require.NoError(t, lim.SetConcurrency(ctx, "demo.sleep", 0)) // the operator lifts the per-kind limit
	start(declared)
	require.Equal(t, [3]string{"0/sql", "3 by ms/sql", "100 per 00:01:00/config"}, limitRow(t, url, "demo.sleep"),
		"the operator's limits outlive a restart")

	found, err := lim.ClearLimits(ctx, "demo.sleep", limiter.Facets{PerKey: true, Concurrency: true})
	require.NoError(t, err)
	require.Equal(t, limiter.Facets{PerKey: true, Concurrency: true}, found)
	require.Equal(t, [3]string{"5/config", "1 by ms/config", "100 per 00:01:00/config"}, limitRow(t, url, "demo.sleep"),
		"cleared, the declared limits apply again")

	// The declaration changes with the program.
	declared.Limits[0].Rate = &limiter.Rate{Max: 7, Per: time.Second, PerKey: true}
	start(declared)
	require.Equal(t, [3]string{"5/config", "1 by ms/config", "7 per 00:00:01 per key/config"}, limitRow(t, url, "demo.sleep"))

	// A program that declares nothing any more.
	start(jobtest.Program())
	require.Equal(t, [3]string{"none", "none", "none"}, limitRow(t, url, "demo.sleep"))
	require.Zero(t, jobtest.Count(t, openPool(t, url), "SELECT count(*) FROM concurrency_limit_declarations"))
}

// TestDeclaredLimitsInvalid: a declared limit that cannot hold is refused
// by NewWorker, before it connects, naming the problem.
func TestDeclaredLimitsInvalid(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		limits []limiter.Limit
		want   string
	}{
		{[]limiter.Limit{{Kind: "no.such.kind", Max: 1}}, `unknown job kind "no.such.kind"`},
		{[]limiter.Limit{{Kind: "demo.sleep", ByArgs: []string{"tenant"}, MaxPerKey: 2}}, `its args have no field "tenant"`},
		{[]limiter.Limit{{Kind: "demo.sleep", MaxPerKey: 2}}, "a per-key limit needs ByArgs"},
		{[]limiter.Limit{{Kind: "demo.sleep", ByArgs: []string{"ms"}}}, "ByArgs without MaxPerKey or a per-key Rate limits nothing"},
		{[]limiter.Limit{{Kind: "demo.sleep", Rate: &limiter.Rate{Max: 0, Per: time.Second}}}, "at least 1 start per window"},
		{[]limiter.Limit{{Kind: "demo.sleep", Rate: &limiter.Rate{Max: 5, Per: 500 * time.Millisecond}}}, "the window must be at least 1s"},
		{[]limiter.Limit{{Kind: "demo.sleep", Max: 1}, {Kind: "demo.sleep", Max: 2}}, `kind "demo.sleep" is declared twice`},
		{[]limiter.Limit{{Kind: limiter.ResumeKind, Max: 1}}, "is never limited"},
	} {
		p := jobtest.Program()
		p.Limits = tc.limits
		_, err := app.NewWorker(context.Background(), app.Config{DatabaseURL: "postgres://nobody@127.0.0.1:1/none"}.WithProgram(p))
		require.ErrorContains(t, err, tc.want)
		require.ErrorIs(t, err, limiter.ErrInvalidLimit, "%v", tc.limits)
	}
}
