package policy

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/internal/pgkit"
)

// DeclaredSync is what SyncDeclared changed, by kind.
type DeclaredSync struct {
	// Written are the declared policies written into their rows (new, or
	// following their declaration to a new definition).
	Written []string
	// Kept are the declared policies an operator changed (or cleared):
	// they stay as the operator left them until `sluice policy reset`.
	Kept []string
	// Removed are the policies no longer declared whose row still followed
	// its declaration; they are deleted.
	Removed []string
}

// NotDeclaredError reports a `policy reset` of a kind no program has
// declared a policy for.
type NotDeclaredError struct{ Kind string }

// Error describes the error.
func (e *NotDeclaredError) Error() string {
	return fmt.Sprintf("no enqueue policy of %s is declared in Go (Config.Policies of a program whose worker has started): nothing to reset it to", e.Kind)
}

// SyncDeclared writes the program's declared policies (each validated
// beforehand) in one transaction: each is recorded in
// enqueue_policy_declarations and written into its enqueue_policies row
// unless an operator changed that row (source sql); declarations the
// program no longer makes are forgotten, and their rows removed if they
// still followed them. declaredBy names the worker. Two workers starting
// at once write one after the other.
func (s *Store) SyncDeclared(ctx context.Context, policies []Policy, declaredBy string) (DeclaredSync, error) {
	var out DeclaredSync
	err := s.inDeclarationsTx(ctx, func(q *db.Queries) error {
		kinds := make([]string, 0, len(policies))
		for _, p := range policies {
			if err := p.Validate(nil); err != nil {
				return err
			}
			kinds = append(kinds, p.Kind)
			debounce, maxDelay := millis(p)
			by := declaredBy
			if err := q.UpsertPolicyDeclaration(ctx, db.UpsertPolicyDeclarationParams{
				Kind: p.Kind, ByArgs: byArgs(p.ByArgs), MaxWaiting: p.MaxWaiting, OnConflict: string(p.OnConflict),
				DebounceMs: debounce, MaxDelayMs: maxDelay, KeepScheduledAt: p.KeepScheduledAt, DeclaredBy: &by,
			}); err != nil {
				return fmt.Errorf("record the declared policy of %s: %w", p.Kind, err)
			}
			written, err := q.WriteDeclaredPolicy(ctx, db.WriteDeclaredPolicyParams{Kind: p.Kind})
			if err != nil {
				return fmt.Errorf("write the declared policy of %s: %w", p.Kind, err)
			}
			if len(written) == 1 {
				out.Written = append(out.Written, p.Kind)
			}
		}
		stale, err := q.DeleteStalePolicyDeclarations(ctx, kinds)
		if err != nil {
			return fmt.Errorf("forget policies no longer declared: %w", err)
		}
		if len(stale) > 0 {
			if out.Removed, err = q.DeleteDeclaredPolicies(ctx, stale); err != nil {
				return fmt.Errorf("remove policies no longer declared: %w", err)
			}
		}
		rows, err := q.ListOperatorPolicies(ctx, kinds)
		if err != nil {
			return fmt.Errorf("read the policies an operator changed: %w", err)
		}
		out.Kept = rows
		return nil
	})
	return out, err
}

// Reset writes the declared policy of kind back into its row, undoing any
// change by the CLI or SQL (a clear too): its source is config again.
func (s *Store) Reset(ctx context.Context, kind string) error {
	return s.inDeclarationsTx(ctx, func(q *db.Queries) error {
		declared, err := q.PolicyDeclared(ctx, kind)
		if err != nil {
			return fmt.Errorf("look up the declared policy of %s: %w", kind, err)
		}
		if !declared {
			return &NotDeclaredError{Kind: kind}
		}
		if _, err := q.WriteDeclaredPolicy(ctx, db.WriteDeclaredPolicyParams{Kind: kind, Force: true}); err != nil {
			return fmt.Errorf("reset the policy of %s: %w", kind, err)
		}
		return nil
	})
}

// inDeclarationsTx runs fn in a transaction holding
// enqueue_policy_declarations locked against other writers, whose policy
// changes have source config.
func (s *Store) inDeclarationsTx(ctx context.Context, fn func(q *db.Queries) error) error {
	return pgkit.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		q := db.New(tx)
		if err := q.LockPolicyDeclarations(ctx); err != nil {
			return fmt.Errorf("lock policy declarations: %w", err)
		}
		if err := q.SetPolicySource(ctx, SourceConfig); err != nil {
			return fmt.Errorf("set policy source: %w", err)
		}
		return fn(q)
	})
}
