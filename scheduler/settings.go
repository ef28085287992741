package scheduler

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/riverqueue/river"

	"github.com/sluice-dev/sluice/kinds"
	"github.com/sluice-dev/sluice/settings"
)

// Dynamic settings of the scheduler (rows of the settings table, inserted
// with these defaults by migration 00002). They are read when a dispatch
// needs them, so an UPDATE takes effect at the next dispatch.
const (
	// SettingRetryBackoffBase is the delay before the first retry of a
	// failed dispatch; each further consecutive failure doubles it.
	SettingRetryBackoffBase = "scheduler.retry_backoff_base"
	// SettingRetryBackoffCap caps the delay between retries.
	SettingRetryBackoffCap = "scheduler.retry_backoff_cap"
	// SettingRunAllCap is how many missed runs misfire=run_all inserts at
	// most after downtime (the most recent ones).
	SettingRunAllCap = "scheduler.run_all_cap"
	// SettingMisfireGrace is how late a due time may be dispatched under
	// misfire=skip.
	SettingMisfireGrace = "scheduler.misfire_grace"
)

// Defaults of the settings.
const (
	DefaultRetryBackoffBase = 5 * time.Second
	DefaultRetryBackoffCap  = 5 * time.Minute
	DefaultRunAllCap        = 100
	DefaultMisfireGrace     = time.Minute
	// MaxRunAllCap bounds scheduler.run_all_cap.
	MaxRunAllCap = scanLimit
)

// SettingDefaults are the settings' defaults as the settings table stores
// them (JSON values), for the migration test.
var SettingDefaults = map[string]string{
	SettingRetryBackoffBase: `"5s"`,
	SettingRetryBackoffCap:  `"5m"`,
	SettingRunAllCap:        `100`,
	SettingMisfireGrace:     `"1m"`,
}

// dispatchSettings reads the settings lazily, once per dispatch batch. A
// setting that cannot be read or is out of range falls back to its default
// with a logged error: a bad setting must not stop schedules.
type dispatchSettings struct {
	ctx      context.Context
	settings *settings.Settings
	logger   *slog.Logger

	base, maxDelay, grace *time.Duration
	runAllCap             *int

	// decoded holds the args decoded during the tick, by kind and args
	// text: schedules with the same args (a kind's `{}`, or thousands of
	// schedules of one kind due together) are decoded and validated once.
	decoded map[argsKey]decodedArgs
}

// argsKey is a kind and the text of its args, as Postgres returns jsonb.
type argsKey struct{ kind, args string }

// decodedArgs is what decodeArgs returned for an argsKey.
type decodedArgs struct {
	args river.JobArgs
	err  error
}

// decode is decodeArgs, once per kind and args text in the tick: the
// decoded value is only read (marshalled by River's insert), never changed,
// so the jobs of several schedules can share it.
func (s *dispatchSettings) decode(registry *kinds.Registry, kind string, args []byte) (river.JobArgs, error) {
	key := argsKey{kind, string(args)}
	if d, ok := s.decoded[key]; ok {
		return d.args, d.err
	}
	jobArgs, err := decodeArgs(registry, kind, args)
	if s.decoded == nil {
		s.decoded = map[argsKey]decodedArgs{}
	}
	s.decoded[key] = decodedArgs{jobArgs, err}
	return jobArgs, err
}

func (s *dispatchSettings) duration(key string, def time.Duration, dst **time.Duration) time.Duration {
	if *dst != nil {
		return **dst
	}
	v, err := s.settings.Duration(s.ctx, key, def)
	if err == nil && v <= 0 && key != SettingMisfireGrace {
		err = fmt.Errorf("setting %s: must be positive, got %s", key, v)
	}
	if err != nil {
		s.logger.Error("scheduler setting unusable: using its default", "key", key, "default", def.String(), "error", err)
		v = def
	}
	*dst = &v
	return v
}

// backoff is the delay before retry number failures (1 for the first).
func (s *dispatchSettings) backoff(failures int) time.Duration {
	base := s.duration(SettingRetryBackoffBase, DefaultRetryBackoffBase, &s.base)
	maxDelay := s.duration(SettingRetryBackoffCap, DefaultRetryBackoffCap, &s.maxDelay)
	return Backoff(base, maxDelay, failures)
}

func (s *dispatchSettings) misfireGrace() time.Duration {
	return s.duration(SettingMisfireGrace, DefaultMisfireGrace, &s.grace)
}

func (s *dispatchSettings) runAllLimit() int {
	if s.runAllCap != nil {
		return *s.runAllCap
	}
	v, err := s.settings.Int(s.ctx, SettingRunAllCap, DefaultRunAllCap)
	if err == nil && (v < 1 || v > MaxRunAllCap) {
		err = fmt.Errorf("setting %s: want 1 to %d, got %d", SettingRunAllCap, MaxRunAllCap, v)
	}
	if err != nil {
		s.logger.Error("scheduler setting unusable: using its default", "key", SettingRunAllCap, "default", DefaultRunAllCap, "error", err)
		v = DefaultRunAllCap
	}
	n := int(v)
	s.runAllCap = &n
	return n
}

// Backoff returns base * 2^(failures-1), capped at maxDelay, for any
// number of failures and any cap (the doubling stops before it could
// overflow).
func Backoff(base, maxDelay time.Duration, failures int) time.Duration {
	d := base
	for i := 1; i < failures; i++ {
		if d >= maxDelay/2 {
			return maxDelay
		}
		d *= 2
	}
	return min(d, maxDelay)
}
