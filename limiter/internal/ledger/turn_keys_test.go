package ledger_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/limiter/internal/ledger"
)

// TestARoundReadsKeysPastItsFirstWhenItNeedsThem: under a per-kind limit
// over keys, a release's grant round reads only the first keys waiting in
// the round's order (a few more than twice the slots it frees). When those
// fill its room it gives the slot as a read of every key would: to the key
// that came first. When none of them can take the slot (each held up by
// an older job of its key fetched elsewhere and not decided yet), it reads
// the keys again, all of them, and the slot goes to the first key that can
// take it, past those read first.
func TestARoundReadsKeysPastItsFirstWhenItNeedsThem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const keys = 10 // more than a release of one slot reads first
	guess := func(kind string) map[string]ledger.Limits {
		return map[string]ledger.Limits{kind: {Kind: kind, Max: 1, KeyMax: 1, Fields: []string{"key"}}}
	}
	// setUp fills kind's one slot with a job of key h, then has one job of
	// each of keys k0…k9 wait in w1 for it, in that order; the first held
	// of them each have an older job of their key fetched by w2 and not
	// decided yet. It returns the holder and the waiting jobs.
	setUp := func(t *testing.T, kind string, held int) (*ledger.Ledger, ledger.Job, []ledger.Job) {
		pool, w1 := newLedger(t, "w1")
		w2 := ledger.New(ledger.Config{Pool: pool, WorkerID: "w2"})
		setLimits(t, w1, kind, "max_concurrency = 1, partition_fields = '{key}', key_max = 1")
		holder := running(t, pool, kind, `{"key": "h"}`, "w1", 1, time.Now().Add(-time.Second))
		require.Equal(t, ledger.Slot, decideOne(t, w1, holder, guess(kind)).Action)
		var waiting []ledger.Job
		var olders []ledger.Fetched
		for i := range keys {
			args := fmt.Sprintf(`{"key": "k%d"}`, i)
			if i < held {
				older := running(t, pool, kind, args, "w2", 1, time.Now())
				olders = append(olders, ledger.Fetched{ID: older.ID, Kind: kind, Key: fmt.Sprintf(`"k%d"`, i)})
			}
			j := running(t, pool, kind, args, "w1", 1, time.Now())
			require.Equal(t, ledger.Wait, decideOne(t, w1, j, guess(kind)).Action, "the limit is full: it waits")
			waiting = append(waiting, j)
		}
		// Marked last, together: a fetch mark holds a key for 2 s, and
		// the set-up can take longer than that on a busy machine.
		require.NoError(t, w2.MarkFetched(ctx, pool, olders))
		return w1, holder, waiting
	}

	t.Run("filled by the first", func(t *testing.T) {
		t.Parallel()
		const kind = "test.turnkeys.first"
		w1, holder, waiting := setUp(t, kind, 0)
		g, err := w1.Release(ctx, ledger.Release{Ended: []ledger.Held{{ID: holder.ID, Kind: kind, Key: `"h"`}}}, guess(kind))
		require.NoError(t, err)
		require.Equal(t, []int64{waiting[0].ID}, g.LocalOrder, "the slot goes to the key that came first")
	})

	t.Run("past the first", func(t *testing.T) {
		t.Parallel()
		const kind = "test.turnkeys.past"
		w1, holder, waiting := setUp(t, kind, keys-1)
		g, err := w1.Release(ctx, ledger.Release{Ended: []ledger.Held{{ID: holder.ID, Kind: kind, Key: `"h"`}}}, guess(kind))
		require.NoError(t, err)
		require.Equal(t, []int64{waiting[keys-1].ID}, g.LocalOrder,
			"the slot goes to the first key that can take it, past the keys the round read first")
	})
}

// TestARoundPastAllItReadsStillGives: with more keys waiting than a round
// ever reads (maxTurnKeys, 256), a release's round that needs keys past its
// first read reads 256 and gives within them, as a round always did: here
// the one key of the 256 that can take a slot (the others each held up by
// an older job fetched elsewhere) gets it, although the round has room
// left that only a key past the 256 might take.
func TestARoundPastAllItReadsStillGives(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const kind, keys = "test.turnkeys.all", 258
	pool, w1 := newLedger(t, "w1")
	w2 := ledger.New(ledger.Config{Pool: pool, WorkerID: "w2"})
	setLimits(t, w1, kind, "max_concurrency = 2, partition_fields = '{key}', key_max = 1")
	guess := map[string]ledger.Limits{kind: {Kind: kind, Max: 2, KeyMax: 1, Fields: []string{"key"}}}
	holder := running(t, pool, kind, `{"key": "h"}`, "w1", 1, time.Now().Add(-time.Second))
	require.Equal(t, ledger.Slot, decideOne(t, w1, holder, guess).Action)
	other := running(t, pool, kind, `{"key": "o"}`, "w1", 1, time.Now().Add(-time.Second))
	require.Equal(t, ledger.Slot, decideOne(t, w1, other, guess).Action)
	var ready ledger.Job
	var olders []ledger.Fetched
	for i := range keys {
		args := fmt.Sprintf(`{"key": "k%03d"}`, i)
		if i != 254 { // k254 is the 255th key in the round's order
			older := running(t, pool, kind, args, "w2", 1, time.Now())
			olders = append(olders, ledger.Fetched{ID: older.ID, Kind: kind, Key: fmt.Sprintf(`"k%03d"`, i)})
		}
		j := running(t, pool, kind, args, "w1", 1, time.Now())
		require.Equal(t, ledger.Wait, decideOne(t, w1, j, guess).Action, "the limit is full: it waits")
		if i == 254 {
			ready = j
		}
	}
	// Marked last, together: a fetch mark holds a key for 2 s, and the
	// set-up of 258 keys can take longer than that (it did in CI, and the
	// first keys' marks had lapsed by the release).
	require.NoError(t, w2.MarkFetched(ctx, pool, olders))
	g, err := w1.Release(ctx, ledger.Release{Ended: []ledger.Held{{ID: holder.ID, Kind: kind, Key: `"h"`},
		{ID: other.ID, Kind: kind, Key: `"o"`}}}, guess)
	require.NoError(t, err)
	require.Equal(t, []int64{ready.ID}, g.LocalOrder, "the key that can take a slot among the 256 read got none")
}
