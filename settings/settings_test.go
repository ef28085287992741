package settings_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/settings"
)

func TestSettings(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	pool := testdb.NewPool(t)
	s := settings.New(pool)

	t.Run("missing row gives the default", func(t *testing.T) {
		t.Parallel()
		v, err := s.Int(ctx, "test.missing", 42)
		require.NoError(t, err)
		require.EqualValues(t, 42, v)
		d, err := s.Duration(ctx, "test.missing", time.Hour)
		require.NoError(t, err)
		require.Equal(t, time.Hour, d)
	})

	t.Run("read on every use", func(t *testing.T) {
		t.Parallel()
		require.NoError(t, s.Set(ctx, "test.dynamic", "2h"))
		d, err := s.Duration(ctx, "test.dynamic", time.Hour)
		require.NoError(t, err)
		require.Equal(t, 2*time.Hour, d)

		// An operator's UPDATE takes effect at the next read.
		_, err = pool.Exec(ctx, `UPDATE settings SET value = '"15m"' WHERE key = 'test.dynamic'`)
		require.NoError(t, err)
		d, err = s.Duration(ctx, "test.dynamic", time.Hour)
		require.NoError(t, err)
		require.Equal(t, 15*time.Minute, d)
	})

	t.Run("typed accessors", func(t *testing.T) {
		t.Parallel()
		require.NoError(t, s.Set(ctx, "test.bool", false))
		require.NoError(t, s.Set(ctx, "test.int", 7))
		require.NoError(t, s.Set(ctx, "test.strings", []string{"a", "b"}))
		b, err := s.Bool(ctx, "test.bool", true)
		require.NoError(t, err)
		require.False(t, b)
		i, err := s.Int(ctx, "test.int", 0)
		require.NoError(t, err)
		require.EqualValues(t, 7, i)
		ss, err := s.Strings(ctx, "test.strings", nil)
		require.NoError(t, err)
		require.Equal(t, []string{"a", "b"}, ss)
	})

	t.Run("wrong type names the key", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			key   string
			value any
			read  func(key string) error
		}{
			{"test.bad_int", "seven", func(k string) error { _, err := s.Int(ctx, k, 0); return err }},
			{"test.bad_float", 1.5, func(k string) error { _, err := s.Int(ctx, k, 0); return err }},
			{"test.bad_bool", 1, func(k string) error { _, err := s.Bool(ctx, k, false); return err }},
			{"test.bad_duration", "soon", func(k string) error { _, err := s.Duration(ctx, k, 0); return err }},
			{"test.negative_duration", "-1h", func(k string) error { _, err := s.Duration(ctx, k, 0); return err }},
			{"test.bad_duration_number", 3600, func(k string) error { _, err := s.Duration(ctx, k, 0); return err }},
			{"test.bad_strings", "a", func(k string) error { _, err := s.Strings(ctx, k, nil); return err }},
			{"test.null", nil, func(k string) error { _, err := s.Int(ctx, k, 0); return err }},
		} {
			require.NoError(t, s.Set(ctx, tc.key, tc.value))
			err := tc.read(tc.key)
			require.Error(t, err, tc.key)
			require.Contains(t, err.Error(), tc.key)
		}
	})

	t.Run("key format is enforced", func(t *testing.T) {
		t.Parallel()
		require.Error(t, s.Set(ctx, "Bad Key", 1))
	})
}
