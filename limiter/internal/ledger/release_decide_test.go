package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/limiter/internal/ledger"
)

// TestAReleaseAndADecisionInOneTransaction: a release and the decisions
// that wait for the kind's lock behind it go in one transaction, the
// release first: the slot it frees goes to the job waiting in the line
// before the new job is decided (which then waits behind it), and with
// nobody waiting the new job takes the freed slot at once (decided before
// the release, it would have waited and been granted the slot).
func TestAReleaseAndADecisionInOneTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cases := []struct {
		name, set string
		limits    ledger.Limits
		args      [3]string // the holder's, the waiting job's, the new job's
	}{
		{"per-kind limit", "max_concurrency = 1", ledger.Limits{Max: 1},
			[3]string{`{"key": "a"}`, `{"key": "b"}`, `{"key": "c"}`}},
		// Per-key limits alone: the kind's lock shared, with the rows of
		// the keys of the release and of the decisions.
		{"per-key limit", "max_concurrency = 0, partition_fields = '{key}', key_max = 1",
			ledger.Limits{KeyMax: 1, Fields: []string{"key"}}, [3]string{`{"key": "a"}`, `{"key": "a"}`, `{"key": "a"}`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			for _, waiting := range []bool{true, false} {
				kind := "test.releasedecide." + map[bool]string{true: "line", false: "empty"}[waiting]
				pool, w1 := newLedger(t, "w1")
				setLimits(t, w1, kind, c.set)
				lim := c.limits
				lim.Kind = kind
				guess := map[string]ledger.Limits{kind: lim}
				holder := running(t, pool, kind, c.args[0], "w1", 1, time.Now().Add(-time.Second))
				require.Equal(t, ledger.Slot, decideOne(t, w1, holder, guess).Action)
				var older ledger.Job
				if waiting {
					older = running(t, pool, kind, c.args[1], "w1", 1, time.Now().Add(-time.Second))
					require.Equal(t, ledger.Wait, decideOne(t, w1, older, guess).Action, "the limit is full: it waits")
				}
				key, _ := ledger.PartitionKey([]byte(c.args[0]), lim.Fields)
				fresh := running(t, pool, kind, c.args[2], "w1", 1, time.Now())
				g, d, err := w1.ReleaseAndDecide(ctx, ledger.Release{Ended: []ledger.Held{{ID: holder.ID, Kind: kind, Key: key}}},
					[]ledger.Job{fresh}, guess, time.Second)
				require.NoError(t, err)
				require.Len(t, d.Decisions, 1)
				if waiting {
					require.Equal(t, []int64{older.ID}, g.LocalOrder, "the freed slot goes to the job waiting in the line")
					require.Equal(t, ledger.Wait, d.Decisions[0].Action, "the new job waits behind it")
				} else {
					require.Empty(t, g.LocalOrder, "nobody waited for the freed slot")
					require.Equal(t, ledger.Slot, d.Decisions[0].Action, "the new job takes the slot freed before it")
				}
			}
		})
	}
}
