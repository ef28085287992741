package settings

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/db"
)

// Settings reads dynamic settings from the settings table. Every accessor
// reads the current row, so a change made with SQL takes effect at the next
// use without a restart. A missing row yields the caller's default; a row
// whose value has the wrong type is an error that names the key.
type Settings struct {
	q *db.Queries
}

// NewSettings returns Settings reading through dbtx (a pool, connection or
// transaction).
func New(dbtx db.DBTX) *Settings {
	return &Settings{q: db.New(dbtx)}
}

// Bool reads a JSON boolean setting.
func (s *Settings) Bool(ctx context.Context, key string, def bool) (bool, error) {
	var v bool
	found, err := s.get(ctx, key, &v, "a boolean (true or false)")
	if err != nil || !found {
		return def, err
	}
	return v, nil
}

// Int reads a JSON integer setting.
func (s *Settings) Int(ctx context.Context, key string, def int64) (int64, error) {
	var v int64
	found, err := s.get(ctx, key, &v, "an integer")
	if err != nil || !found {
		return def, err
	}
	return v, nil
}

// Duration reads a setting holding a Go duration string such as "1h" or
// "90m". Negative durations are rejected.
func (s *Settings) Duration(ctx context.Context, key string, def time.Duration) (time.Duration, error) {
	var raw string
	found, err := s.get(ctx, key, &raw, `a duration string such as "1h"`)
	if err != nil || !found {
		return def, err
	}
	d, err := time.ParseDuration(raw)
	if err != nil || d < 0 {
		return def, fmt.Errorf("setting %s: want a non-negative duration string such as \"1h\", got %q", key, raw)
	}
	return d, nil
}

// Strings reads a setting holding a JSON array of strings.
func (s *Settings) Strings(ctx context.Context, key string, def []string) ([]string, error) {
	var v []string
	found, err := s.get(ctx, key, &v, "an array of strings")
	if err != nil || !found {
		return def, err
	}
	return v, nil
}

// Set writes a setting; value is marshalled to JSON.
func (s *Settings) Set(ctx context.Context, key string, value any) error {
	raw, err := json.Marshal(value)
	if err != nil {
		return fmt.Errorf("setting %s: encode value: %w", key, err)
	}
	if err := s.q.UpsertSetting(ctx, db.UpsertSettingParams{Key: key, Value: raw}); err != nil {
		return fmt.Errorf("setting %s: %w", key, err)
	}
	return nil
}

func (s *Settings) get(ctx context.Context, key string, dst any, want string) (bool, error) {
	raw, err := s.q.GetSetting(ctx, key)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read setting %s: %w", key, err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return false, fmt.Errorf("setting %s: want %s, got %s", key, want, raw)
	}
	return true, nil
}
