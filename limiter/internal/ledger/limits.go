package ledger

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/db"
)

// Limits is a kind's limit row: its limits, and the counts kept on it.
type Limits struct {
	// Kind is the job kind.
	Kind string
	// Present is false for a kind without a limit row.
	Present bool
	// Max is the per-kind limit: > 0 at most Max at once, 0 none, < 0 a
	// circuit breaker.
	Max int32
	// Admitted is the kind's slots taken (slot rows and leased slots),
	// kept while it has a per-kind limit.
	Admitted int32
	// HasParked: jobs of the line wait for the kind itself (not only for
	// their keys): new jobs of the kind queue behind them.
	HasParked bool
	// Fields partition the kind by args fields (nil: none).
	Fields []string
	// KeyMax is the per-key limit (0: none).
	KeyMax int32
	// RateMax starts per RatePeriod (0: no rate), per key when RatePerKey.
	RateMax    int32
	RatePeriod time.Duration
	RatePerKey bool
}

// SameSettings reports whether l and o set the same limits (their counts
// aside).
func (l Limits) SameSettings(o Limits) bool {
	return l.Kind == o.Kind && l.Present == o.Present && l.Max == o.Max && slices.Equal(l.Fields, o.Fields) &&
		l.KeyMax == o.KeyMax && l.RateMax == o.RateMax && l.RatePeriod == o.RatePeriod && l.RatePerKey == o.RatePerKey
}

// Regime is how a kind's limits are kept.
type Regime int

const (
	// Unlimited: no limit (no row, or none set): jobs run without the
	// ledger.
	Unlimited Regime = iota
	// Leased: a per-kind limit alone. Workers lease the kind's slots in
	// bulk and hand them from job to job in memory; the line holds only
	// the jobs that wait for the kind when no leased slot serves them.
	Leased
	// Keys: per-key limits alone (a per-key limit, a per-key rate, or
	// both): each key's room is its own. Its transactions lock the kind
	// shared and their keys' rows, so the keys do not share a lock.
	Keys
	// KindWide: a limit of the whole kind (a per-kind limit or a kind-wide
	// rate) beside a partition, or a kind-wide rate alone: every decision
	// needs one view of the kind (its lock, exclusive).
	KindWide
	// Breaker: a circuit breaker. Every job parks; nothing resumes.
	Breaker
)

// Regime is the regime of l.
func (l Limits) Regime() Regime {
	switch {
	case !l.Present || (l.Max == 0 && l.Fields == nil && l.RateMax == 0):
		return Unlimited
	case l.Max < 0:
		return Breaker
	case l.Fields == nil && l.RateMax == 0:
		return Leased
	case l.Max == 0 && (l.RateMax == 0 || l.RatePerKey):
		return Keys
	}
	return KindWide
}

// WaitCap is how many jobs of a key (of the kind, without a partition)
// may wait in the workers: four times the slots or starts they wait for,
// or a WaitSlotShare of the River slots of the worker that fetches the job
// (slots; 0: not known), whichever is more, within [minWaitCap,
// maxWaitCap]. A job fetched behind that many of its line parks at once.
func (l Limits) WaitCap(slots int) int {
	unit := l.Max
	switch {
	case l.Keyed() && l.KeyMax > 0:
		unit = l.KeyMax
	case l.Keyed() && l.KeyRate():
		unit = l.RateMax
	case unit <= 0:
		unit = l.RateMax
	}
	return min(max(4*int(unit), slots/WaitSlotShare, minWaitCap), maxWaitCap)
}

// Keyed reports whether l partitions the kind.
func (l Limits) Keyed() bool { return l.Fields != nil }

// Slotted reports whether a job admitted under l takes a slot (a per-kind
// or per-key concurrency limit).
func (l Limits) Slotted() bool { return l.Max > 0 || l.KeyMax > 0 }

// KindRate reports whether l has a rate of the whole kind.
func (l Limits) KindRate() bool { return l.RateMax > 0 && !l.RatePerKey }

// KeyRate reports whether l has a rate per key.
func (l Limits) KeyRate() bool { return l.RateMax > 0 && l.RatePerKey }

// Equal reports whether l and o are the same limits (counts aside).
func (l Limits) Equal(o Limits) bool {
	return l.Present == o.Present && l.Max == o.Max && slices.Equal(l.Fields, o.Fields) && l.KeyMax == o.KeyMax &&
		l.RateMax == o.RateMax && l.RatePeriod == o.RatePeriod && l.RatePerKey == o.RatePerKey
}

// Tag is a short fingerprint of l's settings (counts aside): two Limits
// with the same settings (Equal) have the same tag. A grant note carries
// the tag of the limits its round read, so that the worker can tell a
// grant made under the limits it holds (GrantNote.Limits).
func (l Limits) Tag() string {
	h := fnv.New64a()
	fmt.Fprintf(h, "%t|%d|%s|%d|%d|%d|%t", l.Present, l.Max, strings.Join(l.Fields, "\x00"), l.KeyMax, l.RateMax,
		l.RatePeriod, l.RatePerKey)
	return strconv.FormatUint(h.Sum64(), 36)
}

// kindFree is how many more jobs of the kind may hold a slot, as its
// per-kind limit counts them (-1: no per-kind limit).
func (l Limits) kindFree() int32 {
	switch {
	case l.Max < 0:
		return 0
	case l.Max == 0:
		return -1
	}
	return max(l.Max-l.Admitted, 0)
}

// limitsOf is the Limits of a row of LedgerLimits.
func limitsOf(r *db.LedgerLimitsRow) Limits {
	out := Limits{Kind: r.Kind, Present: true, Max: r.MaxConcurrency, HasParked: r.HasParked, Fields: r.PartitionFields,
		RatePerKey: r.RatePerKey}
	if r.Admitted != nil {
		out.Admitted = *r.Admitted
	}
	if r.KeyMax != nil {
		out.KeyMax = *r.KeyMax
	}
	if r.RateMax != nil && r.RatePeriodMs > 0 {
		out.RateMax, out.RatePeriod = *r.RateMax, time.Duration(r.RatePeriodMs)*time.Millisecond
	}
	return out
}

// readLimits reads the limit rows of kinds (a kind without one has
// Limits{Kind: kind}).
func (tx *Tx) readLimits(kinds []string) (map[string]Limits, error) {
	rows, err := tx.q.LedgerLimits(tx.ctx, kinds)
	if err != nil {
		return nil, fmt.Errorf("read the limits: %w", err)
	}
	out := make(map[string]Limits, len(kinds))
	for _, kind := range kinds {
		out[kind] = Limits{Kind: kind}
	}
	for _, r := range rows {
		out[r.Kind] = limitsOf(r)
	}
	return out, nil
}

// ReadLimits reads every kind's limits, outside any lock (a worker's copy:
// it decides which way a job goes, and the locks the ledger takes; every
// decision reads them again under the locks).
func (l *Ledger) ReadLimits(ctx context.Context) (map[string]Limits, error) {
	rows, err := db.New(l.pool).LedgerAllLimits(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the limits: %w", err)
	}
	out := make(map[string]Limits, len(rows))
	for _, r := range rows {
		out[r.Kind] = limitsOf((*db.LedgerLimitsRow)(r))
	}
	return out, nil
}
