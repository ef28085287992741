package ledger

import (
	"context"
	"fmt"
	"slices"
	"sort"

	"github.com/sluice-dev/sluice/db"
)

// Held is a job whose slot (or place) a release gives up: its kind and
// key ("": none), as its decision found them.
type Held struct {
	ID   int64
	Kind string
	Key  string
}

// HandOver is a slot handed over in memory: the slot of From, which ended,
// is now To's, a job of its kind that waited in this worker.
type HandOver struct {
	From, To Held
}

// Release is what a release transaction frees and grants.
type Release struct {
	// Ended are the jobs of this worker that ended holding a slot.
	Ended []Held
	// Forgotten are the jobs that gave up waiting (their context ended, or
	// they were decided not to run): they leave the line, and a grant they
	// got goes back.
	Forgotten []Held
	// Handed are the slots handed over in memory since the last release.
	Handed []HandOver
	// Rounds are the kinds whose whole line a grant round reads, although
	// nothing of them ended (a rate window freeing a start, a change of
	// limits, the safety net).
	Rounds []string
	// KeyRounds are kinds whose grant rounds read the lines of the keys
	// given (kind → keys; "": a kind without a partition), although
	// nothing of them ended (a recheck after
	// a decision or a parking, jobs waiting long in the line): under
	// per-key limits alone, where each key's room is its own, those lines
	// only, under the kind's lock shared and the keys' rows; under any
	// other limits the kind's whole line, as Rounds.
	KeyRounds map[string][]string
}

// kinds is every kind of the release.
func (r Release) kinds() []string {
	var out []string
	add := func(k string) {
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	for _, h := range r.Ended {
		add(h.Kind)
	}
	for _, h := range r.Forgotten {
		add(h.Kind)
	}
	for _, h := range r.Handed {
		add(h.From.Kind)
	}
	for _, k := range r.Rounds {
		add(k)
	}
	for k := range r.KeyRounds {
		add(k)
	}
	sort.Strings(out)
	return out
}

// Release frees the slots of jobs that ended and of jobs that gave up
// waiting, writes the slots handed over in memory, and gives the room that
// freed to the front of each kind's line (a grant round), in one
// transaction. Under per-key limits alone a release takes its keys' rows
// and the kind's lock shared, and its round reads only the keys whose
// slots freed and those of KeyRounds; a kind of Rounds is locked
// exclusive and its round reads every key. guess is the worker's copy of
// the kinds' limits.
func (l *Ledger) Release(ctx context.Context, r Release, guess map[string]Limits) (*Granted, error) {
	var out *Granted
	err := withRelock(guess, func(guess map[string]Limits) error {
		kinds := r.kinds()
		keys := map[string][]string{}
		for _, hs := range [][]Held{r.Ended, r.Forgotten} {
			for _, h := range hs {
				if h.Key != "" {
					keys[h.Kind] = append(keys[h.Kind], h.Key)
				}
			}
		}
		for _, h := range r.Handed {
			if h.From.Key != "" {
				keys[h.From.Kind] = append(keys[h.From.Kind], h.From.Key)
			}
		}
		for kind, ks := range r.KeyRounds {
			for _, key := range ks {
				if key != "" {
					keys[kind] = append(keys[kind], key)
				}
			}
		}
		locks := locksFor(kinds, guess, keys)
		for i := range locks {
			if slices.Contains(r.Rounds, locks[i].kind) {
				locks[i].shared, locks[i].keys = false, nil
			}
		}
		return l.run(ctx, locks, func(tx *Tx) error {
			var err error
			out, err = tx.release(locks, guess, kinds, keys, r)
			return err
		})
	})
	if err != nil {
		return nil, fmt.Errorf("release: %w", err)
	}
	return out, nil
}

// release frees what r frees, reads the kinds' lines, and runs their
// grant rounds.
func (tx *Tx) release(locks []lock, guess map[string]Limits, kinds []string, keys map[string][]string, r Release) (*Granted, error) {
	p := db.LedgerReleaseParams{JobIds: []int64{}, ForgetIds: []int64{}, FromIds: []int64{}, ToIds: []int64{}, WorkerID: tx.l.worker}
	for _, h := range r.Ended {
		p.JobIds = append(p.JobIds, h.ID)
	}
	for _, h := range r.Forgotten {
		p.ForgetIds = append(p.ForgetIds, h.ID)
	}
	turnover := map[string]bool{}
	for _, h := range r.Handed {
		p.FromIds, p.ToIds = append(p.FromIds, h.From.ID), append(p.ToIds, h.To.ID)
		turnover[h.From.Kind] = true
	}
	freed := map[string]int{}
	for _, h := range r.Ended {
		turnover[h.Kind] = true
		freed[h.Kind]++
	}
	for _, h := range r.Forgotten {
		freed[h.Kind]++
	}
	if len(p.JobIds)+len(p.ForgetIds)+len(p.FromIds) > 0 {
		if err := tx.q.LedgerRelease(tx.ctx, p); err != nil {
			return nil, fmt.Errorf("free slots: %w", err)
		}
	}

	return tx.grantKinds(locks, guess, kinds, keys, r.Rounds, turnover, turnKeys(kinds, guess, r.Rounds, freed))
}

// grantKinds reads the lines of kinds (under per-key limits alone, the
// keys named; every key of a kind of full) and runs their grant rounds.
// Of the keys of a kind that need one view it reads the first turnKeys in
// the round's order; a round that needs more of them reads its kind again,
// up to maxTurnKeys.
func (tx *Tx) grantKinds(locks []lock, guess map[string]Limits, kinds []string, keys map[string][]string, full []string,
	turnover map[string]bool, turnKeys int32) (*Granted, error) {
	st, err := tx.grantState(kinds, keys, full, turnKeys)
	if err != nil {
		return nil, err
	}
	limits := make(map[string]Limits, len(kinds))
	for _, kind := range kinds {
		limits[kind] = Limits{Kind: kind}
	}
	for _, k := range st.Kinds {
		limits[k.Kind] = k.limits()
	}
	if err := checkLocks(locks, guess, limits); err != nil {
		return nil, err
	}
	out := newGranted()
	for _, kind := range kinds {
		out.Limits[kind] = limits[kind]
	}
	for _, k := range st.Kinds {
		done, err := tx.grant(k, turnover[k.Kind], out)
		if err != nil {
			return nil, err
		}
		if done {
			continue
		}
		again, err := tx.grantState([]string{k.Kind}, keys, full, maxTurnKeys)
		if err != nil {
			return nil, err
		}
		if len(again.Kinds) != 1 {
			return nil, fmt.Errorf("read the line of %s again: %d kinds read", k.Kind, len(again.Kinds))
		}
		if _, err := tx.grant(again.Kinds[0], turnover[k.Kind], out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// turnKeys is how many keys in the round's order a release's rounds of
// kinds read first: all (maxTurnKeys) for a round of full, where a kind's
// limits are not known, or where a kind-wide rate alone bounds its round;
// else minTurnKeys and twice the slots the release frees (freed, per
// kind), at most twice the kind's per-kind limit: what a round mostly
// gives out within. A kind whose round reads no keys in that order
// (without a partition, or under per-key limits alone) or gives nothing (a
// breaker) asks for none.
func turnKeys(kinds []string, guess map[string]Limits, full []string, freed map[string]int) int32 {
	if len(full) > 0 {
		return maxTurnKeys
	}
	n := int32(minTurnKeys)
	for _, kind := range kinds {
		c, ok := guess[kind]
		switch {
		case !ok:
			return maxTurnKeys
		case !c.Keyed() || c.Max < 0 || (c.Max == 0 && !c.KindRate()):
			continue
		case c.Max == 0:
			return maxTurnKeys
		}
		n = max(n, minTurnKeys+2*min(int32(freed[kind]), c.Max))
	}
	return min(n, maxTurnKeys)
}

// grantState reads what the grant rounds of kinds read (LedgerGrantState).
func (tx *Tx) grantState(kinds []string, keys map[string][]string, full []string, turnKeys int32) (*grantState, error) {
	g := db.LedgerGrantStateParams{Depth: maxFront, Kinds: kinds, KeyKinds: []string{}, Keys: []string{}, TurnKeys: turnKeys,
		FullKinds: full}
	if g.FullKinds == nil {
		g.FullKinds = []string{}
	}
	for _, kind := range kinds {
		for _, key := range keys[kind] {
			g.KeyKinds, g.Keys = append(g.KeyKinds, kind), append(g.Keys, key)
		}
	}
	raw, err := tx.q.LedgerGrantState(tx.ctx, g)
	if err != nil {
		return nil, fmt.Errorf("read the lines: %w", err)
	}
	st, err := decode[grantState](raw, "the lines")
	if err != nil {
		return nil, err
	}
	for i := range st.Kinds {
		// A read of maxTurnKeys is as whole as a round gets: its round
		// gives within the keys read, and the next round starts with those
		// it did not serve.
		st.Kinds[i].Short = st.Kinds[i].TurnMore && turnKeys < maxTurnKeys
	}
	return st, nil
}
