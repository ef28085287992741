package limiter

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/limiter/internal/ledger"
	"github.com/sluice-dev/sluice/limiter/internal/local"
)

// LimitChannel is the channel a change of a kind's limits notifies (a
// trigger on concurrency_limits, sluice_limits_notify; the payload is the
// kind): every worker LISTENs on it and re-reads its copy of the limits at
// once.
const LimitChannel = "sluice_limits"

// listeningTTL is how long a worker trusts its copy of the limits while
// its listener is connected (a change expires it at once: this is only a
// safety net).
const listeningTTL = 30 * time.Second

// limitsCopy is the worker's copy of every kind's limits, read without a
// lock: it decides which way a job goes (the leased path, the line, no
// limit at all) and which locks the ledger takes; every decision reads
// the limits again under those locks. The limits listener expires it the
// moment a kind's limits change (or its connection is made again: a
// change may have been missed); while the listener is not connected it is
// re-read at most every LimitCacheTTL. A job never goes by an expired copy:
// one that finds it so waits for the re-read.
type limitsCopy struct {
	l         *Limiter
	refreshMu sync.Mutex
	cur       atomic.Pointer[limitsSnapshot]
	// gen counts the changes heard: a copy read while one came in is
	// stored expired.
	gen       atomic.Uint64
	listening atomic.Bool

	// changedMu guards the counts at which each kind's limits last changed
	// (as heard), and every kind's may have (a change that named no kind,
	// the listener connecting again): changedSince.
	changedMu   sync.Mutex
	kindChanged map[string]uint64
	allChanged  uint64
}

// limitsSnapshot is a copy of the limits, never changed once stored.
type limitsSnapshot struct {
	kinds  map[string]ledger.Limits
	loaded time.Time // zero: expired
	// gen is the count of changes heard that the copy holds every one of
	// (read after the last of them was heard); 0: not known (a last copy
	// kept when a read failed).
	gen uint64
}

func newLimitsCopy(l *Limiter) *limitsCopy { return &limitsCopy{l: l} }

// of returns kind's limits (Present false: no limit row).
func (c *limitsCopy) of(ctx context.Context, kind string) (ledger.Limits, error) {
	s, err := c.snapshot(ctx)
	if err != nil {
		return ledger.Limits{}, err
	}
	return s.of(kind), nil
}

// held returns the copy as it is, without reading it again: nil when it
// is expired (or was never read, or is a last copy kept when a read
// failed).
func (c *limitsCopy) held() *limitsSnapshot {
	if s := c.cur.Load(); c.fresh(s, c.ttl()) && s.gen != 0 {
		return s
	}
	return nil
}

// ttl is how long a copy is trusted: listeningTTL while the listener is
// connected, else LimitCacheTTL.
func (c *limitsCopy) ttl() time.Duration {
	if c.listening.Load() {
		return listeningTTL
	}
	return LimitCacheTTL
}

// fresh reports whether s was read less than ttl ago, not expired, and
// holds every change heard (a last copy kept when a read failed, gen 0,
// goes by its age alone). The count is what makes a copy stale: expire
// also swaps the stored copy for an expired one, but a read that began
// before the change can store its copy after that swap.
func (c *limitsCopy) fresh(s *limitsSnapshot, ttl time.Duration) bool {
	return s != nil && !s.loaded.IsZero() && time.Since(s.loaded) <= ttl &&
		(s.gen == 0 || s.gen == c.gen.Load())
}

// of returns kind's limits in s (Present false: no limit row).
func (s *limitsSnapshot) of(kind string) ledger.Limits {
	if lim, ok := s.kinds[kind]; ok {
		return lim
	}
	return ledger.Limits{Kind: kind}
}

// heldAs returns the count of changes heard up to which the copy holds
// kind's limits with tag (ledger.Limits.Tag), 0 when it holds other ones
// (or cannot tell): a grant made under limits with that tag fits every
// change heard up to it.
func (c *limitsCopy) heldAs(ctx context.Context, kind, tag string) uint64 {
	if tag == "" {
		return 0
	}
	s, err := c.snapshot(ctx)
	if err != nil {
		return 0
	}
	if s.of(kind).Tag() != tag {
		return 0
	}
	return s.gen
}

// guess returns the limits of kinds as the copy has them, for the ledger's
// locks (a read that fails gives none: the ledger locks every kind
// exclusively, which always fits).
func (c *limitsCopy) guess(ctx context.Context, kinds []string) map[string]ledger.Limits {
	out := make(map[string]ledger.Limits, len(kinds))
	s, err := c.snapshot(ctx)
	if err != nil {
		return out
	}
	for _, k := range kinds {
		if lim, ok := s.kinds[k]; ok {
			out[k] = lim
		}
	}
	return out
}

// snapshot returns a copy not expired, re-reading it when needed.
func (c *limitsCopy) snapshot(ctx context.Context) (*limitsSnapshot, error) {
	ttl := c.ttl()
	if s := c.cur.Load(); c.fresh(s, ttl) {
		return s, nil
	}
	return c.refresh(ctx, ttl)
}

// refresh re-reads the limits (one reader at a time; the others wait for
// it). Only when the read fails is the last copy used, with a warning.
func (c *limitsCopy) refresh(ctx context.Context, ttl time.Duration) (*limitsSnapshot, error) {
	c.refreshMu.Lock()
	defer c.refreshMu.Unlock()
	if s := c.cur.Load(); c.fresh(s, ttl) {
		return s, nil // refreshed meanwhile
	}
	var s *limitsSnapshot
	// A change heard while the copy is read may not be in it: read again
	// (a few times at most; the copy is stored expired if changes keep
	// coming).
	for range 3 {
		gen := c.gen.Load()
		kinds, err := c.l.ledger.ReadLimits(ctx)
		if err != nil {
			if old := c.cur.Load(); old != nil {
				c.l.logger.Warn("concurrency limits not refreshed; using the last copy", "error", err)
				s = &limitsSnapshot{kinds: old.kinds, loaded: time.Now()}
				c.cur.Store(s)
				return s, nil
			}
			return nil, fmt.Errorf("read concurrency limits: %w", err)
		}
		s = &limitsSnapshot{kinds: kinds, loaded: time.Now(), gen: gen}
		if c.gen.Load() == gen {
			break
		}
		s.loaded = time.Time{}
	}
	if old := c.cur.Load(); old != nil {
		c.l.rekey(old.kinds, s.kinds)
	}
	c.cur.Store(s)
	return s, nil
}

// rekey keys the jobs of every kind's local queue again whose partition
// (its limits' fields) is not as it was in was: before the copy that shows
// it is stored, so that no job is fetched under the new partition while a
// job of the kind here keeps a key of the old one (local.Queue.Rekey).
func (l *Limiter) rekey(was, now map[string]ledger.Limits) {
	l.queues.each(func(q *local.Queue) {
		fields := now[q.Kind()].Fields
		if slices.Equal(was[q.Kind()].Fields, fields) {
			return
		}
		q.Rekey(func(args []byte) string {
			key, _ := ledger.PartitionKey(args, fields)
			return key
		})
	})
}

// expire marks the copy stale, kind's limits having changed ("": any
// kind's may have): the next job re-reads it (a read under way when the
// change came is stale too).
func (c *limitsCopy) expire(kind string) {
	c.changedMu.Lock()
	// The kind's count is set before gen shows the change: whoever reads
	// gen at the new count finds it (changedSince).
	n := c.gen.Load() + 1
	if kind == "" {
		c.allChanged = n
	} else {
		if c.kindChanged == nil {
			c.kindChanged = map[string]uint64{}
		}
		c.kindChanged[kind] = n
	}
	c.gen.Store(n)
	c.changedMu.Unlock()
	if s := c.cur.Load(); s != nil {
		c.cur.CompareAndSwap(s, &limitsSnapshot{kinds: s.kinds})
	}
}

// changedSince reports whether kind's limits changed after the worker had
// heard n changes (Job.Stamp), as far as it heard: a change of another
// kind leaves a decision of kind as it was.
func (c *limitsCopy) changedSince(kind string, n uint64) bool {
	c.changedMu.Lock()
	defer c.changedMu.Unlock()
	return max(c.allChanged, c.kindChanged[kind]) > n
}

// connected is told that the limiter's listener LISTENs (again): a change
// may have been missed meanwhile.
func (c *limitsCopy) connected() {
	c.expire("")
	c.listening.Store(true)
}

// disconnected is told that the listener lost its connection: the copy is
// re-read every LimitCacheTTL until it is back.
func (c *limitsCopy) disconnected() { c.listening.Store(false) }
