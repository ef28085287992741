package limiter

import (
	"slices"
	"sort"
	"sync"

	"github.com/sluice-dev/sluice/db"
)

// seenLimits remembers each kind's limits as this worker's last line or
// release transaction read them under the kind's lock: what the next
// transaction of the kind will most likely read too. A transaction uses
// them only to send a read it expects to make ahead of time, with the
// statement before it (db.Pipeline.Prefetch); the read is used only when
// the transaction, having read the limits under the lock, asks for
// exactly the same statement, else it is dropped. So a stale memory costs
// a round trip, never a wrong decision.
type seenLimits struct {
	mu    sync.Mutex
	kinds map[string]kindCounts
}

// set remembers c, the limits of kind read under its lock.
func (s *seenLimits) set(kind string, c *kindCounts) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kinds == nil {
		s.kinds = map[string]kindCounts{}
	}
	s.kinds[kind] = *c
}

// get returns the limits of kind last read (ok false: none).
func (s *seenLimits) get(kind string) (kindCounts, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.kinds[kind]
	return c, ok
}

// prefetchReleaseFront sends, with the release of batch (p, the slots it
// frees), the read of the fronts its grant round will most likely make:
// under per-key concurrency limits alone (no per-kind limit, no rate), a
// release of one kind's slots, none forgotten or handed over, reads the
// fronts of the keys whose slots it freed (LineFront), which it can tell
// from the jobs' args. Two round trips instead of three under P10.
func (l *Limiter) prefetchReleaseFront(q *db.Queries, batch []*releaseRequest, p db.ReleaseJobsParams, handed bool) {
	if len(p.Kinds) != 1 || len(p.ForgetIds) > 0 || handed {
		return
	}
	c, ok := l.seen.get(p.Kinds[0])
	if !ok || !c.independentKeys() || c.keyMax <= 0 || c.rateMax > 0 {
		return
	}
	var keys []string
	for _, r := range batch {
		if r.job == nil {
			return // a recheck: its round reads every key
		}
		key, ok := partitionKey(r.job.EncodedArgs, c.fields)
		if !ok {
			return
		}
		if !slices.Contains(keys, key) {
			keys = append(keys, key)
		}
	}
	sort.Strings(keys) // ReleaseJobs' freed_keys, in byte order
	named, _ := splitKeys(keys)
	if len(named) == 0 {
		return
	}
	perKind, perKeyAhead := lookahead(&c)
	q.PrefetchLineFront(db.LineFrontParams{Kind: p.Kinds[0], Keys: named, KeyMax: c.keyMax,
		PerKey: frontDepth(&c, maxGrants, perKind, perKeyAhead)})
}

// prefetchKeyLines sends, with the reading of batch's records, the read of
// the lines of the jobs' keys that the decision will most likely make
// (KeyLines): for a batch of one kind with a partition, whose keys its
// jobs' args tell. Two round trips instead of three for a decision under
// a per-key limit.
func (l *Limiter) prefetchKeyLines(q *db.Queries, batch []*admitRequest, kinds []string) {
	if len(kinds) != 1 {
		return
	}
	c, ok := l.seen.get(kinds[0])
	if !ok || c.fields == nil || c.unlimited() {
		return
	}
	reqs := slices.Clone(batch)
	sort.Slice(reqs, func(i, j int) bool { return reqs[i].job.ID < reqs[j].job.ID })
	var keys []string
	for _, r := range reqs {
		key, ok := partitionKey(r.job.EncodedArgs, c.fields)
		if !ok {
			return
		}
		if !slices.Contains(keys, key) {
			keys = append(keys, key)
		}
	}
	named, _ := splitKeys(keys)
	if len(named) == 0 {
		return
	}
	q.PrefetchKeyLines(db.KeyLinesParams{Kind: kinds[0], Keys: named, PeriodMs: c.ratePeriod.Milliseconds()})
}
