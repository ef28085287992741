package ledger

import (
	"context"
	"fmt"
	"sort"

	"github.com/sluice-dev/sluice/db"
)

// keyRef names a key of a kind.
type keyRef struct{ kind, key string }

// flag is a count's boolean, changed or not.
type flag int8

const (
	unchanged flag = -1
	off       flag = 0
	on        flag = 1
)

// counts are the changes a transaction makes to the counts of its kinds
// (admitted, has_parked) and keys (slots, waiting, turn), written together
// before it commits (LedgerCount).
type counts struct {
	kinds map[string]*kindDelta
	keys  map[keyRef]*keyDelta
}

type kindDelta struct {
	admitted  int32
	hasParked flag
}

type keyDelta struct {
	slots   int32
	waiting flag
	served  bool
	// touched: the transaction locked the key's row (made it if missing):
	// saved, so that a row left idle (no slot, nothing waiting) goes.
	touched bool
}

func (c *counts) kind(kind string) *kindDelta {
	if c.kinds == nil {
		c.kinds = map[string]*kindDelta{}
	}
	d := c.kinds[kind]
	if d == nil {
		d = &kindDelta{hasParked: unchanged}
		c.kinds[kind] = d
	}
	return d
}

func (c *counts) key(kind, key string) *keyDelta {
	if c.keys == nil {
		c.keys = map[keyRef]*keyDelta{}
	}
	r := keyRef{kind, key}
	d := c.keys[r]
	if d == nil {
		d = &keyDelta{waiting: unchanged}
		c.keys[r] = d
	}
	return d
}

// addSlots counts n slots taken (< 0: freed) by jobs of kind's key ("":
// none): the kind's admitted (where it is kept) and the key's slots.
func (c *counts) addSlots(kind, key string, n int32) {
	c.kind(kind).admitted += n
	if key != "" {
		c.key(kind, key).slots += n
	}
}

// setWaiting records whether jobs of kind's key wait in the line.
func (c *counts) setWaiting(kind, key string, waiting bool) {
	if key == "" {
		return
	}
	c.key(kind, key).waiting = flagOf(waiting)
}

// touch records that the transaction locked kind's key's row.
func (c *counts) touch(kind, key string) { c.key(kind, key).touched = true }

// served moves kind's key to the end of the round (it was granted now).
func (c *counts) served(kind, key string) {
	if key != "" {
		c.key(kind, key).served = true
	}
}

// setHasParked records whether jobs of kind wait for the kind itself.
func (c *counts) setHasParked(kind string, has bool) { c.kind(kind).hasParked = flagOf(has) }

func flagOf(b bool) flag {
	if b {
		return on
	}
	return off
}

// save writes the counts (nothing when none changed).
func (c *counts) save(ctx context.Context, q *db.Queries) error {
	var p db.LedgerCountParams
	for kind, d := range c.kinds {
		if d.admitted != 0 || d.hasParked != unchanged {
			p.Kinds = append(p.Kinds, kind)
			p.Admitted = append(p.Admitted, d.admitted)
			p.HasParked = append(p.HasParked, int32(d.hasParked))
		}
	}
	refs := make([]keyRef, 0, len(c.keys))
	for r, d := range c.keys {
		if d.slots != 0 || d.waiting != unchanged || d.served || d.touched {
			refs = append(refs, r)
		}
	}
	// In key order, as the keys' rows are locked.
	sort.Slice(refs, func(i, j int) bool {
		if refs[i].kind != refs[j].kind {
			return refs[i].kind < refs[j].kind
		}
		return refs[i].key < refs[j].key
	})
	for _, r := range refs {
		d := c.keys[r]
		p.KeyKinds, p.Keys = append(p.KeyKinds, r.kind), append(p.Keys, r.key)
		p.KeySlots, p.KeyWaiting, p.KeyServed = append(p.KeySlots, d.slots), append(p.KeyWaiting, int32(d.waiting)), append(p.KeyServed, d.served)
	}
	if len(p.Kinds) == 0 && len(p.Keys) == 0 {
		return nil
	}
	if p.Kinds == nil {
		p.Kinds, p.Admitted, p.HasParked = []string{}, []int32{}, []int32{}
	}
	if p.Keys == nil {
		p.KeyKinds, p.Keys, p.KeySlots, p.KeyWaiting, p.KeyServed = []string{}, []string{}, []int32{}, []int32{}, []bool{}
	}
	if err := q.LedgerCount(ctx, p); err != nil {
		return fmt.Errorf("write the counts: %w", err)
	}
	c.kinds, c.keys = nil, nil
	return nil
}
