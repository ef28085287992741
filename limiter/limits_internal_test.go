package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/limiter/internal/ledger"
)

// TestHeldAsNamesOnlyTheLimitsHeld: a grant made under the limits the
// worker's copy holds is stamped with the changes the copy holds; one made
// under other limits (a change the copy has not read, or one it read
// since) is not, nor is one checked against a copy kept when a read failed
// (its changes not known).
func TestHeldAsNamesOnlyTheLimitsHeld(t *testing.T) {
	ctx := context.Background()
	held := ledger.Limits{Kind: "k", Present: true, Fields: []string{"tenant"}, KeyMax: 2, RateMax: 3,
		RatePeriod: time.Second, RatePerKey: true, Admitted: 4}
	c := &limitsCopy{}
	c.gen.Store(7)
	c.cur.Store(&limitsSnapshot{kinds: map[string]ledger.Limits{"k": held}, loaded: time.Now(), gen: 6})

	counted := held
	counted.Admitted, counted.HasParked = 9, true // counts are not settings
	require.Equal(t, uint64(6), c.heldAs(ctx, "k", counted.Tag()))

	for name, other := range map[string]func(l *ledger.Limits){
		"max":      func(l *ledger.Limits) { l.Max = 1 },
		"fields":   func(l *ledger.Limits) { l.Fields = []string{"user"} },
		"key max":  func(l *ledger.Limits) { l.KeyMax = 3 },
		"rate":     func(l *ledger.Limits) { l.RateMax = 4 },
		"period":   func(l *ledger.Limits) { l.RatePeriod = 2 * time.Second },
		"per kind": func(l *ledger.Limits) { l.RatePerKey = false },
		"no row":   func(l *ledger.Limits) { *l = ledger.Limits{Kind: "k"} },
	} {
		l := held
		other(&l)
		require.Zero(t, c.heldAs(ctx, "k", l.Tag()), name)
	}
	require.Equal(t, uint64(6), c.heldAs(ctx, "none", ledger.Limits{Kind: "none"}.Tag()), "a kind without a row, as held")
	require.Zero(t, c.heldAs(ctx, "k", ""), "no tag")

	c.cur.Store(&limitsSnapshot{kinds: map[string]ledger.Limits{"k": held}, loaded: time.Now()})
	require.Zero(t, c.heldAs(ctx, "k", held.Tag()), "a copy whose changes are not known")
}
