package policy

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/pgkit"
)

// Sources of a policy's definition (enqueue_policies.source).
const (
	// SourceSQL is a definition an operator wrote: the CLI or any SQL. It
	// wins over a declaration of the same kind until Reset.
	SourceSQL = "sql"
	// SourceConfig is a definition declared in Go (Config.Policies) and
	// written by a worker at start.
	SourceConfig = "config"
)

// Store reads and writes the enqueue policies.
type Store struct {
	pool *pgxpool.Pool
}

// NewStore returns a Store on pool (whose search_path has sluice's schema
// first, as pgkit.Open sets it).
func NewStore(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// Row is a policy in force, with who wrote it.
type Row struct {
	Policy
	// Source is SourceSQL or SourceConfig.
	Source    string
	UpdatedAt time.Time
}

// Key is one key of a kind with a policy: its waiting jobs and the
// outcomes of the inserts committed (rejected ones are not counted: their
// error rolls the count back with the insert).
type Key struct {
	Kind string `json:"kind"`
	// Key is the JSON text of the key's args fields ("" with no --by-args).
	Key        string     `json:"key"`
	Waiting    int32      `json:"waiting"`
	MaxWaiting *int32     `json:"max_waiting"`
	OnConflict *string    `json:"on_conflict"`
	Inserted   int64      `json:"inserted"`
	Discarded  int64      `json:"discarded"`
	Replaced   int64      `json:"replaced"`
	Debounced  int64      `json:"debounced"`
	LastAt     *time.Time `json:"last_enqueue_at"`
}

// Outcome is the count of one outcome of one kind's inserts.
type Outcome struct {
	Kind    string
	Outcome string
	Count   int64
}

// Set writes p (validated against no registry: the caller checks the kind)
// as an operator's policy: it wins over a declaration until Reset.
func (s *Store) Set(ctx context.Context, p Policy) error {
	if err := p.Validate(nil); err != nil {
		return err
	}
	if err := db.New(s.pool).SetEnqueuePolicy(ctx, setParams(p)); err != nil {
		return fmt.Errorf("write the enqueue policy of %s: %w", p.Kind, err)
	}
	return nil
}

// Clear takes kind's policy out of force and forgets its keys' counts. A
// policy declared in Go stays as a row out of force (the operator's change
// wins until Reset); any other is deleted. It reports whether there was a
// policy in force.
func (s *Store) Clear(ctx context.Context, kind string) (bool, error) {
	var n int64
	err := pgkit.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		q := db.New(tx)
		declared, err := q.PolicyDeclared(ctx, kind)
		if err != nil {
			return fmt.Errorf("look up the declared policy of %s: %w", kind, err)
		}
		if declared {
			n, err = q.DisableEnqueuePolicy(ctx, kind)
		} else {
			n, err = q.DeleteEnqueuePolicy(ctx, kind)
		}
		if err != nil {
			return fmt.Errorf("clear the enqueue policy of %s: %w", kind, err)
		}
		if _, err := q.DeleteEnqueuePolicyCounts(ctx, kind); err != nil {
			return fmt.Errorf("forget the counts of %s: %w", kind, err)
		}
		return nil
	})
	return n > 0, err
}

// List returns the policies in force, by kind.
func (s *Store) List(ctx context.Context) ([]Row, error) {
	rows, err := db.New(s.pool).ListEnqueuePolicies(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the enqueue policies: %w", err)
	}
	out := make([]Row, 0, len(rows))
	for _, r := range rows {
		out = append(out, Row{
			Policy: Policy{
				Kind: r.Kind, ByArgs: r.ByArgs, MaxWaiting: r.MaxWaiting, OnConflict: OnConflict(r.OnConflict),
				Debounce: time.Duration(r.DebounceMs) * time.Millisecond, MaxDelay: time.Duration(r.MaxDelayMs) * time.Millisecond,
				KeepScheduledAt: r.KeepScheduledAt,
			},
			Source: r.Source, UpdatedAt: r.UpdatedAt,
		})
	}
	return out, nil
}

// Keys returns kind's keys, the fullest first: at most limit of them (0:
// all).
func (s *Store) Keys(ctx context.Context, kind string, limit int32) ([]Key, error) {
	params := db.EnqueuePolicyKeysParams{Kind: kind}
	if limit > 0 {
		params.MaxRows = &limit
	}
	rows, err := db.New(s.pool).EnqueuePolicyKeys(ctx, params)
	if err != nil {
		return nil, fmt.Errorf("read the keys of %s: %w", kind, err)
	}
	out := make([]Key, 0, len(rows))
	for _, r := range rows {
		last := r.LastEnqueueAt
		out = append(out, Key{
			Kind: r.Kind, Key: r.Key, Waiting: r.Waiting, MaxWaiting: r.MaxWaiting, OnConflict: r.OnConflict,
			Inserted: r.Inserted, Discarded: r.Discarded, Replaced: r.Replaced, Debounced: r.Debounced, LastAt: &last,
		})
	}
	return out, nil
}

// Outcomes returns the outcomes counted per kind.
func (s *Store) Outcomes(ctx context.Context) ([]Outcome, error) {
	return ReadOutcomes(ctx, db.New(s.pool))
}

// ReadOutcomes returns the outcomes counted per kind, through q.
func ReadOutcomes(ctx context.Context, q *db.Queries) ([]Outcome, error) {
	rows, err := q.EnqueuePolicyOutcomes(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the enqueue outcomes: %w", err)
	}
	out := make([]Outcome, 0, len(rows))
	for _, r := range rows {
		out = append(out, Outcome{Kind: r.Kind, Outcome: r.Outcome, Count: r.Count})
	}
	return out, nil
}

// setParams are p's columns as SetEnqueuePolicy takes them.
func setParams(p Policy) db.SetEnqueuePolicyParams {
	debounce, maxDelay := millis(p)
	return db.SetEnqueuePolicyParams{
		Kind: p.Kind, ByArgs: byArgs(p.ByArgs), MaxWaiting: p.MaxWaiting, OnConflict: string(p.OnConflict),
		DebounceMs: debounce, MaxDelayMs: maxDelay, KeepScheduledAt: p.KeepScheduledAt,
	}
}

// millis are p's debounce and max delay in milliseconds (nil: none).
func millis(p Policy) (debounce, maxDelay *float64) {
	if p.OnConflict != Debounce {
		return nil, nil
	}
	d, m := float64(p.Debounce.Milliseconds()), float64(p.MaxDelay.Milliseconds())
	return &d, &m
}

// byArgs is nil (SQL NULL) for no fields.
func byArgs(fields []string) []string {
	if len(fields) == 0 {
		return nil
	}
	return fields
}
