package policy_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/policy"
)

func TestValidate(t *testing.T) {
	t.Parallel()
	registry := jobtest.Registry(t)
	good := policy.Policy{Kind: "demo.sleep", ByArgs: []string{"ms"}, MaxWaiting: 1, OnConflict: policy.Discard}
	require.NoError(t, good.Validate(registry))
	debounce := policy.Policy{Kind: "demo.sleep", MaxWaiting: 1, OnConflict: policy.Debounce, Debounce: time.Second, MaxDelay: time.Minute}
	require.NoError(t, debounce.Validate(registry))

	for name, p := range map[string]policy.Policy{
		"unknown kind":        {Kind: "no.such", MaxWaiting: 1, OnConflict: policy.Discard},
		"unknown field":       {Kind: "demo.sleep", ByArgs: []string{"nope"}, MaxWaiting: 1, OnConflict: policy.Discard},
		"field twice":         {Kind: "demo.sleep", ByArgs: []string{"ms", "ms"}, MaxWaiting: 1, OnConflict: policy.Discard},
		"zero cap":            {Kind: "demo.sleep", MaxWaiting: 0, OnConflict: policy.Discard},
		"bad answer":          {Kind: "demo.sleep", MaxWaiting: 1, OnConflict: "drop"},
		"debounce w/o delays": {Kind: "demo.sleep", MaxWaiting: 1, OnConflict: policy.Debounce},
		"max delay too short": {Kind: "demo.sleep", MaxWaiting: 1, OnConflict: policy.Debounce, Debounce: time.Minute, MaxDelay: time.Second},
		"delays w/o debounce": {Kind: "demo.sleep", MaxWaiting: 1, OnConflict: policy.Replace, Debounce: time.Second, MaxDelay: time.Minute},
		"sub-millisecond":     {Kind: "demo.sleep", MaxWaiting: 1, OnConflict: policy.Debounce, Debounce: time.Microsecond, MaxDelay: time.Second},
		"keep w/o replace":    {Kind: "demo.sleep", MaxWaiting: 1, OnConflict: policy.Discard, KeepScheduledAt: true},
	} {
		require.ErrorIs(t, p.Validate(registry), policy.ErrInvalid, name)
	}
}
