package limiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/kinds"
	"github.com/sluice-dev/sluice/limiter/internal/ledger"
)

// Limit bounds.
const (
	// MaxByArgs is how many args fields a partition may have.
	MaxByArgs = 8
	// MinRatePeriod is the shortest rate window.
	MinRatePeriod = time.Second
	// MaxRatePeriod is the longest rate window.
	MaxRatePeriod = 24 * time.Hour
)

// Sources of a limit.
const (
	// SourceSQL: set by the CLI, a migration or any SQL. It wins over a
	// declared limit until cleared: an operator's change at runtime (an
	// incident, a partner's new quota) must outlive the next deploy, which
	// writes the declared limits again.
	SourceSQL = "sql"
	// SourceConfig: declared in Go (sluice.Config.Limits), written by every
	// worker at start; what a cleared SQL limit falls back to.
	SourceConfig = "config"
)

// ErrInvalidLimit is wrapped by the errors of limits that cannot be set as
// asked (bad values, a field the kind's args do not have, a partition that
// conflicts with the kind's other per-key limit).
var ErrInvalidLimit = errors.New("invalid limit")

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidLimit, fmt.Sprintf(format, args...))
}

// Limit is the limits of one job kind, as a program declares them in Go
// (sluice.Config.Limits). Each holds across every worker, and all of them
// at once.
type Limit struct {
	// Kind is the job kind.
	Kind string
	// Max caps the running jobs of Kind: > 0 at most Max at once, 0 no
	// per-kind limit, < 0 a circuit breaker (every job parks).
	Max int32
	// ByArgs partitions Kind by top-level args fields (JSON names): a
	// job's key is the JSON text of their values ("acme"; ["acme", 3] for
	// several fields; null for a missing field). MaxPerKey and a per-key
	// Rate use it.
	ByArgs []string
	// MaxPerKey caps the running jobs of each key (0: none). With 1, the
	// jobs of a key run one at a time, in job-id order.
	MaxPerKey int32
	// Rate caps how many jobs of Kind start in any window of Rate.Per (nil:
	// no rate limit).
	Rate *Rate
}

// Rate is a rate limit: at most Max starts in any window of Per (a sliding
// window, not fixed buckets). A start is a real execution: a job River
// moved to running that was admitted, not parked; retries count, parking
// does not.
type Rate struct {
	// Max is the starts allowed per window (> 0).
	Max int32
	// Per is the window (MinRatePeriod to MaxRatePeriod, whole
	// milliseconds).
	Per time.Duration
	// PerKey applies the rate to each key of Limit.ByArgs instead of to the
	// whole kind.
	PerKey bool
}

// String is the rate as the CLI writes it: N/DURATION.
func (r Rate) String() string { return fmt.Sprintf("%d/%s", r.Max, r.Per) }

// ParseRate parses N/DURATION (such as 100/1m or 5/1s): at most N starts in
// any window of DURATION.
func ParseRate(s string) (Rate, error) {
	n, d, ok := strings.Cut(s, "/")
	if !ok {
		return Rate{}, invalidf("rate %q: want N/DURATION, such as 100/1m or 5/1s", s)
	}
	var max int64
	if _, err := fmt.Sscan(n, &max); err != nil || fmt.Sprint(max) != strings.TrimSpace(n) || strings.TrimSpace(n) != n {
		return Rate{}, invalidf("rate %q: N must be a whole number, got %q", s, n)
	}
	per, err := time.ParseDuration(d)
	if err != nil {
		return Rate{}, invalidf("rate %q: DURATION must be a Go duration such as 1s or 1m, got %q", s, d)
	}
	if max <= 0 || max > 1<<31-1 {
		return Rate{}, invalidf("rate %q: N must be 1 to %d", s, 1<<31-1)
	}
	r := Rate{Max: int32(max), Per: per}
	if err := r.validate(); err != nil {
		return Rate{}, err
	}
	return r, nil
}

func (r Rate) validate() error {
	switch {
	case r.Max <= 0:
		return invalidf("rate %s: at least 1 start per window", r)
	case r.Per < MinRatePeriod:
		return invalidf("rate %s: the window must be at least %s", r, MinRatePeriod)
	case r.Per > MaxRatePeriod:
		return invalidf("rate %s: the window must be at most %s", r, MaxRatePeriod)
	case r.Per%time.Millisecond != 0:
		return invalidf("rate %s: the window must be whole milliseconds", r)
	}
	return nil
}

// ValidateByArgs checks fields as a partition of kind k: 1 to MaxByArgs
// distinct fields its args type has.
func ValidateByArgs(k kinds.Kind, fields []string) error {
	if len(fields) == 0 || len(fields) > MaxByArgs {
		return invalidf("--by-args of %s: want 1 to %d args fields, got %d", k.Name, MaxByArgs, len(fields))
	}
	have := k.ArgsFields()
	for i, f := range fields {
		if f == "" {
			return invalidf("--by-args of %s: an empty field name", k.Name)
		}
		if slices.Contains(fields[:i], f) {
			return invalidf("--by-args of %s: field %q given twice", k.Name, f)
		}
		if !slices.Contains(have, f) {
			return invalidf("--by-args of %s: its args have no field %q (they have: %s)", k.Name, f, strings.Join(have, ", "))
		}
	}
	return nil
}

// Validate checks the limit against the program's kinds.
func (lim Limit) Validate(registry *kinds.Registry) error {
	k, err := registry.Lookup(lim.Kind)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidLimit, err)
	}
	if lim.Kind == ResumeKind {
		return invalidf("%s is never limited", ResumeKind)
	}
	perKey := lim.MaxPerKey > 0 || (lim.Rate != nil && lim.Rate.PerKey)
	switch {
	case lim.MaxPerKey < 0:
		return invalidf("%s: MaxPerKey must not be negative, got %d", lim.Kind, lim.MaxPerKey)
	case perKey && len(lim.ByArgs) == 0:
		return invalidf("%s: a per-key limit needs ByArgs", lim.Kind)
	case !perKey && len(lim.ByArgs) > 0:
		return invalidf("%s: ByArgs without MaxPerKey or a per-key Rate limits nothing", lim.Kind)
	}
	if len(lim.ByArgs) > 0 {
		if err := ValidateByArgs(k, lim.ByArgs); err != nil {
			return err
		}
	}
	if lim.Rate != nil {
		return lim.Rate.validate()
	}
	return nil
}

// limitConfig is a kind's limits with their sources, as its row holds them.
type limitConfig struct {
	max        int32
	maxSource  *string
	fields     []string
	keyMax     *int32
	keySource  *string
	rate       *Rate
	rateSource *string
}

func configOf(row *db.LimitConfigRow) limitConfig {
	c := limitConfig{max: row.MaxConcurrency, maxSource: row.MaxSource, fields: row.PartitionFields,
		keyMax: row.KeyMax, keySource: row.KeySource, rateSource: row.RateSource}
	if row.RateMax != nil && row.RatePeriodMs > 0 {
		c.rate = &Rate{Max: *row.RateMax, Per: time.Duration(row.RatePeriodMs) * time.Millisecond, PerKey: row.RatePerKey}
	}
	return c
}

// setKeyLimit sets the per-key limit, whose partition must agree with a
// per-key rate's.
func (c *limitConfig) setKeyLimit(fields []string, n int32, source string) error {
	if c.rate != nil && c.rate.PerKey && !slices.Equal(c.fields, fields) {
		return invalidf("the per-key rate is partitioned by %s: a per-key limit must use the same fields (or clear the rate first)",
			strings.Join(c.fields, ","))
	}
	c.fields, c.keyMax, c.keySource = slices.Clone(fields), &n, &source
	return nil
}

// setRate sets the rate limit; a per-key rate's partition must agree with
// the per-key limit's.
func (c *limitConfig) setRate(r Rate, fields []string, source string) error {
	if r.PerKey && c.keyMax != nil && !slices.Equal(c.fields, fields) {
		return invalidf("the per-key limit is partitioned by %s: a per-key rate must use the same fields (or clear that limit first)",
			strings.Join(c.fields, ","))
	}
	c.rate, c.rateSource = &r, &source
	if r.PerKey {
		c.fields = slices.Clone(fields)
	} else if c.keyMax == nil {
		c.fields = nil
	}
	return nil
}

func (c *limitConfig) clearKeyLimit() {
	c.keyMax, c.keySource = nil, nil
	if c.rate == nil || !c.rate.PerKey {
		c.fields = nil
	}
}

func (c *limitConfig) clearRate() {
	c.rate, c.rateSource = nil, nil
	if c.keyMax == nil {
		c.fields = nil
	}
}

func (c limitConfig) params(kind string) db.SetLimitConfigParams {
	p := db.SetLimitConfigParams{Kind: kind, MaxConcurrency: c.max, MaxSource: c.maxSource,
		PartitionFields: c.fields, KeyMax: c.keyMax, KeySource: c.keySource, RateSource: c.rateSource}
	if c.rate != nil {
		p.RateMax, p.RatePeriodMs, p.RatePerKey = &c.rate.Max, c.rate.Per.Milliseconds(), c.rate.PerKey
	}
	return p
}

// Facets name a kind's limits, for ClearLimits.
type Facets struct {
	// Concurrency is the per-kind limit.
	Concurrency bool
	// PerKey is the per-key limit.
	PerKey bool
	// Rate is the rate limit.
	Rate bool
}

// Any reports whether any facet is named.
func (f Facets) Any() bool { return f.Concurrency || f.PerKey || f.Rate }

// SetConcurrency sets the per-kind limit of kind (> 0 limit, 0 none — an
// override of a declared limit —, < 0 circuit breaker), as SQL: it wins
// over the declared one until cleared. Raising it resumes parked jobs at
// once.
func (l *Limiter) SetConcurrency(ctx context.Context, kind string, n int32) error {
	return l.changeLimits(ctx, kind, SourceSQL, nil, func(c *limitConfig, _ *db.LimitDeclarationRow) error {
		src := SourceSQL
		c.max, c.maxSource = n, &src
		return nil
	})
}

// SetPerKey sets the per-key limit of kind: at most n running jobs per key
// of fields (validated against the kind's args by the caller:
// ValidateByArgs).
func (l *Limiter) SetPerKey(ctx context.Context, kind string, fields []string, n int32) error {
	if n <= 0 {
		return invalidf("a per-key limit must be at least 1, got %d (clear it with limits clear --per-key)", n)
	}
	return l.changeLimits(ctx, kind, SourceSQL, nil, func(c *limitConfig, _ *db.LimitDeclarationRow) error {
		return c.setKeyLimit(fields, n, SourceSQL)
	})
}

// SetRate sets the rate limit of kind, per key of fields when r.PerKey.
func (l *Limiter) SetRate(ctx context.Context, kind string, r Rate, fields []string) error {
	if err := r.validate(); err != nil {
		return err
	}
	if r.PerKey != (len(fields) > 0) {
		return invalidf("a per-key rate needs its fields, and only a per-key rate has them")
	}
	return l.changeLimits(ctx, kind, SourceSQL, nil, func(c *limitConfig, _ *db.LimitDeclarationRow) error {
		return c.setRate(r, fields, SourceSQL)
	})
}

// ClearLimits clears the facets of kind's limits (none named: all), and
// reports which it found set. A cleared facet that the program declares
// in Go falls back to the declared value; else it is gone, and the jobs it
// held are resumed at once, oldest first (as far as the kind's other
// limits let them).
func (l *Limiter) ClearLimits(ctx context.Context, kind string, which Facets) (Facets, error) {
	if !which.Any() {
		which = Facets{Concurrency: true, PerKey: true, Rate: true}
	}
	var found Facets
	err := l.changeLimits(ctx, kind, SourceSQL, nil, func(c *limitConfig, decl *db.LimitDeclarationRow) error {
		config := SourceConfig
		if which.Concurrency && (c.max != 0 || c.maxSource != nil) {
			found.Concurrency = true
			c.max, c.maxSource = 0, nil
			if decl != nil && decl.MaxConcurrency != nil && *decl.MaxConcurrency != 0 {
				c.max, c.maxSource = *decl.MaxConcurrency, &config
			}
		}
		if which.PerKey && c.keyMax != nil {
			found.PerKey = true
			c.clearKeyLimit()
			if decl != nil && decl.KeyMax != nil {
				_ = c.setKeyLimit(decl.PartitionFields, *decl.KeyMax, SourceConfig) // a conflict leaves it cleared
			}
		}
		if which.Rate && c.rate != nil {
			found.Rate = true
			c.clearRate()
			if decl != nil && decl.RateMax != nil && decl.RatePeriodMs > 0 {
				r := Rate{Max: *decl.RateMax, Per: time.Duration(decl.RatePeriodMs) * time.Millisecond, PerKey: decl.RatePerKey}
				_ = c.setRate(r, decl.PartitionFields, SourceConfig)
			}
		}
		return nil
	})
	return found, err
}

// SyncDeclared writes the limits the program declares in Go (validated) at
// worker start: each is recorded in concurrency_limit_declarations and
// applied to every facet not set by SQL; a kind of known (the program's
// kinds) that declares nothing any more loses its declared facets. Changes
// take effect as any other: raised limits resume parked jobs at once.
func (l *Limiter) SyncDeclared(ctx context.Context, limits []Limit, known []string) error {
	declared := map[string]bool{}
	for _, lim := range limits {
		declared[lim.Kind] = true
		if err := l.applyDeclared(ctx, lim, true); err != nil {
			return fmt.Errorf("declared limits of %s: %w", lim.Kind, err)
		}
	}
	for _, kind := range known {
		if declared[kind] || kind == ResumeKind {
			continue
		}
		n, err := l.q.DeleteLimitDeclaration(ctx, kind)
		if err != nil {
			return fmt.Errorf("forget the declared limits of %s: %w", kind, err)
		}
		if n == 0 {
			continue
		}
		if err := l.applyDeclared(ctx, Limit{Kind: kind}, false); err != nil {
			return fmt.Errorf("declared limits of %s: %w", kind, err)
		}
	}
	return nil
}

// applyDeclared applies lim to every facet of its kind not set by SQL
// (record: recording lim as the kind's declaration first).
func (l *Limiter) applyDeclared(ctx context.Context, lim Limit, record bool) error {
	var declare *Limit
	if record {
		declare = &lim
	}
	return l.changeLimits(ctx, lim.Kind, SourceConfig, declare, func(c *limitConfig, _ *db.LimitDeclarationRow) error {
		config := SourceConfig
		isConfig := func(src *string) bool { return src == nil || *src == SourceConfig }
		if isConfig(c.maxSource) {
			c.max, c.maxSource = lim.Max, &config
			if lim.Max == 0 {
				c.maxSource = nil
			}
		}
		if isConfig(c.keySource) {
			c.clearKeyLimit()
			if lim.MaxPerKey > 0 {
				if err := c.setKeyLimit(lim.ByArgs, lim.MaxPerKey, SourceConfig); err != nil {
					l.logger.Warn("declared per-key limit not applied: a limit set by SQL wins", "kind", lim.Kind, "error", err)
				}
			}
		}
		if isConfig(c.rateSource) {
			c.clearRate()
			if lim.Rate != nil {
				var fields []string
				if lim.Rate.PerKey {
					fields = lim.ByArgs
				}
				if err := c.setRate(*lim.Rate, fields, SourceConfig); err != nil {
					l.logger.Warn("declared rate limit not applied: a limit set by SQL wins", "kind", lim.Kind, "error", err)
				}
			}
		}
		return nil
	})
}

// changeLimits changes kind's limits in one ledger transaction
// (ledger.Change, which holds the kind's lock): it records declare, when
// given, as the kind's declaration (a worker writing its declared limits),
// makes sure the kind has a limit row, lets change edit the limits (decl:
// the limits the program declares for kind, nil: none) and writes them;
// the ledger then sets the keys of the kind's slots and waiting jobs again
// when the partition changed, and lets the line go (no limit left) or
// gives the new room to its front. The safety net is scheduled in the same
// transaction while jobs of the kind still wait.
func (l *Limiter) changeLimits(ctx context.Context, kind, source string, declare *Limit,
	change func(c *limitConfig, decl *db.LimitDeclarationRow) error) error {
	edit := func(tx *ledger.Tx) error {
		ctx, q := tx.Context(), tx.Queries()
		if err := q.SetLimitSource(ctx, source); err != nil {
			return fmt.Errorf("limit source: %w", err)
		}
		if declare != nil {
			if err := q.UpsertLimitDeclaration(ctx, declarationParams(*declare, l.workerID)); err != nil {
				return fmt.Errorf("record the declared limits: %w", err)
			}
		}
		if err := q.EnsureLimitRow(ctx, kind); err != nil {
			return fmt.Errorf("limit row: %w", err)
		}
		row, err := q.LimitConfig(ctx, kind)
		if err != nil {
			return fmt.Errorf("read the limits: %w", err)
		}
		var decl *db.LimitDeclarationRow
		switch d, err := q.LimitDeclaration(ctx, kind); {
		case err == nil:
			decl = d
		case !errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("read the declared limits: %w", err)
		}
		cfg := configOf(row)
		if err := change(&cfg, decl); err != nil {
			return err
		}
		if err := q.SetLimitConfig(ctx, cfg.params(kind)); err != nil {
			return fmt.Errorf("write the limits: %w", err)
		}
		return nil
	}
	then := func(tx *ledger.Tx, lim ledger.Limits) error {
		if lim.Regime() == ledger.Unlimited {
			return nil
		}
		return l.scheduleSafetyNet(tx, kind)
	}
	g, err := l.ledger.Change(ctx, kind, edit, then)
	if err != nil {
		if errors.Is(err, ErrInvalidLimit) {
			return err
		}
		return fmt.Errorf("change the limits of %s: %w", kind, err)
	}
	l.granted(g)
	return nil
}

// scheduleSafetyNet inserts concurrency_limit.resume for kind in the
// change's transaction while jobs of its line still wait (one at a time:
// the job is unique by args until it ends), when the limiter has a River
// client.
func (l *Limiter) scheduleSafetyNet(tx *ledger.Tx, kind string) error {
	client := l.client.Load()
	if client == nil {
		return nil
	}
	waiting, err := tx.LineLeft(kind)
	if err != nil || !waiting {
		return err
	}
	if _, err := client.InsertTx(tx.Context(), tx.Pgx(), ResumeArgs{JobKind: kind}, nil); err != nil {
		return fmt.Errorf("schedule %s: %w", ResumeKind, err)
	}
	return nil
}

func declarationParams(lim Limit, workerID string) db.UpsertLimitDeclarationParams {
	p := db.UpsertLimitDeclarationParams{Kind: lim.Kind, DeclaredBy: &workerID}
	if lim.Max != 0 {
		p.MaxConcurrency = &lim.Max
	}
	if len(lim.ByArgs) > 0 {
		p.PartitionFields = lim.ByArgs
	}
	if lim.MaxPerKey > 0 {
		p.KeyMax = &lim.MaxPerKey
	}
	if lim.Rate != nil {
		p.RateMax, p.RatePeriodMs, p.RatePerKey = &lim.Rate.Max, lim.Rate.Per.Milliseconds(), lim.Rate.PerKey
	}
	return p
}
