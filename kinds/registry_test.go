package kinds_test

import (
	"errors"
	"testing"

	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/kinds"
	"github.com/sluice-dev/sluice/modules/demo"
	"github.com/stretchr/testify/require"
)

func TestRegistryDecode(t *testing.T) {
	t.Parallel()

	registry := jobtest.Registry(t)

	args, err := registry.Decode("demo.sleep", []byte(`{"ms": 10, "ignore_cancel": true}`))
	require.NoError(t, err)
	require.Equal(t, demo.SleepArgs{MS: 10, IgnoreCancel: true}, args)

	args, err = registry.Decode("demo.sleep", nil)
	require.NoError(t, err, "no args means {}")
	require.Equal(t, demo.SleepArgs{}, args)

	for _, tc := range []struct {
		name, kind, raw, want string
	}{
		{"unknown kind", "demo.slep", `{}`, `unknown job kind "demo.slep"`},
		{"not an object", "demo.sleep", `[1]`, "must be a JSON object"},
		{"truncated", "demo.sleep", `{"ms": 1`, "malformed JSON"},
		{"syntax", "demo.sleep", `{"ms": 1,}`, "malformed JSON"},
		{"trailing data", "demo.sleep", `{"ms": 1} {}`, "after the args object"},
		{"unknown field", "demo.sleep", `{"sleep": 1}`, `unknown field "sleep"`},
		{"wrong type", "demo.sleep", `{"ms": "10"}`, `field "ms"`},
		{"fraction", "demo.sleep", `{"ms": 1.5}`, `field "ms"`},
		{"negative", "demo.sleep", `{"ms": -1}`, `field "ms": must be between 0`},
		{"too large", "demo.sleep", `{"ms": 86400001}`, `field "ms": must be between 0`},
		{"overflow", "demo.sleep", `{"ms": 99999999999999999999}`, `field "ms"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := registry.Decode(tc.kind, []byte(tc.raw))
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
			var unknown *kinds.UnknownKindError
			var argsErr *kinds.ArgsError
			require.True(t, errors.As(err, &unknown) || errors.As(err, &argsErr), "typed error: %T", err)
		})
	}
}
