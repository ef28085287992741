package limiter

import (
	"slices"
	"sync"

	"github.com/riverqueue/river/rivertype"

	"github.com/sluice-dev/sluice/limiter/internal/ledger"
)

// strays are the fetched jobs of the client's kinds that went to River's
// executors undecided (their kind had no limit at the fetch, or the fetch's
// decision failed), until their middleware runs. A limit set meanwhile is
// found by the first of them to reach the middleware: it decides itself
// and every older stray of its kind together, in job-id order, as their
// fetch would have, rather than each alone in the order Go schedules their
// goroutines (a younger job of the fetch could take the kind's next start
// while an older one waits).
type strays struct {
	mu   sync.Mutex
	byID map[int64]*stray
}

// stray is one job of strays.
type stray struct {
	job *rivertype.JobRow
	// decided is closed once a batch that took it is decided (nil: not
	// taken yet); gone (a decision that took it out of its queue, if any)
	// and err are that batch's outcome for it.
	decided chan struct{}
	gone    *ledger.Decision
	err     error
}

// add records jobs as strays.
func (s *strays) add(jobs []*rivertype.JobRow) {
	if len(jobs) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byID == nil {
		s.byID = map[int64]*stray{}
	}
	for _, job := range jobs {
		s.byID[job.ID] = &stray{job: job}
	}
}

// claim is called by job's middleware, job undecided. A job taken by
// another's batch returns its stray and no batch: the caller waits for
// st.decided. A job that is no stray, or that take says not to decide
// (its kind has no limit), returns neither (and is a stray no more). Else
// it takes job and the older strays of its kind not taken yet, and returns
// them in job-id order, for the caller to decide and pass to done.
func (s *strays) claim(job *rivertype.JobRow, take bool) (st *stray, batch []*rivertype.JobRow) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st = s.byID[job.ID]
	switch {
	case st == nil:
		return nil, nil
	case st.decided != nil:
		return st, nil // its batch's outcome is on st once decided
	case !take:
		delete(s.byID, job.ID)
		return nil, nil
	}
	decided := make(chan struct{})
	for id, o := range s.byID {
		if o.job.Kind == job.Kind && id <= job.ID && o.decided == nil {
			o.decided = decided
			batch = append(batch, o.job)
		}
	}
	slices.SortFunc(batch, func(a, b *rivertype.JobRow) int { return int(a.ID - b.ID) })
	return nil, batch
}

// waitTaken waits, when job id is a stray that another's batch took, for
// that batch's decision, and returns its outcome (taken false: not a stray
// taken; its queue, not its stray, says where it stands). Its middleware
// asks first: the batch puts it in its kind's queue, Deciding, before it
// is decided.
func (s *strays) waitTaken(id int64) (taken bool, gone *ledger.Decision, err error) {
	st := s.taken(id)
	if st == nil {
		return false, nil, nil
	}
	<-st.decided
	return true, st.gone, st.err
}

// taken is job id's stray if a batch took it (nil otherwise).
func (s *strays) taken(id int64) *stray {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.byID[id]; st != nil && st.decided != nil {
		return st
	}
	return nil
}

// done records the outcome of a batch that claim returned (gone: the
// decisions that took jobs out of their queues) and lets the strays in it
// that wait go on.
func (s *strays) done(batch []*rivertype.JobRow, gone map[int64]ledger.Decision, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var decided chan struct{}
	for _, job := range batch {
		st := s.byID[job.ID]
		if st == nil {
			continue
		}
		if d, ok := gone[job.ID]; ok {
			st.gone = &d
		}
		st.err, decided = err, st.decided
		delete(s.byID, job.ID)
	}
	if decided != nil {
		close(decided)
	}
}

// clear forgets every stray not taken yet (the client stopped: River runs
// no more of them).
func (s *strays) clear() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, st := range s.byID {
		if st.decided == nil {
			delete(s.byID, id)
		}
	}
}
